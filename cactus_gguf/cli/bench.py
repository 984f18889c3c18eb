"""``cactus-gguf bench``: every configuration side by side on the same prompts and seeds."""
from __future__ import annotations

import json
from pathlib import Path

import click

from .group import exit_interrupted, model_command, models_from_arguments, report_error
from .params import given


@model_command("bench", grid=True)
def bench_command(ctx: click.Context, verifier, draft, **_options) -> None:
    """Benchmark every configuration side by side on the same prompts and seeds.

    Runs none (verifier alone), sps, cactus at each delta, typical and the ngram drafter, at each
    k, interleaved per prompt; prints a table and writes OUTPUT/bench.json (every number),
    OUTPUT/bench.md (the table) and OUTPUT/bench.png (acceptance length and tokens/s against delta).
    """
    from .. import bench
    from ..errors import CactusError

    values = given(ctx)
    models_from_arguments(values, verifier, draft)
    resume = ctx.params.get("resume")
    output = Path(resume if resume is not None else ctx.params["output"])
    progress = not ctx.params["no_progress"]
    if ctx.params["kernels"]:
        from ..options import check_value

        try:
            check_value("repeats", ctx.params["repeats"])
        except CactusError as e:
            report_error(e)
        result = bench.kernel_benchmark(repeats=ctx.params["repeats"], progress=progress)
        for line in bench.format_kernel_table(result):
            click.echo(line)
        output.mkdir(parents=True, exist_ok=True)
        (output / "kernels.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        click.echo(f"wrote {output / 'kernels.json'}", err=True)
        return
    try:
        plan = bench.plan_bench(values)
    except (CactusError, OSError) as e:
        report_error(e)
    try:
        report = bench.run_bench(plan, progress=progress,
                                 log=lambda m: click.echo(f"cactus-gguf: {m}", err=True),
                                 output=output, resume=resume is not None)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the journal holds every finished run
        exit_interrupted(f"; `--resume {output}` (same options) continues the run")
    except (CactusError, ValueError, RuntimeError, OSError) as e:
        report_error(e)
    for line in bench.format_table(report):
        click.echo(line)
    written = bench.write_report(report, output, plot=not ctx.params["no_plot"])
    click.echo(f"wrote {written['json']}, {written['md']}"
               + (f" and {written['png']}" if written["png"] else ""), err=True)
    if written["note"]:
        click.echo(f"cactus-gguf: {written['note']}", err=True)
