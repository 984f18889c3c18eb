"""The verifier over llama.cpp's RPC backend on loopback vs the same verifier local.

    python benchmarks/rpc_loopback.py [--prompts 6] [-n 128] [-k 4] [-o benchmarks/results/rpc]

Runs on llama.cpp built with RPC (tests/support/rpc.py builds it once, cached; this script re-runs
itself with ``LLAMA_CPP_LIB_PATH`` pointing at it) against one ``ggml-rpc-server`` on 127.0.0.1
with as many threads as the client. Three engines on the registry's default pair with its settings:
``local`` (every layer on this process's CPU, weights repacked as by default), ``local_norepack``
(the same without repacking: the kernels an rpc-server's CPU device uses) and ``rpc`` (every
verifier layer, its KV cache and its logits on the rpc-server; the draft local). For each HumanEval
prompt and each method (none, sps, cactus), the three decode with the same seed, in rotating order,
never two at once: decode tok/s, end-to-end tok/s (prompt processing included) and whether the RPC
tokens equal the no-repack local ones (same arithmetic).

Writes rpc.json and rpc.md (per method: median tok/s of each side and the median of per-prompt
ratios rpc / local).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from support.rpc import RpcServer, rpc_build  # noqa: E402

METHODS = ("none", "sps", "cactus")
SIDES = ("local", "local_norepack", "rpc")


def measure(args) -> None:
    from cactus_gguf import Engine, LoadOptions, Request
    from cactus_gguf.bench.prompts import load_humaneval
    from cactus_gguf.llama.hw import machine_facts
    from cactus_gguf.registry import load_registry, resolve_model

    pair = load_registry().default_pair
    ver, dft = resolve_model(pair.verifier), resolve_model(pair.draft)
    prompts = [p.problem["prompt"] for p in load_humaneval(args.prompts)]
    defaults = Request(**{**pair.settings, "k": args.k})
    build = rpc_build()
    rows = []
    with RpcServer(build, threads=args.threads) as srv:
        load = LoadOptions(n_ctx=2048, n_threads=args.threads)
        with Engine(ver, dft, load, defaults=defaults) as local, \
                Engine(ver, dft, load.replace(repack=False), defaults=defaults) as plain, \
                Engine(ver, dft, load.replace(rpc=srv.endpoint), defaults=defaults) as remote:
            engines = {"local": local, "local_norepack": plain, "rpc": remote}
            for eng in engines.values():  # page the weights in, warm every side
                eng.generate("def f():", n_predict=8, seed=0)
            for i, prompt in enumerate(prompts):
                for j, method in enumerate(METHODS):
                    order = list(SIDES[(i * len(METHODS) + j) % len(SIDES):]
                                 + SIDES[:(i * len(METHODS) + j) % len(SIDES)])  # rotate
                    row = {"prompt": i, "method": method}
                    got = {}
                    for who in order:
                        got[who] = r = engines[who].generate(
                            prompt, n_predict=args.n_predict, seed=i, method=method,
                            cache_prompt=False)
                        st = r.stats
                        row[f"tps_{who}"] = st.tokens_per_second
                        # end to end: llama_decode over RPC returns before the remote graph is
                        # done, so part of the prompt's cost shows up in the first step
                        row[f"e2e_{who}"] = st.n_tokens / (st.prefill_seconds + st.decode_seconds)
                        row[f"prefill_{who}"] = st.prefill_seconds
                    row["al_rpc"] = (got["rpc"].stats.mean_accepted_length
                                     if method != "none" else None)
                    row["same_tokens_as_norepack"] = got["local_norepack"].tokens == got["rpc"].tokens
                    row["tokens"] = len(got["rpc"].tokens)
                    rows.append(row)
                    print(json.dumps(rows[-1]), flush=True)
    summary = []
    for method in METHODS:
        rs = [r for r in rows if r["method"] == method]
        med = lambda key: statistics.median(r[key] for r in rs)  # noqa: E731
        summary.append({"method": method, "n": len(rs),
                        **{f"tps_{w}": med(f"tps_{w}") for w in SIDES},
                        **{f"e2e_{w}": med(f"e2e_{w}") for w in SIDES},
                        "ratio_decode": statistics.median(r["tps_rpc"] / r["tps_local"] for r in rs),
                        "ratio_decode_norepack": statistics.median(
                            r["tps_rpc"] / r["tps_local_norepack"] for r in rs),
                        "ratio_e2e": statistics.median(r["e2e_rpc"] / r["e2e_local"] for r in rs),
                        "ratio_e2e_norepack": statistics.median(
                            r["e2e_rpc"] / r["e2e_local_norepack"] for r in rs),
                        "same_tokens": sum(r["same_tokens_as_norepack"] for r in rs)})
    report = {"pair": pair.name, "settings": dict(defaults.__dict__), "n_predict": args.n_predict,
              "k": args.k, "prompts": args.prompts, "threads": args.threads,
              "machine": machine_facts(), "rows": rows, "summary": summary}
    write_report(Path(args.output), report)


def write_report(out: Path, report: dict) -> None:
    """rpc.json and rpc.md in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "rpc.json").write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
    md = [f"k = {report['k']}, {report['prompts']} HumanEval prompts, -n {report['n_predict']}, "
          f"{report['threads']} threads (client and rpc-server), one interleaved run; ratios are "
          "medians of per-prompt ratios", "",
          "| method | decode tok/s: local | local, no repack | verifier over RPC | RPC / local | "
          "RPC / local no repack | end-to-end RPC / local | end-to-end RPC / local no repack |",
          "|---|---|---|---|---|---|---|---|"]
    md += [f"| {s['method']} | {s['tps_local']:.2f} | {s['tps_local_norepack']:.2f} | "
           f"{s['tps_rpc']:.2f} | {s['ratio_decode']:.3f} | {s['ratio_decode_norepack']:.3f} | "
           f"{s['ratio_e2e']:.3f} | {s['ratio_e2e_norepack']:.3f} |" for s in report["summary"]]
    none = next(s for s in report["summary"] if s["method"] == "none")
    md += ["", f"The verifier alone over RPC gave the same tokens as local without repacking on "
           f"{none['same_tokens']} of {none['n']} prompts (same arithmetic; with drafts the two "
           "engines' local drafts differ: the RPC engine's repacks)."]
    (out / "rpc.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--output", default="benchmarks/results/rpc")
    ap.add_argument("--report", action="store_true", help="only rewrite rpc.md from rpc.json")
    args = ap.parse_args()
    if args.report:
        out = Path(args.output)
        return write_report(out, json.loads((out / "rpc.json").read_text(encoding="utf-8")))
    build = rpc_build()
    if os.environ.get("LLAMA_CPP_LIB_PATH") != str(build.lib):  # re-run on the RPC build
        sys.exit(subprocess.call([sys.executable, *sys.argv], env=build.env()))
    measure(args)


if __name__ == "__main__":
    main()
