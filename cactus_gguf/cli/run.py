"""``cactus-gguf run``: one generation, streamed to stdout, summary on stderr (or ``--json``)."""
from __future__ import annotations

import click

from ..errors import CactusError
from ..options import CONSTRAINTS
from ..options.rule import rule_words
from ..stats.table import fmt
from .group import (configure_logging, exit_interrupted, interrupt_pending, model_command,
                    models_from_arguments, report_error)
from .params import given


def summary(result, request) -> str:
    """The one-line summary on stderr: the statistics table's ``summary`` fields
    (stats/table.py), each in its number format."""
    s = result.stats

    def f(name: str) -> str:
        return fmt(s, name)

    # the answer first (what the user waited for), then the per-token figures
    calls = f"{f('n_steps')} verifier calls" + (f", {f('n_draft_forwards')} draft forwards"
                                                if request.speculates else "")
    parts = [f"answer {f('answer_seconds')} s end to end ({calls})",
             f"{f('n_tokens')} tokens in {f('decode_seconds')} s ({f('tokens_per_second')} tok/s)",
             f"prompt {f('n_prompt_tokens')} tokens in {f('prefill_seconds')} s"]
    if not request.speculates:
        parts.append("method none (verifier alone)")
    else:
        rule = rule_words(request)  # the acceptance rule and each of its settings (the table's)
        k = (f"k=auto (<= {request.k_max}, {f('mean_drafted_length')} drafted/step)"
             if request.k == "auto" else f"k={request.k}")
        drafted = f" drafter {request.drafter}" if request.drafter != "model" else ""
        if request.draft_temp is not None and request.draft_temperature is not None:
            drafted += f" draft-temp {request.draft_temp:g}"  # the draft's own, not --temp
        parts.append(f"{rule} {k}{drafted}")
        if s.draft_vocab not in (None, "same"):
            # a ceiling on what drafts could have had accepted: nothing to say when none ran
            cover = (f", the verifier's mass on the shared tokens {f('vocab_coverage')}"
                     if s.vocab_coverage is not None and s.n_drafted else "")
            parts.append(f"draft vocabulary: {f('draft_vocab')}{cover}")
        if request.k == "auto" and s.n_drafted == 0 and s.draft_stopped_at is None:
            parts.append("drafted nothing (no draft length paid for itself here; -k N forces one)")
        else:
            parts.append(f"accepted {f('mean_accepted_length')}/step, acceptance "
                         f"{f('acceptance_rate')}, {f('tokens_per_verifier_call')} "
                         "tokens/verifier call")
        parts.append(f"output KL {f('output_kl_mean')}/token (max {f('output_kl_max')}, "
                     f"sum {f('output_kl_sum')}) nats, target KL {f('kl_mean')}")
        parts.append(f"draft {f('draft_seconds')} s, verify {f('verify_seconds')} s, host "
                     f"{f('host_ms_per_step')} ms/step")
        if s.draft_stopped_at is not None:
            parts.append(f"drafting stopped at token {f('draft_stopped_at')} "
                         f"({f('draft_stop_reason')}): the verifier alone after it")
    constraint = next((n for n in CONSTRAINTS if getattr(request, n) not in (None, False)), None)
    if constraint is not None:
        parts.append(f"{constraint.replace('_', ' ')}: {f('grammar_ms_per_token')} ms/token masks")
    if result.placement:
        parts.append(", ".join(f"{role}: {p.summary()}" for role, p in result.placement.items()))
    stop = result.stop_reason + (f" ({result.message})" if result.message else "")
    parts.append(f"stop: {stop}")
    parts.append(f"seed {result.seed}")
    return "cactus-gguf: " + " | ".join(parts)


@model_command("run")
def run(ctx: click.Context, verifier, draft, **_options) -> None:
    """Generate text with speculative decoding: VERIFIER checks what DRAFT proposes.

    VERIFIER and DRAFT are GGUF paths or models.yaml names; with neither, the default pair is
    used (fetched on first use).
    """
    from ..app import plan as planner

    values = given(ctx)
    models_from_arguments(values, verifier, draft)
    configure_logging(values.get("verbose", 0))
    try:
        plan = planner.plan_run(values)  # validates everything before any model loads
        out = _Output()
    except (CactusError, OSError) as e:
        report_error(e)

    as_json = bool(values.get("json"))
    try:
        result = planner.execute_run(plan, on_text=None if as_json else out.write,
                                     interrupted=interrupt_pending)
    except KeyboardInterrupt as e:
        partial = getattr(e, "result", None)
        if as_json:  # what was generated is not lost (nothing, if the models were still loading)
            out.json(planner.result_json(partial or planner.nothing_generated(plan), plan))
        elif out.printed:
            out.write("\n")
        exit_interrupted()
    except OutputError as e:
        out.silence()
        report_error(e)
    except (CactusError, ValueError, RuntimeError, OSError) as e:
        partial = getattr(e, "result", None)  # an RPC server lost mid-generation
        if as_json and partial is not None:
            out.json(planner.result_json(partial, plan))
        elif out.printed:
            out.write("\n")
        report_error(e)
    try:
        if as_json:
            out.json(planner.result_json(result, plan))
            return
        out.write("\n")
    except OutputError as e:
        out.silence()
        report_error(e)
    click.echo(summary(result, plan.request), err=True)


class OutputError(CactusError):
    """Standard output cannot take the text (a full disk, a closed or broken stream, an encoding
    that cannot represent it)."""


class _Output:
    """Standard output with one-line errors: text as it streams, or one JSON object."""

    def __init__(self) -> None:
        import os
        import sys

        import io

        self.printed = False
        self.stream = sys.stdout
        closed = self.stream is None  # `run ... >&-`: Python then has no sys.stdout at all
        if not closed:
            try:
                fd = self.stream.fileno()
            except (AttributeError, io.UnsupportedOperation):
                fd = None  # an in-memory stream (a test runner, an IDE): writable, no descriptor
            except ValueError:
                closed = True  # a closed file object
            if fd is not None:
                try:
                    os.fstat(fd)
                except OSError:
                    closed = True
        if closed:  # nothing could be written, so fail now (as cat does), not exit 0
            raise OutputError("standard output is closed: nothing could be written; redirect it "
                              "to a file (or /dev/null)")

    def write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except UnicodeEncodeError as e:
            try:  # what the encoding can carry still goes out
                self.stream.write(text[:e.start])
                self.stream.flush()
            except (UnicodeEncodeError, OSError):
                pass
            raise OutputError(
                f"the output encoding {self.stream.encoding} cannot represent the text "
                f"({e.object[e.start:e.end]!r}): set PYTHONIOENCODING=utf-8, or use --json "
                "(ASCII-escaped where needed)") from None
        except OSError as e:
            raise OutputError(f"cannot write to standard output: {e.strerror or e}") from None
        self.printed = True

    def json(self, obj: dict) -> None:
        """One JSON object; escaped to ASCII when the output encoding cannot carry the text."""
        import codecs
        import json

        enc = getattr(self.stream, "encoding", None) or "utf-8"
        utf = codecs.lookup(enc).name.startswith("utf")
        self.write(json.dumps(obj, ensure_ascii=not utf) + "\n")

    def silence(self) -> None:
        """After a failed write: point fd 1 at /dev/null, so Python's exit-time flush of what is
        still buffered cannot fail a second time (a traceback after ours)."""
        import os

        try:
            self.stream = open(os.devnull, "w")
            os.dup2(self.stream.fileno(), 1)
        except OSError:
            pass
