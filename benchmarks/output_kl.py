"""What δ bounds, measured by the product: the first position of a prompt on the real pair.

    python benchmarks/output_kl.py [-o benchmarks/results/output-kl]

p and q are the draft's and the verifier's warped distributions at the first generated position
of "Once upon a time, in a land far away, there lived a" (one decode of the prompt each). For each
warp and δ, the native helper's exact emitted law (``NativeSampler.emitted_law``) gives the
acceptance of the drafted token and KL(P || q) of the token the position emits, with the paper's
per-target budget and with the output budget. Writes table.json and table.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from cactus_gguf import Engine, LoadOptions
from cactus_gguf.llama.hw import machine_facts
from cactus_gguf.registry import load_registry, resolve_model
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams

PROMPT = "Once upon a time, in a land far away, there lived a"
WARPS = {"T = 1, no truncation": SamplingParams(1.0, 0, 1.0, 0.0),
         "T = 0.6, top-k 20, top-p 0.95 (paper)": SamplingParams(0.6, 20, 0.95, 0.0)}
DELTAS = (0.1, 0.5, 1.0)
SOLVER = "taylor"  # the default: what users get


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", default="benchmarks/results/output-kl")
    args = ap.parse_args()
    pair = load_registry().default_pair
    with Engine(resolve_model(pair.verifier), resolve_model(pair.draft),
                LoadOptions(n_ctx=512)) as eng:
        tokens = eng.tokenize(PROMPT)
        lq = eng.verifier.decode(tokens, n_logits=1)[0].copy()
        lp = eng.draft.decode(tokens, n_logits=1)[0].copy()
        V = eng.verifier.n_vocab
    rows = []
    for wname, sp in WARPS.items():
        for delta in DELTAS:
            row = {"warps": wname, "delta": delta}
            for budget in ("target", "output"):
                s = NativeSampler(V, sp, AcceptanceParams("cactus", delta, SOLVER, budget=budget), 0)
                p, q = s.warp(lp[:V]), s.warp(lq)
                law = s.emitted_law(p, q)
                row[budget] = {"acceptance": law.acceptance, "output_kl": law.kl,
                               "delta_used": law.delta}
            sps = NativeSampler(V, sp, AcceptanceParams("sps"), 0).emitted_law(p, q)
            row["sps_acceptance"] = sps.acceptance
            row["support"] = [int((p > 0).sum()), int((q > 0).sum())]
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps({"prompt": PROMPT, "pair": pair.name,
                                                "solver": SOLVER, "machine": machine_facts(),
                                                "rows": rows}, indent=1) + "\n", encoding="utf-8")
    md = ["| warps | δ | acceptance, target budget | KL(P‖q) emitted, target budget | "
          "acceptance, output budget | KL(P‖q) emitted, output budget (δ' used) | SpS acceptance |",
          "|---|---|---|---|---|---|---|"]
    for r in rows:
        t, o = r["target"], r["output"]
        md.append(f"| {r['warps']} | {r['delta']:g} | {t['acceptance']:.3f} | **{t['output_kl']:.3f}** "
                  f"| {o['acceptance']:.3f} | {o['output_kl']:.3f} (δ'={o['delta_used']:.3g}) | "
                  f"{r['sps_acceptance']:.3f} |")
    (out / "table.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
