"""The distribution checks: Pearson's chi-square p-value at significance ``ALPHA`` (fixed seeds,
so each test is deterministic), and the law of the first emitted token on a tiny pair (the
engine's histogram; the warped verifier and draft distributions it is checked against)."""
from __future__ import annotations

import numpy as np
from scipy import stats as sps_stats

from cactus_gguf.llama import Context, ContextOptions
from cactus_gguf.sampling import AcceptanceParams, NativeSampler

from support.harness import make_engine

ALPHA = 0.001
PROMPT = "the cat sat on"
CTX = ContextOptions(n_ctx=512, n_batch=64, n_threads=1)


def chisquare_pvalue(counts, expected_probs, strict=True):
    """Pearson chi-square p-value of ``counts`` against ``expected_probs``; an emitted token outside
    the expected support fails (strict) or gives p = 0."""
    support = expected_probs > 0
    if counts[~support].sum():
        assert not strict, "a token outside the expected support was emitted"
        return 0.0
    if support.sum() == 1:
        return 1.0  # a point mass, and every count is on it
    exp = expected_probs[support] / expected_probs[support].sum() * counts.sum()
    return sps_stats.chisquare(counts[support], exp).pvalue


def decoder(ver, dft, *, temp=1.0, top_k=8, **kw):
    """An engine over the tiny pair at temperature 1, top-k 8 and the paper's Cactus rule (no top
    gap, no protected ends: the NumPy reference's default, whose laws these tests check) unless
    told otherwise."""
    kw = {"top_gap": float("inf"), "protect_ends": "off", **kw}
    return make_engine(ver, dft, temp=temp, top_k=top_k, **kw)


def first_position_dists(ver_path, dft_path, sampling):
    """Warped verifier and draft distributions q, p (float32 [V]) after PROMPT."""
    out = []
    for path in (ver_path, dft_path):
        with Context.load(path, context_options=CTX) as m:
            toks = m.model.tokenize(PROMPT)
            row = np.array(m.decode(toks, 1)[0])
            out.append(NativeSampler(m.n_vocab, sampling, AcceptanceParams(), 0).warp(row))
    return out


def first_token_histogram(dec, n_runs, V):
    """How often each token was the first one emitted after PROMPT, over seeds 0 .. n_runs-1."""
    counts = np.zeros(V, np.int64)
    for seed in range(n_runs):
        res = dec.generate(PROMPT, n_predict=2, seed=seed)
        counts[res.tokens[0] if res.tokens else dec.verifier.model.eos] += 1
    return counts
