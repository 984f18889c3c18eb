"""Acceptance and time to first token against the draft's prompt window (``--draft-window W``).

    python benchmarks/draft_window.py [--windows 0,16,64,256] [-n 128] [-o benchmarks/results/draft-window]

One Engine on the registry's default pair with its settings (SpS, k = 4, so acceptance is the
draft's quality alone). For each prompt of the editing set (chat-formatted, 300-700 tokens: long
enough for a window to matter) and each W, the same seed: acceptance rate, acceptance length,
the prompt processing time of both models (``prefill_seconds``: the draft's share is what W cuts),
time to the first token, end-to-end tok/s. W = 0 is the whole prompt (the default). Windows in
rotating order per prompt, never two generations at once.

Writes window.json and window.md (medians over prompts per W).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from cactus_gguf import Engine, LoadOptions, Request
from cactus_gguf.bench.prompts import load_prompts_jsonl
from cactus_gguf.llama.hw import machine_facts
from cactus_gguf.registry import load_registry, resolve_model

PROMPTS = Path(__file__).resolve().parent / "prompts" / "editing.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", default="0,16,64,256")
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--limit", type=int, default=12)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--output", default="benchmarks/results/draft-window")
    args = ap.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    pair = load_registry().default_pair
    defaults = Request(**{**pair.settings, "method": "sps", "k": 4})
    rows = []
    with Engine(resolve_model(pair.verifier), resolve_model(pair.draft),
                LoadOptions(n_ctx=4096, n_threads=args.threads), defaults=defaults) as eng:
        eng.generate("def f():", n_predict=8, seed=0)  # page the weights in
        prompts = load_prompts_jsonl(PROMPTS, args.limit)
        for i, p in enumerate(prompts):
            text = eng.format_chat([{"role": "user", "content": p.text}])
            n_prompt = len(eng.tokenize(text))
            for w in windows[i % len(windows):] + windows[:i % len(windows)]:
                r = eng.generate(text, n_predict=args.n_predict, seed=i, draft_window=w,
                                 cache_prompt=False)
                st = r.stats
                rows.append({"prompt": p.id, "n_prompt": n_prompt, "window": w,
                             "acceptance": st.n_accepted / max(1, st.n_drafted),
                             "al": st.mean_accepted_length, "prefill_s": st.prefill_seconds,
                             "ttft_s": st.first_token_seconds,  # prompt included
                             "e2e_tps": st.n_tokens / (st.prefill_seconds + st.decode_seconds),
                             "tokens": st.n_tokens})
                print(json.dumps(rows[-1]), flush=True)
    summary = []
    for w in windows:
        rs = [r for r in rows if r["window"] == w]
        summary.append({"window": w, **{key: statistics.median(r[key] for r in rs)
                                        for key in ("acceptance", "al", "prefill_s", "ttft_s",
                                                    "e2e_tps", "n_prompt")}})
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "window.json").write_text(json.dumps({"pair": pair.name, "settings": dict(defaults.__dict__),
                                                 "machine": machine_facts(), "rows": rows,
                                                 "summary": summary}, indent=1, default=str) + "\n",
                                     encoding="utf-8")
    md = [f"SpS, k = 4, {len(prompts)} editing prompts (median {summary[0]['n_prompt']:.0f} tokens), "
          f"-n {args.n_predict}, one run, medians over prompts", "",
          "| draft window W | acceptance | AL | prompt processing s (both models) "
          "| time to first token s | end-to-end tok/s |",
          "|---|---|---|---|---|---|"]
    md += [f"| {'all' if s['window'] == 0 else s['window']} | {s['acceptance']:.1%} | {s['al']:.2f} | "
           f"{s['prefill_s']:.2f} | {s['ttft_s']:.2f} | {s['e2e_tps']:.2f} |" for s in summary]
    (out / "window.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
