"""The per-answer table of one prompt set, pooled from several finished benchmarks.

    python benchmarks/per_answer_table.py benchmarks/results/quality \
        benchmarks/results/per-answer-humaneval [DIR ...] [--configs none,sps,...]

Each DIR holds a ``bench.json`` written by ``cactus-gguf bench`` on the same prompts with the same
seeds (a resumed or later run adds configurations). Runs are keyed by (prompt, configuration
label); a later DIR's run replaces an earlier one's. ``DIR=TAG`` appends `` TAG`` to that
directory's labels, for runs whose difference is a request option the label does not show
(e.g. ``per-answer-topgap-1-humaneval="g=1"``). Every figure is over the prompts that *every*
listed configuration answered (paired), so a configuration run on fewer prompts narrows the table
rather than being compared on other prompts.

Figures, per configuration: tokens / answer, verifier calls / answer and that as a ratio of SpS's
(ratio of the means over the same prompts), the share of answers with a test / example section
(bench.scoring.has_test_section), pass@1 and, against ``none`` on the same prompts, passes gained
/ lost with the exact McNemar p (bench.summary.pass_at_1_statistics). Timing-independent only:
the runs may come from sittings on different machines. Loads no model.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from cactus_gguf.bench.scoring import has_test_section
from cactus_gguf.bench.summary import pass_at_1_statistics


def load_runs(dirs: list[str]) -> dict[str, dict[str, dict]]:
    """{configuration label: {prompt name: run}} over ``dirs`` (``DIR`` or ``DIR=TAG``; later
    directories win)."""
    out: dict[str, dict[str, dict]] = {}
    for spec in dirs:
        d, _, tag = spec.partition("=")
        report = json.loads((Path(d) / "bench.json").read_text(encoding="utf-8"))
        labels = {c["id"]: c["label"] + (f" {tag}" if tag else "") for c in report["configs"]}
        for run in report["runs"]:
            out.setdefault(labels[run["config"]], {})[run["prompt"]] = run
    return out


def table(runs: dict[str, dict[str, dict]], configs: list[str]) -> tuple[list[dict], int]:
    """One row per configuration over the prompts all of ``configs`` answered; and their count."""
    missing = [c for c in configs if c not in runs]
    if missing:
        raise SystemExit(f"no runs of {missing[0]!r}; have: {', '.join(sorted(runs))}")
    prompts = sorted(set.intersection(*(set(runs[c]) for c in configs)))
    sps_calls = (np.mean([runs["sps"][p]["n_steps"] for p in prompts])
                 if "sps" in runs and set(prompts) <= set(runs["sps"]) else None)
    rows = []
    for c in configs:
        rs = [runs[c][p] for p in prompts]
        calls = float(np.mean([r["n_steps"] for r in rs]))
        scored = [r for r in rs if r.get("passed") is not None]
        base = [runs["none"][p] for p in prompts] if "none" in runs and c != "none" else None
        stats = pass_at_1_statistics(scored, base) if scored else {}
        rows.append({
            "config": c,
            "tokens": float(np.mean([r["n_tokens"] for r in rs])),
            "calls": calls if c != "draft alone" else None,
            "x_sps": calls / sps_calls if sps_calls and c not in ("sps", "none", "draft alone")
            else None,
            "test_sections": float(np.mean([has_test_section(r.get("text", "")) for r in rs])),
            "pass_at_1": (float(np.mean([bool(r["passed"]) for r in scored])) if scored else None),
            "paired_vs_none": stats.get("paired_vs_none"),
        })
    return rows, len(prompts)


def markdown(rows: list[dict], n: int) -> str:
    lines = [f"{n} prompts (paired)", "",
             "| config | tokens / answer | verifier calls / answer | × SpS | test sections | pass@1 "
             "| vs none: gained / lost, McNemar p |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        pv = r["paired_vs_none"]
        lines.append("| " + " | ".join([
            r["config"], f"{r['tokens']:.1f}",
            "–" if r["calls"] is None else f"{r['calls']:.1f}",
            "–" if r["x_sps"] is None else f"{r['x_sps']:.2f}",
            f"{100 * r['test_sections']:.0f}%",
            "–" if r["pass_at_1"] is None else f"{100 * r['pass_at_1']:.1f}%",
            "–" if not pv else f"+{pv['gained']} / −{pv['lost']}, p = {pv['mcnemar_p']:.2f}",
        ]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="bench output directories (bench.json), each optionally DIR=TAG")
    ap.add_argument("--configs", help="comma-separated configuration labels, in table order "
                    "(default: every label found)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    runs = load_runs(args.dirs)
    configs = args.configs.split(",") if args.configs else sorted(runs)
    rows, n = table(runs, configs)
    print(json.dumps({"n_prompts": n, "rows": rows}, indent=1) if args.json else markdown(rows, n))


if __name__ == "__main__":
    main()
