"""Command-line interface: parses options, calls the Python API, prints. No logic of its own."""
from __future__ import annotations

import errno
import os
import sys

import click


class _OneLineErrors(click.Group):
    """click's group, except that option errors (`-k abc`, an unknown flag) are reported like every
    other input error: one line on stderr (see _fail), exit code 1; Ctrl-C exits with 130."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:  # embedded (e.g. click's test runner asked for raw exceptions)
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.ClickException as e:
            if isinstance(e, getattr(click.exceptions, "NoArgsIsHelpError", ())):
                e.show()  # bare `cactus-gguf`: the help text
                raise SystemExit(e.exit_code) from None
            _fail(" ".join(e.format_message().split()))
        except click.exceptions.Abort:  # Ctrl-C outside generation (generation handles its own)
            click.echo("cactus-gguf: interrupted", err=True)
            raise SystemExit(130) from None
        except OSError as e:
            if e.errno != errno.EPIPE:
                raise
            # stdout closed early (`| head`): stop quietly, and keep Python's exit-time flush quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None
        raise SystemExit(rv if isinstance(rv, int) else 0)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cactus-gguf")
def main() -> None:
    """Cactus constrained-acceptance speculative decoding for GGUF models."""


# `run` is added below by the decoding work; `models` / `pull` by the registry work.


def _fail(message: str, code: int = 1) -> None:
    """One line on stderr, then exit: the only way the CLI reports an error."""
    click.echo(f"cactus-gguf: error: {message}", err=True)
    raise SystemExit(code)


def _summary(result, config) -> str:
    s = result.stats
    parts = [f"{s.n_tokens} tokens in {s.decode_seconds:.2f} s ({s.tokens_per_second:.2f} tok/s)",
             f"prompt {s.n_prompt_tokens} tokens in {s.prefill_seconds:.2f} s"]
    if config.acceptance is None:
        parts.append("method none (verifier alone)")
    else:
        a = config.acceptance
        rule = f"method {a.method}"
        if a.method == "cactus":
            rule += f" delta={a.delta:g} solver={a.solver}"
        parts.append(f"{rule} k={config.k}" + (" drafter ngram" if config.drafter == "ngram" else ""))
        parts.append(f"accepted {s.mean_accepted_length:.2f}/step, acceptance {s.acceptance_rate:.1%}, "
                     f"{s.tokens_per_verifier_call:.2f} tokens/verifier call")
        parts.append(f"draft {s.draft_seconds:.2f} s, verify {s.verify_seconds:.2f} s")
    stop = result.stop_reason + (f" ({result.message})" if result.message else "")
    parts.append(f"stop: {stop}")
    parts.append(f"seed {result.seed}")
    return "cactus-gguf: " + " | ".join(parts)


@main.command(context_settings={"show_default": True})
@click.argument("verifier", required=False)
@click.argument("draft", required=False)
@click.option("-m", "--model", "model_opt", metavar="VERIFIER",
              help="Verifier GGUF path or registry name (same as the first argument).")
@click.option("-md", "--model-draft", "draft_opt", metavar="DRAFT",
              help="Draft GGUF path or registry name (same as the second argument).")
@click.option("--pair", metavar="NAME", help="A draft/verifier pair from models.yaml "
              "(default: the registry's default pair when no model is given).")
@click.option("-p", "--prompt", help="Prompt text.")
@click.option("-f", "--file", "prompt_file", type=click.Path(dir_okay=False),
              help="Read the prompt from a UTF-8 text file.")
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message in the GGUF chat template.")
@click.option("-n", "--n-predict", type=int, default=128, help="Tokens to generate.")
@click.option("-k", "--draft-max", "k", type=int, default=8, help="Draft length k: tokens proposed per step.")
@click.option("--method", type=click.Choice(["cactus", "sps", "typical", "topk", "greedy", "none"]),
              default="cactus", help="Acceptance rule; none = the verifier alone (baseline).")
@click.option("--delta", type=float, default=1.0, help="Cactus KL budget delta, nats (0 = exactly SpS).")
@click.option("--solver", type=click.Choice(["taylor", "exact"]), default="taylor",
              help="Cactus gamma: the paper's closed form, or the exact binary-KL root.")
@click.option("--typical-epsilon", type=float, default=0.09, help="Typical acceptance epsilon.")
@click.option("--typical-alpha", type=float, default=0.3, help="Typical acceptance alpha.")
@click.option("--accept-top-k", type=int, default=5,
              help="topk acceptance: accept drafts among the verifier's top N tokens.")
@click.option("--drafter", type=click.Choice(["model", "ngram"]), default="model",
              help="Who proposes tokens: the DRAFT model, or n-gram prompt lookup (no draft model).")
@click.option("--draft-min", type=int, default=0, help="Drop drafts shorter than this (verify alone).")
@click.option("--draft-p-min", type=float, default=0.0,
              help="Stop drafting when the draft's top probability falls below this.")
@click.option("--ngram-max", type=int, default=3, help="ngram drafter: longest n-gram looked up.")
@click.option("--ngram-min", type=int, default=1, help="ngram drafter: shortest n-gram looked up.")
@click.option("--temp", type=float, default=0.8, help="Temperature (0 = greedy).")
@click.option("--top-k", type=int, default=40, help="Top-k sampling (0 = off).")
@click.option("--top-p", type=float, default=0.95, help="Top-p sampling (1 = off).")
@click.option("--min-p", type=float, default=0.05, help="Min-p sampling (0 = off).")
@click.option("-s", "--seed", type=int, default=-1, help="RNG seed (-1 = random; reported).")
@click.option("-c", "--ctx-size", "n_ctx", type=int, default=4096, help="Context size of both models, tokens.")
@click.option("-b", "--batch-size", "n_batch", type=int, default=512, help="Max tokens per llama_decode.")
@click.option("-t", "--threads", type=int, default=None, help="CPU threads [default: all usable cores].")
@click.option("-ngl", "--n-gpu-layers", "ngl", type=int, default=-1,
              help="Verifier layers offloaded to the GPU (-1 = all; ignored by CPU builds).")
@click.option("-ngld", "--n-gpu-layers-draft", "ngld", type=int, default=-1,
              help="Draft layers offloaded to the GPU (-1 = all).")
@click.option("-fa", "--flash-attn", type=click.Choice(["auto", "on", "off"]), default="auto",
              help="Flash attention.")
@click.option("--stop", "stops", multiple=True, help="Stop string (repeatable); never printed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text + stats) instead of streaming.")
@click.option("-v", "--verbose", is_flag=True, help="Show llama.cpp's log on stderr.")
@click.pass_context
def run(ctx: click.Context, verifier, draft, model_opt, draft_opt, pair, prompt, prompt_file, chat,
        n_predict, k, method, delta, solver, typical_epsilon, typical_alpha, accept_top_k, drafter,
        draft_min, draft_p_min, ngram_max, ngram_min, temp, top_k, top_p, min_p, seed, n_ctx,
        n_batch, threads, ngl, ngld, flash_attn, stops, as_json, verbose) -> None:
    """Generate text with speculative decoding: VERIFIER checks what DRAFT proposes.

    VERIFIER and DRAFT are GGUF paths or models.yaml names; with neither, the default pair is
    used (fetched on first use).
    """
    import json
    import logging

    from . import api

    if verbose:
        logging.basicConfig(level=logging.DEBUG, format="%(message)s")
    given = {name for name in ctx.params
             if ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT}
    # Positional models fill the slots -m / -md left open, in order (llama.cpp users write -m).
    models = [model_opt, draft_opt]
    extra = [m for m in (verifier, draft) if m is not None]
    for slot in (0, 1):
        if models[slot] is None and extra:
            models[slot] = extra.pop(0)
    if extra:
        _fail(f"too many model arguments ({extra[0]!r} is left over): give VERIFIER and DRAFT once, "
              "as arguments or with -m / -md")
    try:
        request = api.RunRequest(
            verifier=models[0], draft=models[1], pair=pair,
            prompt=prompt, prompt_file=prompt_file, chat=chat, n_predict=n_predict, k=k,
            method=method, delta=delta, solver=solver, typical_epsilon=typical_epsilon,
            typical_alpha=typical_alpha, accept_top_k=accept_top_k, drafter=drafter,
            draft_min=draft_min, draft_p_min=draft_p_min, ngram_max=ngram_max, ngram_min=ngram_min,
            temperature=temp, top_k=top_k, top_p=top_p,
            min_p=min_p, seed=seed, n_ctx=n_ctx, n_batch=n_batch, n_threads=threads,
            n_gpu_layers=ngl, n_gpu_layers_draft=ngld, flash_attn=flash_attn, stop=tuple(stops),
            explicit=frozenset(given))
        plan = api.plan_run(request)  # validates everything before any model loads
    except (ValueError, OSError) as e:
        _fail(str(e))

    printed = False

    def emit(piece: str) -> None:
        nonlocal printed
        printed = True
        click.echo(piece, nl=False)

    try:
        result = api.execute_run(plan, on_text=None if as_json else emit)
    except KeyboardInterrupt:
        if printed:
            click.echo()
        click.echo("cactus-gguf: interrupted", err=True)
        raise SystemExit(130)
    except (ValueError, OSError, RuntimeError) as e:
        if printed:
            click.echo()
        _fail(str(e))
    if as_json:
        click.echo(json.dumps(api.result_json(result, plan), ensure_ascii=False))
    else:
        click.echo()
        click.echo(_summary(result, plan.config), err=True)


def _table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart (the first row is the header)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


@main.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print the registry as one JSON object.")
def models_command(as_json: bool) -> None:
    """List the models and draft/verifier pairs of models.yaml, with their sources."""
    import json

    from . import registry

    try:
        reg = registry.load_registry()
        cached = {name: registry.is_cached(name, registry=reg) for name in reg.models}
    except registry.RegistryError as e:
        raise click.ClickException(str(e))
    if as_json:
        data = reg.to_dict()
        for m in data["models"]:
            m["cached"] = cached[m["name"]]
        click.echo(json.dumps(data, indent=2))
        return
    click.echo(f"Models ({reg.path}; cache {registry.cache_dir()})")
    rows = [["NAME", "ARCH", "QUANT", "SIZE", "LICENSE", "CACHED"]]
    rows += [[m.name, m.architecture, m.quantization, f"{m.size / 1e9:.2f} GB", m.license,
              "yes" if cached[m.name] else "-"] for m in reg.models.values()]
    lines = _table(rows)
    click.echo(lines[0])
    for line, m in zip(lines[1:], reg.models.values()):
        click.echo(line)
        for i, src in enumerate(m.sources, 1):
            shas = [s for s in src.expected_sha256 if s]
            pin = f"sha256 {shas[0][:12]}…" if shas else "sha256 unknown"
            click.echo(f"    {i}. {src.describe()}  {pin}")
        if m.notes:
            click.echo(f"    note: {m.notes}")
    click.echo()
    click.echo("Pairs")
    recommendable = registry.RECOMMENDABLE  # one column each; "-" where a pair sets none
    rows = [["NAME", "VERIFIER", "DRAFT"] + [o.upper() for o in recommendable]]
    rows += [[p.name + (" (default)" if p is reg.default_pair else ""), p.verifier, p.draft]
             + [f"{v:g}" if isinstance(v, float) else str(v)
                for v in (p.settings.get(o, "-") for o in recommendable)]
             for p in reg.pairs.values()]
    for line in _table(rows):
        click.echo(line)


@main.command("pull")
@click.argument("name")
@click.option("--no-progress", is_flag=True, help="Hide the download progress bars.")
def pull_command(name: str, no_progress: bool) -> None:
    """Fetch a model, or both models of a pair, into the cache and check its sha256.

    NAME is a model or pair name from `cactus-gguf models`. A verified cached copy is used
    without any network access.
    """
    from . import registry

    try:
        results = registry.pull(name, progress=not no_progress)
    except (registry.RegistryError, registry.DownloadError) as e:
        raise click.ClickException(str(e))
    for r in results:
        check = "verified" if r.pinned else "not pinned in models.yaml, recorded"
        state = "cached" if r.cached else f"fetched from {r.source.describe()}"
        click.echo(f"{r.model}: {r.path}")
        click.echo(f"    sha256 {r.sha256} ({check}; {state})")


def _number_list(kind):
    """click callback: "0.5,1,2" -> (0.5, 1.0, 2.0) of ``kind``; None stays None."""
    def parse(ctx, param, value):
        if value is None:
            return None
        try:
            return tuple(kind(v) for v in value.split(",") if v.strip())
        except ValueError:
            raise click.BadParameter(f"expected a comma-separated list of {kind.__name__}s, "
                                     f"got {value!r}")
    return parse


@main.command("bench", context_settings={"show_default": True})
@click.argument("verifier", required=False)
@click.argument("draft", required=False)
@click.option("--pair", metavar="NAME", help="A draft/verifier pair from models.yaml "
              "(default: the registry's default pair when no model is given).")
@click.option("--prompts", "prompts_file", type=click.Path(dir_okay=False),
              help='JSONL prompt file, one {"prompt": ..., "id": ...} per line [default: HumanEval].')
@click.option("--limit", type=int, default=None, help="Use only the first N prompts.")
@click.option("--chat/--no-chat", default=None,
              help="Render prompts with the chat template [default: on for HumanEval-style problems].")
@click.option("-n", "--n-predict", type=int, default=128, help="Tokens to generate per prompt.")
@click.option("--configs", callback=_number_list(str), default=None, metavar="LIST",
              help="Configurations: none,sps,cactus,typical,topk,ngram,ngram-cactus "
                   "[default: none,sps,cactus,typical,ngram].")
@click.option("--delta", "deltas", callback=_number_list(float), default="0.5,1,2", metavar="LIST",
              help="Cactus delta grid, nats.")
@click.option("--k", "ks", callback=_number_list(int), default=None, metavar="LIST",
              help="Draft-length grid, e.g. 4,8 [default: the pair's k, else 8].")
@click.option("--solver", type=click.Choice(["taylor", "exact"]), default="taylor", help="Cactus gamma.")
@click.option("--temp", type=float, default=None, help="Temperature [default: the pair's, else 0.6].")
@click.option("--top-k", type=int, default=None, help="Top-k [default: the pair's, else 20].")
@click.option("--top-p", type=float, default=None, help="Top-p [default: the pair's, else 0.95].")
@click.option("--min-p", type=float, default=None, help="Min-p [default: 0].")
@click.option("-s", "--seed", type=int, default=0, help="Seed of the first prompt (prompt i: seed + i).")
@click.option("-c", "--ctx-size", "n_ctx", type=int, default=4096, help="Context size, tokens.")
@click.option("-b", "--batch-size", "n_batch", type=int, default=512, help="Max tokens per llama_decode.")
@click.option("-t", "--threads", type=int, default=None, help="CPU threads [default: all usable cores].")
@click.option("-ngl", "--n-gpu-layers", "ngl", type=int, default=-1, help="Verifier layers on the GPU.")
@click.option("-ngld", "--n-gpu-layers-draft", "ngld", type=int, default=-1, help="Draft layers on the GPU.")
@click.option("-fa", "--flash-attn", type=click.Choice(["auto", "on", "off"]), default="auto",
              help="Flash attention.")
@click.option("--timeout", type=float, default=5.0, help="Seconds allowed per pass@1 test run.")
@click.option("--forward-repeats", type=int, default=10, help="Repeats of each forward-cost probe.")
@click.option("-o", "--output", type=click.Path(file_okay=False), default="bench-out",
              help="Directory for bench.json, bench.md and bench.png.")
@click.option("--no-plot", is_flag=True, help="Do not write bench.png.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@click.option("--kernels", is_flag=True,
              help="Instead: micro-benchmark the native verify step against the NumPy reference.")
@click.option("--repeats", type=int, default=30, help="--kernels: timed repeats per cell.")
def bench_command(verifier, draft, pair, prompts_file, limit, chat, n_predict, configs, deltas, ks,
                  solver, temp, top_k, top_p, min_p, seed, n_ctx, n_batch, threads, ngl, ngld,
                  flash_attn, timeout, forward_repeats, output, no_plot, no_progress, kernels,
                  repeats) -> None:
    """Benchmark every configuration side by side on the same prompts and seeds.

    Runs none (verifier alone), sps, cactus at each delta, typical and the ngram drafter, at each
    k, interleaved per prompt; prints a table and writes OUTPUT/bench.json (every number),
    OUTPUT/bench.md (the table) and OUTPUT/bench.png (acceptance length and tokens/s against delta).
    """
    import json
    from pathlib import Path

    from . import bench

    if kernels:
        result = bench.kernel_benchmark(repeats=repeats, progress=not no_progress)
        for line in bench.format_kernel_table(result):
            click.echo(line)
        out = Path(output)
        out.mkdir(parents=True, exist_ok=True)
        (out / "kernels.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        click.echo(f"wrote {out / 'kernels.json'}", err=True)
        return
    try:
        plan = bench.plan_bench(bench.BenchRequest(
            verifier=verifier, draft=draft, pair=pair, prompts_file=prompts_file, limit=limit,
            chat=chat, n_predict=n_predict, methods=configs, deltas=deltas, ks=ks, solver=solver,
            temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, n_ctx=n_ctx,
            n_batch=n_batch, n_threads=threads, n_gpu_layers=ngl, n_gpu_layers_draft=ngld,
            flash_attn=flash_attn, timeout=timeout, forward_repeats=forward_repeats))
    except (ValueError, OSError) as e:
        _fail(str(e))
    try:
        report = bench.run_bench(plan, progress=not no_progress,
                                 log=lambda m: click.echo(f"cactus-gguf: {m}", err=True))
    except KeyboardInterrupt:
        click.echo("cactus-gguf: interrupted", err=True)
        raise SystemExit(130)
    except (ValueError, OSError, RuntimeError) as e:
        _fail(str(e))
    for line in bench.format_table(report):
        click.echo(line)
    written = bench.write_report(report, output, plot=not no_plot)
    click.echo(f"wrote {written['json']}, {written['md']}"
               + (f" and {written['png']}" if written["png"] else ""), err=True)
    if written["note"]:
        click.echo(f"cactus-gguf: {written['note']}", err=True)
