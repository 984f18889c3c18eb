"""Fill-in-the-middle per completion, as an editor asks: none / sps / cactus / ngram / hybrid.

    python benchmarks/fim.py [--cases benchmarks/prompts/fim.jsonl] [--limit N] [-n 32]
                             [--sampling editor|greedy] [-t THREADS] [-o benchmarks/results/fim]

Each case of the set (cut from this repository's code by prompts/make_fim.py) becomes the prompt
/infill builds (cactus_gguf/prompting/fim.py: llama-server's layout, trimmed to the batch as there), on the
registry's default pair with llama.vscode's sampling (top-k 40, top-p 0.99, no temperature
sampler: T = 1; a fixed seed per case), or greedy (``--sampling greedy``). Before the
configurations run, one untimed request of one token puts the file into both KV caches, as an
editor's earlier completions of the same file (and llama.vscode's warm-up request) do; each
configuration's completion then reuses all of it but the last token, so its time to first token
is the first step's, not a prefill (the cold prefill is reported apart). Configurations: the
verifier alone (none), SpS and the pair's Cactus
rule with the draft model, and the Cactus rule with prompt lookup (ngram) and with both (hybrid);
k = 4 for all (the pair's -k auto decides per machine whether drafting pays, and on a busy one
may not draft at all, which would compare nothing).

Per completion: ms to first token, ms in all, verifier calls (verification steps), acceptance
(accepted / drafted), tokens, and whether the completion's first line is the author's.
Writes fim.json (every completion, machine and build facts) and fim.md (the means).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from cactus_gguf import Engine, LoadOptions, Request
from cactus_gguf.prompting.fim import infill_prompt
from cactus_gguf.llama.hw import build_facts, machine_facts
from cactus_gguf.registry import load_registry, resolve_model

K = 4  # a fixed draft length: -k auto, on a loaded machine, may decide not to draft at all
CONFIGS = {"none": {"method": "none"}, "sps": {"method": "sps", "k": K}, "cactus": {"k": K},
           "ngram": {"drafter": "ngram", "k": K}, "hybrid": {"drafter": "hybrid", "k": K}}
SAMPLING = {"editor": {"top_k": 40, "top_p": 0.99, "min_p": 0.0, "temperature": 1.0},
            "greedy": {"temperature": 0.0}}  # editor: llama.vscode's


def first_line(text: str) -> str:
    return text.split("\n", 1)[0].strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="benchmarks/prompts/fim.jsonl")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--sampling", choices=sorted(SAMPLING), default="editor")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-o", "--output", default="benchmarks/results/fim")
    args = ap.parse_args()

    cases = [json.loads(line) for line in Path(args.cases).read_text().splitlines() if line]
    cases = cases[:args.limit] if args.limit else cases
    pair = load_registry().default_pair
    ver, dft = resolve_model(pair.verifier), resolve_model(pair.draft)
    defaults = Request(**{**pair.settings, **SAMPLING[args.sampling],
                          "n_predict": args.n_predict})
    load = LoadOptions(n_ctx=4096, n_threads=args.threads)
    rows = []
    with Engine(ver, dft, load, defaults=defaults) as engine:
        engine.generate("def f():", n_predict=4)  # page the weights in
        ctx = engine.verifier
        for i, case in enumerate(cases):
            ids = infill_prompt(ctx.model, case["input_prefix"], case["input_suffix"],
                                n_batch=ctx.n_batch, n_ctx=ctx.n_ctx, n_predict=args.n_predict)
            engine.reset()
            t0 = time.perf_counter()
            # the file into both caches (k fixed: under -k auto the draft's prompt is decoded
            # only once drafting pays, and the first speculative configuration would pay it)
            warm = engine.generate(ids, n_predict=1, seed=i, k=K)
            cold_s = time.perf_counter() - t0
            for name, config in CONFIGS.items():
                r = engine.generate(ids, seed=i, **config)
                s = r.stats
                rows.append({
                    "case": case["id"], "config": name, "prompt_tokens": len(ids),
                    "cold_prefill_ms": warm.stats.prefill_seconds * 1e3,
                    "cold_ms": cold_s * 1e3, "reused": s.n_prompt_tokens_reused,
                    "ttft_ms": s.first_token_seconds * 1e3,
                    "ms": (s.prefill_seconds + s.decode_seconds) * 1e3,
                    "verifier_calls": s.n_steps, "drafted": s.n_drafted,
                    "accepted": s.n_accepted,
                    "acceptance": s.n_accepted / s.n_drafted if s.n_drafted else None,
                    "tokens": s.n_tokens, "stop": r.stop_reason,
                    "first_line_right": first_line(r.text) == first_line(case["middle"]),
                    "text": r.text})
                print(json.dumps({k: v for k, v in rows[-1].items() if k != "text"}), flush=True)

    summary = []
    for name in CONFIGS:
        mine = [r for r in rows if r["config"] == name]
        drafted = sum(r["drafted"] for r in mine)
        summary.append({
            "config": name, "completions": len(mine),
            "ttft_ms": statistics.mean(r["ttft_ms"] for r in mine),
            "ms": statistics.mean(r["ms"] for r in mine),
            "ms_per_token": sum(r["ms"] for r in mine) / max(1, sum(r["tokens"] for r in mine)),
            "verifier_calls": statistics.mean(r["verifier_calls"] for r in mine),
            "tokens": statistics.mean(r["tokens"] for r in mine),
            "acceptance": sum(r["accepted"] for r in mine) / drafted if drafted else None,
            "first_line_right": sum(r["first_line_right"] for r in mine) / len(mine)})
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    report = {"pair": pair.name, "sampling": args.sampling,
              "settings": {**pair.settings, **SAMPLING[args.sampling], "k": K,
                           "n_predict": args.n_predict, "n_ctx": 4096, "n_threads": args.threads},
              "cases": args.cases, "machine": machine_facts(), "build": build_facts(),
              "cold_prefill_ms_mean": statistics.mean(r["cold_prefill_ms"] for r in rows),
              "summary": summary, "completions": rows}
    (out / "fim.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    head = ["config", "ms to first token", "ms per completion", "ms per token", "verifier calls",
            "tokens", "acceptance", "first line as written"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summary:
        acc = "–" if s["acceptance"] is None else f"{s['acceptance']:.2f}"
        md.append(f"| {s['config']} | {s['ttft_ms']:.0f} | {s['ms']:.0f} | {s['ms_per_token']:.0f}"
                  f" | {s['verifier_calls']:.1f} | {s['tokens']:.1f} | {acc} | "
                  f"{s['first_line_right']:.0%} |")
    m = report["machine"]
    md += ["", f"{len(cases)} cases of {args.cases}, means per completion; default pair "
               f"{pair.name} (Cactus: its rule), k = {K}, "
               + ("llama.vscode's sampling (top-k 40, top-p 0.99, T = 1)"
                  if args.sampling == "editor" else "greedy") + ", n_predict "
               f"{args.n_predict}, the file already in the KV caches (cold prefill of the "
               f"prompt: {report['cold_prefill_ms_mean']:.0f} ms on average, "
               f"{statistics.mean(len_ for len_ in (r['prompt_tokens'] for r in rows)):.0f} "
               f"tokens). Machine: {m['cpu']}, {m['cores_usable']} usable cores."]
    (out / "fim.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
