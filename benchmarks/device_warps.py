"""Warps on the device (``--backend-sampling on``) against full rows: same tokens, host ms per step.

    python benchmarks/device_warps.py [--limit 6] [-n 64] [-k 4 16] [-t THREADS]
                                      [-o benchmarks/results/device-warps]

On the registry's default pair with its sampling (T 0.6, top-k 20, top-p 0.95), the first HumanEval
problems as the bench renders them (chat, the answer opened with the stub), SpS and the default
Cactus rule at each fixed k, one seed per problem: each answer is generated with full rows
(``backend_sampling`` off) and with the device's top-k candidates (on), alternating which goes
first. Reported per answer: whether the tokens are the same, the verifier calls, and the host time
of a verification step (``accept_seconds`` / steps: reading the rows and the acceptance test, from
the end of the verifier's decode to the step's verdict: ``host_ms_per_step`` of the run stats).
Loads the pair once.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from cactus_gguf import Engine, LoadOptions
from cactus_gguf.bench.prompts import load_humaneval, render_prompt
from cactus_gguf.llama.hw import build_facts, machine_facts
from cactus_gguf.options import Request
from cactus_gguf.registry import load_registry, resolve_model

METHODS = ("sps", "cactus")
MODES = ("off", "on")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=6)
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-k", type=int, nargs="+", default=[4, 16])
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-o", "--output", default="benchmarks/results/device-warps")
    args = ap.parse_args()
    pair = load_registry().default_pair
    ver, dft = resolve_model(pair.verifier), resolve_model(pair.draft)
    settings = {k: v for k, v in pair.settings.items() if k != "k"}
    defaults = Request(**{**settings, "n_predict": args.n_predict})
    rows = []
    with Engine(ver, dft, LoadOptions(n_ctx=2048, n_threads=args.threads),
                defaults=defaults) as engine:
        for (i, problem), k in itertools.product(enumerate(load_humaneval(args.limit)), args.k):
            text = render_prompt(problem, True, engine.format_chat)
            for method in METHODS:
                got = {}
                for mode in (MODES if (i + METHODS.index(method)) % 2 == 0 else MODES[::-1]):
                    r = engine.generate(text, method=method, seed=i, k=k, backend_sampling=mode,
                                        stop=["```"], cache_prompt=False)
                    st = r.stats
                    got[mode] = {"tokens": r.tokens, "steps": st.n_steps,
                                 "host_ms_per_step": st.host_ms_per_step}
                row = {"problem": problem.id, "k": k, "method": method,
                       "same_tokens": got["on"]["tokens"] == got["off"]["tokens"],
                       "n_tokens": len(got["off"]["tokens"]),
                       "steps": {m: got[m]["steps"] for m in MODES},
                       "host_ms_per_step": {m: got[m]["host_ms_per_step"] for m in MODES}}
                print(json.dumps(row), flush=True)
                rows.append(row)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    med = {str(k): {m: statistics.median(r["host_ms_per_step"][m] for r in rows if r["k"] == k)
                    for m in MODES} for k in args.k}
    report = {"pair": pair.name, "settings": {**settings, "k": args.k,
                                              "n_predict": args.n_predict,
                                              "n_threads": args.threads},
              "machine": machine_facts(), "build": build_facts(), "rows": rows,
              "same_tokens": sum(r["same_tokens"] for r in rows),
              "median_host_ms_per_step": med}
    (out / "device-warps.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    md = ["| problem | k | method | tokens | same tokens | steps off / on | host ms per step "
          "off | on |", "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['problem']} | {r['k']} | {r['method']} | {r['n_tokens']} | "
           f"{'yes' if r['same_tokens'] else '**NO**'} | "
           f"{r['steps']['off']} / {r['steps']['on']} | "
           f"{r['host_ms_per_step']['off']:.2f} | {r['host_ms_per_step']['on']:.2f} |"
           for r in rows]
    md += ["", f"Same tokens in {report['same_tokens']} of {len(rows)} answers. Median host ms "
               "per verification step, full rows -> device top-k: "
               + "; ".join(f"k {k}: {m['off']:.2f} -> {m['on']:.2f}" for k, m in med.items())
               + f". Default pair {pair.name}, its sampling, -n {args.n_predict}, threads "
               f"{args.threads or 'default'}. Machine: {report['machine'].get('cpu', '?')} "
               f"({', '.join(report['machine'].get('simd', [])) or 'no AVX'})."]
    (out / "device-warps.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
