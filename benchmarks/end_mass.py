"""Why Cactus answers are longer: the verifier's mass on ending, and the emitted law's, per position.

    python benchmarks/end_mass.py [--journal benchmarks/results/quality] [--limit 80]
                                  [-o benchmarks/results/end-mass]

Reads the answers of a finished quality journal (HumanEval in a chat, each answer stopped at the
closing code fence) and re-scores every answer position on the real pair: one verifier decode and
one draft decode of prompt + answer + the closing fence give q_t (the verifier's warped
distribution before answer token t) and p_t (the draft's), and the native helper's exact emitted
law P_t (``NativeSampler.emitted_law``, the rule of the configuration: Cactus δ, the paper's
target budget) the law of the token a drafted position emits there. The *end set* E is the
end-of-generation tokens and the tokens that start the stop string "```" (the product's own
``spec.vocab.end_set``, what ``--protect-ends`` guards). Per position: q_t(E), p_t(E),
P_t(E). Under SpS P_t = q_t, so P_t(E) < q_t(E) is the mass on ending the rule takes away.

Reported per trajectory (the answers of one configuration):
- ``ends_removed``: Σ_t (q_t(E) − P_t(E)) per answer, the expected number of ends the rule
  suppresses along the answer (the rule's own law scored on its own path);
- ``stop_points``: positions where the verifier puts q_t(E) >= 0.5 on ending and the answer goes
  on (the emitted token is not in E), with the mean P_t(E) and p_t(E) there;
- ``tokens_after_first_stop_point``: tokens written after the first such position, summed over
  answers: the part of the length the verifier would most likely not have written.
Caveat: bonus positions (all drafts accepted) emit from q, not P; every answer position is scored
as a drafted one, so ``ends_removed`` is an upper bound by about the bonus share. Answers are
re-tokenised from their text (the journal keeps text): nearly always the generated ids.
Timing-independent: any machine, any load. Writes end_mass.json and end_mass.md.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from cactus_gguf import Engine, LoadOptions
from cactus_gguf.bench.prompts import load_humaneval, render_prompt
from cactus_gguf.llama.hw import machine_facts
from cactus_gguf.registry import resolve_model
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams
from cactus_gguf.speculative.vocab import end_set, token_pieces

FENCE = "```"
STOP_POINT = 0.5  # q_t(E) at or above which the verifier "wants to stop"


def rows(ctx, prompt: list[int], answer: list[int], n_vocab: int) -> np.ndarray:
    """float32 [len(answer), V]: the logits before each answer token (prompt decoded first)."""
    ctx.sync(prompt[:-1], reuse=False)
    feed = [prompt[-1]] + answer[:-1]
    out = np.full((len(answer), n_vocab), -np.inf, dtype=np.float32)
    step = ctx.n_batch
    for a in range(0, len(feed), step):
        chunk = feed[a:a + step]
        logits = ctx.decode(chunk, n_logits=len(chunk))
        w = min(n_vocab, logits.shape[1])
        out[a:a + len(chunk), :w] = logits[:, :w]
    return out


def score(engine, sampler: NativeSampler, end: np.ndarray, prompt: list[int], answer: list[int]
          ) -> dict:
    """Per position q(E), p(E), P(E) and whether the emitted token ended the answer."""
    V = engine.verifier.n_vocab
    vq = rows(engine.verifier, prompt, answer, V)
    vp = rows(engine.draft, prompt, answer, V)
    qE, pE, PE = [], [], []
    for t in range(len(answer)):
        q = sampler.warp(vq[t])
        p = sampler.warp(vp[t])
        law = sampler.emitted_law(p, q)
        qE.append(float(q[end].sum()))
        pE.append(float(p[end].sum()))
        PE.append(float(law.probs[end].sum()))
    return {"q_end": qE, "p_end": pE, "P_end": PE, "ended": [bool(end[a]) for a in answer]}


def summarise(per_answer: list[dict]) -> dict:
    n_tok = sum(len(a["q_end"]) for a in per_answer)
    removed = [sum(q - P for q, P in zip(a["q_end"], a["P_end"])) for a in per_answer]
    stop_q, stop_P, stop_p, after = [], [], [], 0
    for a in per_answer:
        first = None
        for t, (q, P, p, ended) in enumerate(zip(a["q_end"], a["P_end"], a["p_end"], a["ended"])):
            if q >= STOP_POINT and not ended:
                stop_q.append(q), stop_P.append(P), stop_p.append(p)
                first = t if first is None else first
        if first is not None:
            after += len(a["q_end"]) - 1 - first
    return {"answers": len(per_answer), "tokens": n_tok,
            "tokens_per_answer": n_tok / len(per_answer),
            "ends_removed_per_answer": float(np.mean(removed)),
            "answers_with_ends_removed_over_0.5": sum(r > 0.5 for r in removed),
            "stop_points": len(stop_q), "stop_points_per_answer": len(stop_q) / len(per_answer),
            "stop_point_mean_q_end": float(np.mean(stop_q)) if stop_q else None,
            "stop_point_mean_P_end": float(np.mean(stop_P)) if stop_P else None,
            "stop_point_mean_p_end": float(np.mean(stop_p)) if stop_p else None,
            "tokens_after_first_stop_point": after}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--journal", default="benchmarks/results/quality")
    ap.add_argument("--configs", default="none,sps-k4,cactus-d1-k4")
    ap.add_argument("--delta", type=float, default=1.0, help="the Cactus δ whose law is scored")
    ap.add_argument("--limit", type=int, default=80)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-o", "--output", default="benchmarks/results/end-mass")
    args = ap.parse_args()
    lines = Path(args.journal, "runs.jsonl").read_text(encoding="utf-8").splitlines()
    plan = json.loads(lines[0])["plan"]
    runs = [json.loads(x) for x in lines[1:]]
    req = plan["request"]
    configs = args.configs.split(",")
    problems = load_humaneval(None)[:args.limit]
    warps = SamplingParams(req["temperature"], req["top_k"], req["top_p"], req["min_p"])
    rule = AcceptanceParams(method="cactus", delta=args.delta, solver=req["solver"],
                            budget="target")
    by = {(r["prompt"], r["config"]): r for r in runs}
    ver, dft = resolve_model(plan["verifier"]), resolve_model(plan["draft"])
    result = {"journal": args.journal, "delta": args.delta, "warps": asdict(warps),
              "stop_point": STOP_POINT, "machine": machine_facts(), "configs": {}}
    with Engine(ver, dft, LoadOptions(n_ctx=4096, n_threads=args.threads)) as engine:
        V = engine.verifier.n_vocab
        end = end_set(engine.verifier.model, token_pieces(engine.verifier.model), (FENCE,), V)
        sampler = NativeSampler(V, warps, rule, 0)
        m = engine.verifier.model
        for cfg in configs:
            scored = []
            for p in problems:
                r = by.get((p.id, cfg))
                if r is None or r["stop_reason"] != "stop":
                    continue  # answers cut by -n have no end to suppress
                prompt = engine.tokenize(render_prompt(p, True, engine.format_chat))
                answer = m.tokenize(r["text"] + FENCE, add_special=False, parse_special=False)
                scored.append({"prompt": p.id, **score(engine, sampler, end, prompt, answer)})
            result["configs"][cfg] = {"summary": summarise(scored), "answers": scored}
            print(cfg, json.dumps(result["configs"][cfg]["summary"]), flush=True)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "end_mass.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    head = ["trajectory", "answers", "tokens/answer", "ends removed/answer (Σ q(E) − P(E))",
            "stop points/answer (q(E) ≥ 0.5, went on)", "mean q(E) there", "mean P(E) there",
            "mean p(E) there", "tokens after the first stop point"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cfg, d in result["configs"].items():
        s = d["summary"]
        f = lambda x, spec: "–" if x is None else format(x, spec)  # noqa: E731
        md.append("| " + " | ".join([cfg, str(s["answers"]), f(s["tokens_per_answer"], ".1f"),
                                     f(s["ends_removed_per_answer"], ".2f"),
                                     f(s["stop_points_per_answer"], ".2f"),
                                     f(s["stop_point_mean_q_end"], ".2f"),
                                     f(s["stop_point_mean_P_end"], ".2f"),
                                     f(s["stop_point_mean_p_end"], ".2f"),
                                     str(s["tokens_after_first_stop_point"])]) + " |")
    (out / "end_mass.md").write_text("\n".join(md) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
