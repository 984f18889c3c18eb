"""``cactus-gguf run``: one generation, streamed to stdout, summary on stderr (or ``--json``)."""
from __future__ import annotations

import json
import logging

import click

from . import fail, main, report_error
from .params import given, schema_options


def summary(result, request) -> str:
    """The one-line summary on stderr."""
    s = result.stats
    parts = [f"{s.n_tokens} tokens in {s.decode_seconds:.2f} s ({s.tokens_per_second:.2f} tok/s)",
             f"prompt {s.n_prompt_tokens} tokens in {s.prefill_seconds:.2f} s"]
    if request.method == "none":
        parts.append("method none (verifier alone)")
    else:
        rule = f"method {request.method}"
        if request.method == "cactus":
            rule += f" delta={request.delta:g} solver={request.solver}"
        parts.append(f"{rule} k={request.k}" + (" drafter ngram" if request.drafter == "ngram" else ""))
        parts.append(f"accepted {s.mean_accepted_length:.2f}/step, acceptance {s.acceptance_rate:.1%}, "
                     f"{s.tokens_per_verifier_call:.2f} tokens/verifier call")
        parts.append(f"draft {s.draft_seconds:.2f} s, verify {s.verify_seconds:.2f} s")
    stop = result.stop_reason + (f" ({result.message})" if result.message else "")
    parts.append(f"stop: {stop}")
    parts.append(f"seed {result.seed}")
    return "cactus-gguf: " + " | ".join(parts)


def models_from_arguments(values: dict, verifier, draft) -> None:
    """Positional models fill the slots -m / -md left open, in order (llama.cpp users write -m)."""
    extra = [m for m in (verifier, draft) if m is not None]
    for slot in ("model", "model_draft"):
        if values.get(slot) is None and extra:
            values[slot] = extra.pop(0)
    if extra:
        fail(f"too many model arguments ({extra[0]!r} is left over): give VERIFIER and DRAFT once, "
             "as arguments or with -m / -md")


@main.command(context_settings={"show_default": True})
@click.argument("verifier", required=False)
@click.argument("draft", required=False)
@schema_options("run")
@click.pass_context
def run(ctx: click.Context, verifier, draft, **_options) -> None:
    """Generate text with speculative decoding: VERIFIER checks what DRAFT proposes.

    VERIFIER and DRAFT are GGUF paths or models.yaml names; with neither, the default pair is
    used (fetched on first use).
    """
    from .. import api
    from ..errors import CactusError

    values = given(ctx)
    models_from_arguments(values, verifier, draft)
    if values.get("verbose"):
        logging.basicConfig(level=logging.DEBUG, format="%(message)s")
    try:
        plan = api.plan_run(values)  # validates everything before any model loads
    except (CactusError, OSError) as e:
        report_error(e)

    printed = False

    def emit(piece: str) -> None:
        nonlocal printed
        printed = True
        click.echo(piece, nl=False)

    as_json = bool(values.get("json"))
    try:
        result = api.execute_run(plan, on_text=None if as_json else emit)
    except KeyboardInterrupt:
        if printed:
            click.echo()
        click.echo("cactus-gguf: interrupted", err=True)
        raise SystemExit(130)
    except (CactusError, ValueError, RuntimeError, OSError) as e:
        if printed:
            click.echo()
        report_error(e)
    if as_json:
        click.echo(json.dumps(api.result_json(result, plan), ensure_ascii=False))
    else:
        click.echo()
        click.echo(summary(result, plan.request), err=True)
