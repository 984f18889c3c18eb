"""What the HTTP server costs: streaming through ``cactus-gguf serve`` vs the in-process API, and
prefix reuse across a chat through the server.

    python benchmarks/server_overhead.py [--prompts 16] [-n 128] [-o benchmarks/results/server]

One ``cactus-gguf serve`` subprocess and one in-process Engine, both on the registry's default pair
with its settings; never both computing at once. For each prompt (HumanEval stubs, completion
endpoint), the server is asked first or second in turn, with the same seed: streamed tokens per
second as the client sees it (generated tokens over the time from the first to the last chunk) and
the engine's own decode tok/s. Then a 5-turn chat through the server, each turn with and without
``cache_prompt``: time to first token as the client sees it.

Writes server.json and server.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from cactus_gguf import Engine, LoadOptions, Request  # noqa: E402
from cactus_gguf.bench.prompts import load_humaneval  # noqa: E402
from cactus_gguf.llama.hw import machine_facts  # noqa: E402
from cactus_gguf.registry import load_registry, resolve_model  # noqa: E402
from support.server import LiveServer  # noqa: E402

from chat_reuse import USER_TURNS  # noqa: E402


def stream_server(url: str, body: dict) -> tuple[int, float, float, dict]:
    """(tokens, seconds first->last chunk, seconds to the first chunk, final speculative block
    with the text under "text")."""
    t0 = time.perf_counter()
    first = last = None
    final, parts = {}, []
    with httpx.stream("POST", url, json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            choice = chunk["choices"][0] if chunk.get("choices") else {}
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text:
                parts.append(text)
                now = time.perf_counter()
                first = first or now
                last = now
            if choice.get("finish_reason"):
                final = chunk["speculative"]
            if "usage" in chunk and chunk["usage"]:
                final["completion_tokens"] = chunk["usage"]["completion_tokens"]
    final["text"] = "".join(parts)
    return final["completion_tokens"], last - first, first - t0, final


def stream_local(engine: Engine, prompt: str, **kw) -> tuple[int, float, float, object]:
    t0 = time.perf_counter()
    first = last = None
    s = engine.stream(prompt, **kw)
    for _ in s:
        now = time.perf_counter()
        first = first or now
        last = now
    return s.result.stats.n_tokens, last - first, first - t0, s.result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-o", "--output", default="benchmarks/results/server")
    args = ap.parse_args()
    pair = load_registry().default_pair
    ver, dft = resolve_model(pair.verifier), resolve_model(pair.draft)
    prompts = [p.problem["prompt"] for p in load_humaneval(args.prompts)]
    rows, turns = [], []
    with LiveServer("--pair", pair.name, "-c", "4096") as srv, \
            Engine(ver, dft, LoadOptions(n_ctx=4096), defaults=Request(**pair.settings)) as eng:
        url = srv.url + "/v1/completions"
        # page the weights in on both sides
        stream_server(url, {"prompt": "def f():", "max_tokens": 8, "stream": True,
                            "stream_options": {"include_usage": True}})
        stream_local(eng, "def f():", n_predict=8)
        for i, prompt in enumerate(prompts):
            body = {"prompt": prompt, "max_tokens": args.n_predict, "seed": i, "stream": True,
                    "stream_options": {"include_usage": True}, "cache_prompt": False}
            order = ("server", "local") if i % 2 == 0 else ("local", "server")
            got = {}
            for who in order:
                if who == "server":
                    n, dt, ttft, spec = stream_server(url, body)
                    got[who] = (n, dt, ttft, spec["tokens_per_second"])
                else:
                    n, dt, ttft, res = stream_local(eng, prompt, n_predict=args.n_predict, seed=i,
                                                    cache_prompt=False)
                    got[who] = (n, dt, ttft, res.stats.tokens_per_second)
            (ns, ds, ts, es), (nl, dl, tl, el) = got["server"], got["local"]
            rows.append({"prompt": i, "tokens": [ns, nl], "stream_tps_server": (ns - 1) / ds,
                         "stream_tps_local": (nl - 1) / dl, "engine_tps_server": es,
                         "engine_tps_local": el, "ttft_server": ts, "ttft_local": tl,
                         "ratio": ((ns - 1) / ds) / ((nl - 1) / dl)})
            print(json.dumps(rows[-1]), flush=True)
        chat_url = srv.url + "/v1/chat/completions"
        messages: list[dict] = []
        for t, text in enumerate(USER_TURNS, 1):
            messages.append({"role": "user", "content": text})
            base = {"messages": messages, "max_tokens": args.n_predict, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True}}
            # warm reuses what the caches hold: the previous turn's prompt and answer (left by
            # the previous cold run, which decoded the same tokens: greedy); then cold, from empty
            _, _, ttft_warm, spec = stream_server(chat_url, base)
            _, _, ttft_cold, _ = stream_server(chat_url, {**base, "cache_prompt": False})
            messages.append({"role": "assistant", "content": spec["text"]})
            turns.append({"turn": t, "ttft_warm": ttft_warm, "ttft_cold": ttft_cold,
                          "ratio": ttft_warm / ttft_cold, "reused": spec["prompt_tokens_reused"]})
            print(json.dumps(turns[-1]), flush=True)
    ratio = statistics.median(r["ratio"] for r in rows)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    report = {"pair": pair.name, "settings": dict(pair.settings), "n_predict": args.n_predict,
              "machine": machine_facts(), "prompts": rows, "chat": turns,
              "median_stream_ratio": ratio}
    (out / "server.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    md = ["| prompt | streamed tok/s, server | in-process | server / in-process |",
          "|---|---|---|---|"]
    md += [f"| {r['prompt']} | {r['stream_tps_server']:.2f} | {r['stream_tps_local']:.2f} | "
           f"{r['ratio']:.3f} |" for r in rows]
    md += [f"| median | | | {ratio:.3f} |", "",
           "| chat turn | TTFT with reuse s | cold s | ratio | prompt tokens reused |",
           "|---|---|---|---|---|"]
    md += [f"| {t['turn']} | {t['ttft_warm']:.2f} | {t['ttft_cold']:.2f} | {t['ratio']:.1%} | "
           f"{t['reused']} |" for t in turns]
    (out / "server.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
