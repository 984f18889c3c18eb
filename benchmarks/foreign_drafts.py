"""A foreign draft against the same-family draft and the verifier alone, per answer.

    python benchmarks/foreign_drafts.py [--humaneval 12] [--prose 8] [-n 192] [-k 4] [-t 2]
                                        [-o benchmarks/results/foreign-drafts]

The default pair's verifier (Qwen2.5-Coder-1.5B-Instruct Q4_K_M) with two drafts: its own
family's 0.5B (one vocabulary) and SmolLM2-135M-Instruct (49,152 tokens, another tokenizer), the
latter through both cross-vocabulary methods (``--draft-vocab intersect`` and ``text``). Both
engines are loaded at once and every configuration decodes each prompt in turn, in an order
rotated per prompt, never two at once, with the pair's sampling (temperature 0.6, top-k 20,
top-p 0.95), fixed k and one seed per prompt:

    none                     the verifier alone
    same sps / same cactus   the 0.5B draft; cactus = the default rule (δ 1, protected ends 0.1,
                             top gap 0.5)
    intersect sps / cactus   SmolLM2, restricted to the shared tokens
    text sps / cactus        SmolLM2, its text re-tokenised by the verifier

Per answer: seconds end to end (prompt processing included, no prefix reuse), verifier calls,
draft forwards, tokens; acceptance, tokens per verifier call, the verifier's mass on the shared
tokens (``vocab_coverage``); HumanEval pass@1.
Writes foreign-drafts.json (every answer) and foreign-drafts.md (means per configuration and
set, and each configuration's per-answer seconds / verifier calls against none's, paired).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

CONFIGS = (("none", "same", "none", "auto"), ("same sps", "same", "sps", "auto"),
           ("same cactus", "same", "cactus", "auto"), ("intersect sps", "foreign", "sps", "intersect"),
           ("intersect cactus", "foreign", "cactus", "intersect"),
           ("text sps", "foreign", "sps", "text"), ("text cactus", "foreign", "cactus", "text"))
# the default pair's measured rule (docs/benchmarks.md "Which rule is the default"), for the
# cactus rows
CACTUS = {"delta": 1.0, "protect_ends": 0.1, "top_gap": 0.5}
PROSE = Path(__file__).resolve().parent / "prompts" / "chat-questions.jsonl"


def _prompts(n_code: int, n_prose: int):
    from cactus_gguf.bench.prompts import load_humaneval, load_prompts_jsonl

    return ([("humaneval", p) for p in load_humaneval(n_code)]
            + [("prose", p) for p in load_prompts_jsonl(PROSE, n_prose)])


def _answer(eng, text, prompt, request) -> dict:
    from cactus_gguf.bench.scoring import check_completion, extract_completion

    t0 = time.perf_counter()
    r = eng.generate(text, request)
    wall = time.perf_counter() - t0
    s = r.stats
    row = {"seconds": wall, "verifier_calls": s.n_steps, "draft_forwards": s.n_draft_forwards,
           "tokens": s.n_tokens, "drafted": s.n_drafted, "accepted": s.n_accepted,
           "acceptance": s.acceptance_rate, "tokens_per_call": s.tokens_per_verifier_call,
           "coverage": s.vocab_coverage, "draft_vocab": s.draft_vocab, "stop": r.stop_reason}
    if prompt.problem is not None:
        completion = extract_completion(prompt.problem["prompt"], r.text)
        row["passed"] = check_completion(prompt.problem, completion)[0]
    return row


def measure(args) -> list[dict]:
    from cactus_gguf import Engine, LoadOptions, Request
    from cactus_gguf.bench.prompts import render_prompt
    from cactus_gguf.registry import load_registry, resolve_model

    pair = load_registry().default_pair
    ver, same = resolve_model(pair.verifier), resolve_model(pair.draft)
    foreign = resolve_model("smollm2-135m-instruct-q4_1")
    sampling = {k: pair.settings[k] for k in ("temperature", "top_k", "top_p", "min_p")}
    base = Request(n_predict=args.n_predict, k=args.k, **sampling)
    load = LoadOptions(n_ctx=4096, n_threads=args.threads)
    rows = []
    with Engine(ver, same, load, defaults=base) as e_same, \
            Engine(ver, foreign, load, defaults=base) as e_foreign:
        engines = {"same": e_same, "foreign": e_foreign}
        for eng in engines.values():  # page the weights in
            eng.generate("def f():", n_predict=8, seed=0, k=2, method="sps")
        prompts = _prompts(args.humaneval, args.prose)
        for i, (kind, prompt) in enumerate(prompts):
            text = render_prompt(prompt, True, e_same.format_chat)
            order = CONFIGS[i % len(CONFIGS):] + CONFIGS[:i % len(CONFIGS)]  # rotate
            for label, which, method, vocab in order:
                extra = CACTUS if method == "cactus" else {}
                # every answer pays its prompt in full, as a new question would: with prefix
                # reuse the first configuration on each engine would pay it for the others
                request = base.replace(method=method, draft_vocab=vocab, seed=1000 + i,
                                       cache_prompt=False, **extra)
                row = {"set": kind, "prompt": prompt.id, "config": label,
                       **_answer(engines[which], text, prompt, request)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def summarize(rows: list[dict]) -> str:
    out = []
    for kind in ("humaneval", "prose"):
        sub = [r for r in rows if r["set"] == kind]
        if not sub:
            continue
        none = {r["prompt"]: r for r in sub if r["config"] == "none"}
        out += [f"### {kind} ({len(none)} prompts)", "",
                "| config | s / answer | × none (s) | verifier calls / answer | × none (calls) | "
                "tokens / answer | acceptance | tokens / call | coverage Σq | pass@1 |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for label, *_ in CONFIGS:
            rs = [r for r in sub if r["config"] == label]
            ratio_s = statistics.median(r["seconds"] / none[r["prompt"]]["seconds"] for r in rs)
            ratio_c = statistics.median(r["verifier_calls"] / none[r["prompt"]]["verifier_calls"]
                                        for r in rs)
            passed = [r["passed"] for r in rs if "passed" in r]
            cov = _mean(r["coverage"] for r in rs)
            out.append(
                f"| {label} | {_mean(r['seconds'] for r in rs):.2f} | {ratio_s:.2f} | "
                f"{_mean(r['verifier_calls'] for r in rs):.1f} | {ratio_c:.2f} | "
                f"{_mean(r['tokens'] for r in rs):.1f} | "
                f"{_mean(r['acceptance'] for r in rs):.1%} | "
                f"{_mean(r['tokens_per_call'] for r in rs):.2f} | "
                + (f"{cov:.1%}" if cov is not None else "–") + " | "
                + (f"{sum(passed)}/{len(passed)}" if passed else "–") + " |")
        out.append("")
    out.append("× none: the median over prompts of the configuration's per-answer figure over "
               "the verifier alone's on the same prompt.")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--humaneval", type=int, default=12)
    ap.add_argument("--prose", type=int, default=8)
    ap.add_argument("-n", "--n-predict", type=int, default=192)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--out", default="benchmarks/results/foreign-drafts")
    args = ap.parse_args()
    from cactus_gguf.llama.hw import machine_facts

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows = measure(args)
    facts = machine_facts()
    (out / "foreign-drafts.json").write_text(json.dumps(
        {"machine": facts, "args": vars(args), "seconds": time.time() - t0, "rows": rows},
        indent=1) + "\n")
    (out / "foreign-drafts.md").write_text(
        f"# Foreign draft vs same-family draft, per answer\n\nMachine: {facts['cpu']} "
        f"({', '.join(facts['simd'])}), {facts['cores_logical']} cores. "
        f"k = {args.k}, -n {args.n_predict}, -t {args.threads}, temperature 0.6, top-k 20, "
        f"top-p 0.95; one interleaved sitting ({time.time() - t0:.0f} s).\n\n" + summarize(rows))
    print((out / "foreign-drafts.md").read_text())


if __name__ == "__main__":
    main()
