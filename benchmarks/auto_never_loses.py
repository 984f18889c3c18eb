"""Does the default (`-k auto`) ever lose an answer to the verifier alone? Seconds per answer.

    python benchmarks/auto_never_loses.py [--per-set 6] [-n 128] [--repeats 3] [-t THREADS]
                                          [-o benchmarks/results/auto-never-loses]

On the registry's default pair, one Engine (models loaded once), for three prompt sets (the first
``--per-set`` HumanEval problems, chat questions from prompts/chat-questions.jsonl, and
fill-in-the-middle cases from prompts/fim.jsonl laid out as /infill lays them out) under two
samplings (greedy, and the pair's T 0.6 with its top-k / top-p), each prompt is answered by:

- ``none``: the verifier alone (``method="none"``);
- ``default``: every setting at its default (the pair's rule, ``-k auto``);
- ``default+bs``: the default with ``backend_sampling="on"`` (sampled only: greedy reads no
  top-k), for the backend-sampling default (issue 53 item 2).

Interleaved per prompt, the order rotating from prompt to prompt (so neither configuration always
runs first), ``--repeats`` rounds of all of them per prompt (a prompt's seconds: the median of its
rounds; one round's ratios of the same work vary by up to ±10% on a 2-core machine), same seed
for all, no prefix reuse (``cache_prompt=False``: every answer processes
its prompt, as a new conversation does, so the draft's deferred prefill counts where the default
pays it). Seconds per answer: from the request to its last token (prompt processing included),
the engine's own clock. The cost probe of ``-k auto`` is made (or read from the cache) before the
first timed answer, as a server makes it at its first auto request.

Writes ``bench.json`` (every answer) and ``bench.md``: per set and sampling, the median and the
worst of the per-prompt ratios (seconds under the configuration / seconds of the verifier alone
on the same prompt), and what the default drafted. Valid only with nothing else running on the
machine (llama.cpp's threads spin-wait).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from cactus_gguf import Engine, LoadOptions, Request
from cactus_gguf.bench.prompts import load_humaneval, load_prompts_jsonl, render_prompt
from cactus_gguf.llama.hw import build_facts, machine_facts
from cactus_gguf.prompting.fim import infill_prompt
from cactus_gguf.registry import load_registry, resolve_model

HERE = Path(__file__).parent
SAMPLINGS = {"greedy": {"temperature": 0.0}, "T0.6": {}}  # T0.6: the pair's own settings
CONFIGS = {"none": {"method": "none"}, "default": {},
           "default+bs": {"backend_sampling": "on"}}


def prompts(engine: Engine, per_set: int, n_predict: int) -> dict[str, list[tuple[str, object]]]:
    """{set: [(prompt id, text or token ids)]}."""
    fmt = engine.format_chat
    ctx = engine.verifier
    fim = [json.loads(line) for line in (HERE / "prompts/fim.jsonl").read_text().splitlines()
           if line][:per_set]
    return {
        "humaneval": [(p.id, render_prompt(p, True, fmt)) for p in load_humaneval(per_set)],
        "chat": [(p.id, render_prompt(p, True, fmt)) for p in
                 load_prompts_jsonl(HERE / "prompts/chat-questions.jsonl", per_set)],
        "fim": [(c["id"], infill_prompt(ctx.model, c["input_prefix"], c["input_suffix"],
                                        n_batch=ctx.n_batch, n_ctx=ctx.n_ctx,
                                        n_predict=n_predict)) for c in fim],
    }


def ratios(runs: list[dict], config: str) -> list[float]:
    """Per prompt: the median seconds of ``config``'s rounds / the median of ``none``'s."""
    by: dict[tuple, list[float]] = {}
    for r in runs:
        by.setdefault((r["set"], r["sampling"], r["prompt"], r["config"]), []).append(r["seconds"])
    return [statistics.median(secs) / statistics.median(by[(s, m, p, "none")])
            for (s, m, p, c), secs in by.items() if c == config and (s, m, p, "none") in by]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-set", type=int, default=6)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-o", "--output", default=str(HERE / "results/auto-never-loses"))
    args = ap.parse_args()

    pair = load_registry().default_pair
    ver, dft = resolve_model(pair.verifier), resolve_model(pair.draft)
    defaults = Request(**{**pair.settings, "n_predict": args.n_predict, "cache_prompt": False})
    runs: list[dict] = []
    t_start = time.perf_counter()
    with Engine(ver, dft, LoadOptions(n_ctx=4096, n_threads=args.threads),
                defaults=defaults) as engine:
        engine.generate("def f():", n_predict=4)  # page the weights in
        engine.forward_costs(defaults.k_max)  # -k auto's probe (or the cache), untimed
        sets = prompts(engine, args.per_set, args.n_predict)
        turn = 0
        for sampling, settings in SAMPLINGS.items():
            for name, items in sets.items():
                for i, (pid, prompt) in enumerate(items):
                    configs = ["none", "default"] + (["default+bs"] if settings == {} else [])
                    for _ in range(args.repeats):
                        turn += 1
                        order = configs[turn % len(configs):] + configs[:turn % len(configs)]
                        for config in order:
                            r = engine.generate(prompt, seed=i, **settings, **CONFIGS[config])
                            s = r.stats
                            runs.append({
                                "set": name, "sampling": sampling, "prompt": pid,
                                "config": config, "seconds": s.prefill_seconds + s.decode_seconds,
                                "prefill_seconds": s.prefill_seconds, "tokens": s.n_tokens,
                                "steps": s.n_steps, "drafted": s.n_drafted,
                                "accepted": s.n_accepted, "stop": r.stop_reason,
                                "device_steps": s.n_device_steps})
                            print(json.dumps(runs[-1]), flush=True)
    wall = time.perf_counter() - t_start

    rows = []
    for sampling in SAMPLINGS:
        for name in sets:
            mine = [r for r in runs if r["set"] == name and r["sampling"] == sampling]
            for config in CONFIGS:
                if config == "none" or not any(r["config"] == config for r in mine):
                    continue
                rs = ratios(mine, config)
                own = [r for r in mine if r["config"] == config]
                rows.append({"set": name, "sampling": sampling, "config": config,
                             "prompts": len(rs), "median": statistics.median(rs),
                             "worst": max(rs), "best": min(rs),
                             "drafted": sum(r["drafted"] for r in own),
                             "accepted": sum(r["accepted"] for r in own),
                             "tokens": sum(r["tokens"] for r in own)})
    overall = {c: {"median": statistics.median(ratios(runs, c)), "worst": max(ratios(runs, c)),
                   "prompts": len(ratios(runs, c))} for c in CONFIGS if c != "none"}
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    m = machine_facts()
    report = {"pair": pair.name, "settings": pair.settings, "n_predict": args.n_predict,
              "repeats": args.repeats,
              "per_set": args.per_set, "machine": m, "build": build_facts(),
              "wall_seconds": wall, "rows": rows, "overall": overall, "runs": runs}
    (out / "bench.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    md = ["Seconds per answer × the verifier alone's on the same prompt (median [worst, best] "
          "of the per-prompt ratios, each of the median seconds of its rounds); what the "
          "configuration drafted / accepted / emitted in all (all rounds).",
          "", "| set | sampling | config | prompts | × none, median | worst | best "
          "| drafted / accepted / tokens |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['set']} | {r['sampling']} | {r['config']} | {r['prompts']} | "
                  f"{r['median']:.3f} | {r['worst']:.3f} | {r['best']:.3f} | "
                  f"{r['drafted']} / {r['accepted']} / {r['tokens']} |")
    md += ["", "All prompts: " + "; ".join(
        f"{c}: median {v['median']:.3f}, worst {v['worst']:.3f} ({v['prompts']} answers)"
        for c, v in overall.items()) + ".", "",
        f"Default pair {pair.name} ({json.dumps(pair.settings)}), n_predict {args.n_predict}, "
        f"no prefix reuse, {args.repeats} rounds per prompt, one interleaved run of "
        f"{wall / 60:.1f} minutes. Machine: {m['cpu']}, "
        f"{m['cores_usable']} usable cores. Command: `python benchmarks/auto_never_loses.py"
        f"{'' if args.per_set == 6 else f' --per-set {args.per_set}'}"
        f"{'' if args.repeats == 3 else f' --repeats {args.repeats}'}`."]
    (out / "bench.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
