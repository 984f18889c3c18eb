"""No slowdown of same-vocabulary pairs: this checkout against an earlier commit, interleaved.

    git worktree add /tmp/old COMMIT && (cd /tmp/old && python setup.py build_ext --inplace)
    python benchmarks/same_pair_ab.py /tmp/old [--prompts 6] [-n 128] [-k 4] [-o DIR]

For each HumanEval prompt, ``cactus-gguf run --json`` of the default pair (its settings, fixed
seed) once from each tree, the order alternating per prompt, never two at once; compares decode
tok/s and seconds per answer (median of per-prompt ratios new / old) and whether the tokens are
the same. Writes same-pair-ab.json / .md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def run(tree: Path, prompt: str, n: int, k: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    r = subprocess.run([sys.executable, "-m", "cactus_gguf", "run", "-p", prompt, "-n", str(n),
                        "--seed", "7", "--json", "-t", "2", "-k", k], capture_output=True,
                       text=True, env=env, cwd=tree, check=True)
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old", type=Path)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-k", default="4", help="draft length; 'auto' may choose not to draft at all")
    ap.add_argument("-o", "--out", default="benchmarks/results/foreign-drafts")
    args = ap.parse_args()
    from cactus_gguf.bench.prompts import load_humaneval
    from cactus_gguf.llama.hw import machine_facts

    trees = {"old": args.old.resolve(), "new": HERE}
    rows = []
    for i, p in enumerate(load_humaneval(args.prompts)):
        order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
        got = {side: run(trees[side], p.problem["prompt"], args.n, args.k) for side in order}
        row = {"prompt": p.id, **{f"{side}_{key}": got[side][key] for side in got
                                  for key in ("tokens_per_second", "answer_seconds", "n_steps",
                                              "n_tokens", "n_drafted")},
               "same_tokens": got["old"]["tokens"] == got["new"]["tokens"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    tps = statistics.median(r["new_tokens_per_second"] / r["old_tokens_per_second"] for r in rows)
    sec = statistics.median(r["new_answer_seconds"] / r["old_answer_seconds"] for r in rows)
    facts = machine_facts()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "same-pair-ab.json").write_text(json.dumps({"machine": facts, "rows": rows}, indent=1))
    text = (f"# Same-vocabulary pair: this tree vs {args.old}\n\nMachine: {facts['cpu']} "
            f"({', '.join(facts['simd'])}). Default pair, its settings with -k {args.k}, seed 7, "
            f"-n {args.n}, -t 2, alternating order; drafted tokens per answer (new): "
            f"{statistics.mean(r['new_n_drafted'] for r in rows):.0f}.\n\n"
            f"- median new/old decode tok/s: {tps:.3f}\n- median new/old seconds per answer: "
            f"{sec:.3f}\n- same tokens: {sum(r['same_tokens'] for r in rows)}/{len(rows)}\n")
    (out / "same-pair-ab.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
