"""Prefix reuse across the turns of a chat: time to first token with and without it.

    python benchmarks/chat_reuse.py [--turns 5] [-n 128] [-t THREADS] [-o benchmarks/results/chat-reuse]

Two engines on the registry's default pair: one reuses its KV caches between requests (the
default), the other starts every request from empty caches (``cache_prompt=False``: a cold start
with the same history). Turn by turn, both get the same conversation (the user's messages below,
then the warm engine's answers), interleaved so machine drift hits both alike; each reports its
time to first token (prompt processing included) and how many prompt tokens it did not decode
again. Greedy decoding, so the two answers can be compared token for token.

Writes chat-reuse.json (every number, machine and build facts) and chat-reuse.md (the table).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from cactus_gguf import Engine, LoadOptions, Request
from cactus_gguf.llama.hw import build_facts, machine_facts
from cactus_gguf.registry import load_registry, resolve_model
from cactus_gguf.prompting.text import columns

USER_TURNS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Now make it ignore spaces and punctuation.",
    "Add a docstring with two doctest examples.",
    "Write a pytest test for it with three cases.",
    "Finally, explain in two sentences how the function works.",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-o", "--output", default="benchmarks/results/chat-reuse")
    args = ap.parse_args()

    pair = load_registry().default_pair
    ver, dft = resolve_model(pair.verifier), resolve_model(pair.draft)
    defaults = Request(**{**pair.settings, "temperature": 0.0, "n_predict": args.n_predict,
                          "seed": 0})
    load = LoadOptions(n_ctx=4096, n_threads=args.threads)
    rows = []
    with Engine(ver, dft, load, defaults=defaults) as warm, \
            Engine(ver, dft, load, defaults=defaults.replace(cache_prompt=False)) as cold:
        # one untimed request each: page the weights in, size llama.cpp's buffers
        for e in (warm, cold):
            e.generate("def f():", n_predict=4)
        warm.reset()
        messages: list[dict] = []
        for turn, text in enumerate(USER_TURNS[:args.turns], 1):
            messages.append({"role": "user", "content": text})
            order = (warm, cold) if turn % 2 else (cold, warm)  # alternate who goes first
            res = {id(e): e.chat(messages) for e in order}
            w, c = res[id(warm)], res[id(cold)]
            rows.append({
                "turn": turn, "prompt_tokens": w.stats.n_prompt_tokens,
                "reused_verifier": w.stats.n_prompt_tokens_reused,
                "reused_draft": w.stats.n_draft_prompt_tokens_reused,
                "ttft_warm_s": w.stats.first_token_seconds, "ttft_cold_s": c.stats.first_token_seconds,
                "prefill_warm_s": w.stats.prefill_seconds, "prefill_cold_s": c.stats.prefill_seconds,
                "ttft_ratio": w.stats.first_token_seconds / c.stats.first_token_seconds,
                "same_tokens": w.tokens == c.tokens, "reply_tokens": len(w.tokens),
                "tokens_per_second_warm": w.stats.tokens_per_second,
                "tokens_per_second_cold": c.stats.tokens_per_second,
            })
            messages.append({"role": "assistant", "content": w.text})
            print(json.dumps(rows[-1]), flush=True)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    report = {"pair": pair.name, "settings": {"n_predict": args.n_predict, "temperature": 0.0,
                                              **pair.settings, "n_ctx": 4096,
                                              "n_threads": args.threads},
              "machine": machine_facts(), "build": build_facts(), "turns": rows}
    (out / "chat-reuse.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    table = [["turn", "prompt tokens", "reused (verifier / draft)", "TTFT warm s", "TTFT cold s",
              "warm / cold", "same tokens"]]
    table += [[str(r["turn"]), str(r["prompt_tokens"]), f"{r['reused_verifier']} / {r['reused_draft']}",
               f"{r['ttft_warm_s']:.2f}", f"{r['ttft_cold_s']:.2f}", f"{r['ttft_ratio']:.1%}",
               "yes" if r["same_tokens"] else "no"] for r in rows]
    lines = columns(table)
    md = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    md += ["| " + " | ".join(r) + " |" for r in table[1:]]
    m = report["machine"]
    md += ["", f"Machine: {m['cpu']}, {m['cores_usable']} usable cores; default pair "
               f"{pair.name}, greedy, n_predict {args.n_predict}, n_ctx 4096."]
    (out / "chat-reuse.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
