"""What `-k auto`'s policy itself costs per step, against what a step costs.

Drives CostAwareDraftLength through the calls the engine and the drafters make in one step
(plan, then its too_unsure and more per drafted token, keep, observe) with the forward costs this
machine measured (benchmarks/results/auto-default/humaneval/bench.json, or the numbers below),
in two regimes: drafting pays (a GPU-like cost table: every step drafts up to k_max) and drafting
never pays (this machine: every step is verifier-only). No model is loaded.

    python benchmarks/policy_overhead.py [--steps N] [--k-max K] [--out FILE.json]

Prints microseconds of policy time per step and that as a share of one verifier decode.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from cactus_gguf.sampling import StepResult
from cactus_gguf.speculative.draft import Draft
from cactus_gguf.speculative.policy import CostAwareDraftLength, ForwardCosts
from cactus_gguf.stats import StepOutcome

# seconds: this machine (2-core EPYC, the default pair, benchmarks/results/auto-humaneval) and a
# GPU-like table where a batch is nearly free
EPYC = {1: 0.064, 5: 0.274, 9: 0.45, 17: 0.806}
GPU = {1: 0.020, 2: 0.0202, 5: 0.021, 9: 0.022, 17: 0.024}


def run(costs: dict, draft: float, k_max: int, steps: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    pol = CostAwareDraftLength(k_max, ForwardCosts(costs, draft))
    row = np.zeros(20, dtype=np.float32)
    n_drafted_total = 0
    t_policy = 0.0
    for _ in range(steps):
        t0 = time.perf_counter()
        plan = pol.plan(10_000)
        k = plan.k
        t_policy += time.perf_counter() - t0
        ps = np.zeros(k, np.float32)
        n = 0
        for _ in range(k):
            p = float(rng.uniform(0.3, 1.0))
            row[0], row[1] = p, 1.0 - p
            t0 = time.perf_counter()
            unsure = plan.too_unsure(row)
            if not unsure:
                ps[n] = row[0]
            go_on = not unsure and plan.more(ps[:n + 1])
            t_policy += time.perf_counter() - t0
            n += not unsure
            if not go_on:
                break
        proposal = (Draft(np.zeros(n, np.int32), np.zeros((n, len(row)), np.float32),
                          ("model",) * n, ps[:n]) if n else Draft.empty())
        t0 = time.perf_counter()
        kept = pol.keep(proposal) if n else 0
        t_policy += time.perf_counter() - t0
        accepted = int(sum(rng.random(kept) < 0.8)) if kept else 0
        outcome = StepOutcome(False, n, kept, StepResult(accepted, 0, 0, 0.0, 0.0), accepted,
                              draft * n, pol.costs.verify(kept + 1), 0.0)
        t0 = time.perf_counter()
        pol.observe(proposal, outcome)
        t_policy += time.perf_counter() - t0
        n_drafted_total += kept
    us = 1e6 * t_policy / steps
    return {"steps": steps, "k_max": k_max, "policy_us_per_step": us,
            "verified_drafts_per_step": n_drafted_total / steps,
            "share_of_one_verifier_decode": us * 1e-6 / costs[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--k-max", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = {"machine": platform.processor() or platform.machine(),
           "python": platform.python_version(),
           "never_pays (this machine's costs)": run(EPYC, 0.030, a.k_max, a.steps),
           "pays (GPU-like costs)": run(GPU, 0.002, a.k_max, a.steps)}
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
