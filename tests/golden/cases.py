"""Golden-output cases: fixed prompts x acceptance rules x drafters x seeds, on the tiny pair and the
real Qwen2.5-Coder pair. ``record.py`` writes their token ids; ``tests/test_golden.py`` checks that
the current code still produces exactly those ids (same seed, same tokens), so a refactor proves it
changed nothing.

Every setting of a case is spelled out here (no defaults), so that changing a default elsewhere
does not change a case. Each case decodes from an empty KV cache (no prefix reuse): the golden ids
are those of a cold start.
"""
from __future__ import annotations

# (name, settings) - settings: method ("none" = verifier alone), delta, solver, top_gap,
# protect_ends, drafter, k, draft_min, draft_p_min, temperature, top_k, top_p, min_p, n_predict,
# seed, prompt index
_SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)
_PAPER = dict(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0)
_GREEDY = dict(temperature=0.0, top_k=40, top_p=0.95, min_p=0.05)
# the paper's Cactus rule (no top gap, no protected ends): the rule the ids were recorded with
_BASE = dict(delta=1.0, solver="taylor", drafter="model", k=4, draft_min=0, draft_p_min=0.0,
             top_gap=float("inf"), protect_ends="off")

TINY_PROMPTS = ["hello world", "the cat sat on the mat and the dog"]
REAL_PROMPTS = ["def fibonacci(n):", "Write a short story about a robot:"]


def _cases(rules, warps, seeds, n_predict, prompts):
    out = []
    for rname, rule in rules:
        for wname, warp in warps:
            for seed in seeds:
                for pi in range(len(prompts)):
                    out.append((f"{rname}/{wname}/seed{seed}/prompt{pi}",
                                {**_BASE, **rule, **warp, "seed": seed, "n_predict": n_predict,
                                 "prompt": pi}))
    return out


_RULES_TINY = [
    ("none", dict(method="none")),
    ("sps", dict(method="sps")),
    ("cactus", dict(method="cactus", delta=1.0)),
    ("cactus-exact", dict(method="cactus", delta=0.5, solver="exact")),
    ("typical", dict(method="typical")),
    ("topk", dict(method="topk")),
    ("greedy", dict(method="greedy")),
    ("ngram", dict(method="sps", drafter="ngram", k=3)),
    ("cactus-k8-pmin", dict(method="cactus", k=8, draft_p_min=0.2, draft_min=2)),
]
TINY_CASES = _cases(_RULES_TINY, [("sampled", _SAMPLED), ("greedy", _GREEDY)], (1, 7), 40,
                    TINY_PROMPTS)

_RULES_REAL = [
    ("none", dict(method="none")),
    ("sps", dict(method="sps")),
    ("cactus", dict(method="cactus", delta=1.0)),
    ("typical", dict(method="typical")),
    ("ngram", dict(method="cactus", drafter="ngram", k=4)),
]
REAL_CASES = (_cases(_RULES_REAL, [("paper", _PAPER)], (3,), 24, REAL_PROMPTS)
              + _cases([("cactus", dict(method="cactus"))], [("greedy", _GREEDY)], (0,), 24,
                       REAL_PROMPTS))

# The native helper alone (no llama.cpp): NATIVE_STEPS verification steps of each rule on logits
# drawn from the helper's own generator, so the ids are the same on every machine (the helper is
# built without FMA contraction, tests/golden/golden_run.py:native_steps). Settings spelled out.
NATIVE_STEPS, NATIVE_V, NATIVE_K = 60, 48, 4
NATIVE_SAMPLING = dict(temperature=0.8, top_k=20, top_p=0.95, min_p=0.05)
NATIVE_END = (2, 7)  # the end set of the protected-ends cases
_ACC = dict(delta=1.0, solver="taylor", budget="target", typical_epsilon=0.09, typical_alpha=0.3,
            accept_top_k=5, ears_alpha=0.5, top_gap=float("inf"), end_tau=2.0)
NATIVE_CASES = [(name, {**_ACC, **acc}) for name, acc in [
    ("sps", dict(method="sps")),
    ("cactus-d1", dict(method="cactus")),
    ("cactus-exact-d0.5", dict(method="cactus", delta=0.5, solver="exact")),
    ("cactus-output-d0.5", dict(method="cactus", delta=0.5, budget="output")),
    ("cactus-gap0.5", dict(method="cactus", top_gap=0.5)),
    ("cactus-ends0.1", dict(method="cactus", end_tau=0.1)),
    ("typical", dict(method="typical")),
    ("topk", dict(method="topk")),
    ("greedy", dict(method="greedy")),
    ("ears", dict(method="ears")),
]]
