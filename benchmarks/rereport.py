"""Summarise finished benchmarks again with the current summary code: the runs stay as recorded.

    python benchmarks/rereport.py benchmarks/results/quality [DIR ...]

Each DIR holds a ``bench.json`` written by ``cactus-gguf bench``. Its runs (per prompt and
configuration: tokens, verifier calls, timings, text) are kept; the summary, bench.md and the
plots are made anew, so a report written before a figure existed gets it from the runs it
already has (the per-answer table: seconds, verifier calls and tokens per answer, with ratios
against none and sps on the same prompts). A figure the runs never recorded stays empty (draft
forwards of runs older than their counter). Loads no model; timings are those of the run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from cactus_gguf.bench.report import write_report
from cactus_gguf.bench.summary import summarize


def rereport(directory: str) -> Path:
    d = Path(directory)
    report = json.loads((d / "bench.json").read_text(encoding="utf-8"))
    report["summary"] = summarize(report["configs"], report["runs"],
                                  report["forward_ms"]["before"])
    report.setdefault("auto_probe", None)
    return write_report(report, d)["md"]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for arg in sys.argv[1:]:
        print(rereport(arg))
