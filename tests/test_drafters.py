"""Drafters (model, n-gram prompt lookup), adaptive draft length, and the KL each rule pays.

Statistical tests: Pearson chi-square, alpha = 0.001, fixed seeds (deterministic).
"""
from __future__ import annotations

import numpy as np
import pytest

from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams
from cactus_gguf.sampling import reference
from cactus_gguf.speculative import FixedDraftLength, NgramDrafter

from support.harness import make_engine
from support.stats import (ALPHA, chisquare_pvalue, decoder, first_position_dists,
                           first_token_histogram)

SAMPLING = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
WARPS = dict(temp=1.0, top_k=8, top_p=1.0, min_p=0.0)


def test_ngram_lookup_proposes_what_followed_the_latest_match():
    d = NgramDrafter(n_max=3, n_min=1)
    history = [5, 6, 7, 8, 9, 1, 6, 7, 8, 2, 3, 6, 7]
    # longest suffix found earlier: [6, 7] at index 6 (the latest), followed by 8, 2, 3, 6
    # ([7] alone would also match, but the longer n-gram wins)
    plan = FixedDraftLength(4).plan(4)
    draft = d.propose(history, plan, None)
    assert draft.tokens.tolist() == [8, 2, 3, 6] and draft.tokens.dtype == np.int32
    assert draft.sources == ("ngram",) * 4 and draft.lookup
    assert draft.probs is None and draft.p is None and draft.n_forwards == 0  # p one-hot
    assert len(d.propose([1, 2, 3], plan, None)) == 0  # no earlier occurrence
    draft = d.propose([4, 4, 4], plan, None)  # [4, 4] at 0 is followed by one token
    assert draft.tokens.tolist() == [4]
    assert draft.prefix(0).tokens.tolist() == [] and not draft.prefix(0).lookup


@pytest.mark.parametrize("method,delta", [("sps", 0.0), ("cactus", 1.0), ("topk", 0.0)])
def test_ngram_drafter_first_token_distribution(tiny_pair, method, delta):
    """With a deterministic drafter p is one-hot at the drafted token n: Cactus accepts with h[n]."""
    ver, _ = tiny_pair
    prompt = "the cat sat on the mat the cat sat on"
    with make_engine(ver, k=1, drafter="ngram", method=method, delta=delta, **WARPS) as dec:
        ids = dec.tokenize(prompt)
        probe = NgramDrafter(3, 1).propose(ids, FixedDraftLength(1).plan(1), None)
        assert len(probe) == 1
        drafted = int(probe.tokens[0])
        row = np.array(dec.verifier.decode(ids, 1)[0])
        q = NativeSampler(dec.verifier.n_vocab, SAMPLING, AcceptanceParams(), 0).warp(row)
        counts = np.zeros(len(q), np.int64)
        for seed in range(4000):
            res = dec.generate(prompt, n_predict=2, seed=seed)
            assert res.stats.n_drafted == 1
            counts[res.tokens[0] if res.tokens else dec.verifier.model.eos] += 1
    expected = reference.emitted_first_token_distribution(None, q, method, delta=delta,
                                                          drafted=drafted)
    assert chisquare_pvalue(counts, expected) > ALPHA


def test_draft_p_min_and_draft_min_shorten_or_drop_drafts(tiny_pair):
    ver, dft = tiny_pair

    def stats(**kw):
        with make_engine(ver, dft, k=4, **WARPS) as dec:
            return dec.generate("the cat sat on", n_predict=60, seed=1, **kw).stats

    full = stats()
    assert full.mean_drafted_length > 3.0
    assert stats(draft_p_min=1.0).n_drafted == 0  # no warped p is one-hot at temperature 1
    some = stats(draft_p_min=0.5)
    assert 0 < some.mean_drafted_length < full.mean_drafted_length
    dropped = stats(draft_p_min=0.5, draft_min=4)
    assert dropped.n_drafted % 4 == 0 and dropped.n_drafted < some.n_drafted


@pytest.mark.parametrize("delta", [0.1, 0.5, 2.0])
def test_exact_solver_never_exceeds_the_budget_and_sps_pays_nothing(tiny_pair, delta):
    ver, dft = tiny_pair
    for method, solver in (("cactus", "exact"), ("cactus", "taylor"), ("sps", "taylor")):
        with make_engine(ver, dft, k=4, temp=1.0, method=method, delta=delta,
                         solver=solver) as dec:
            s = dec.generate("the cat sat on", n_predict=100, seed=2).stats
        assert s.n_evaluated > 20
        if method == "sps":
            assert s.kl_max == 0.0 and s.kl_mean == 0.0
        elif solver == "exact":
            assert 0.0 < s.kl_max <= delta * (1 + 1e-9)
        else:
            assert s.kl_max > 0.0


def test_typical_acceptance_distribution_with_a_matching_draft(tiny_pair):
    """Draft = verifier (p = q): typical keeps each drafted n with q[n] above the threshold and
    sends the rest of the mass to the verifier's argmax, so more than one token carries mass."""
    ver, _ = tiny_pair
    q, p = first_position_dists(ver, ver, SAMPLING)
    expected = reference.emitted_first_token_distribution(p, q, "typical")
    assert (expected > 0).sum() >= 2
    with decoder(ver, ver, k=1, method="typical") as dec:
        counts = first_token_histogram(dec, 4000, len(q))
    assert chisquare_pvalue(counts, expected) > ALPHA
    assert chisquare_pvalue(counts, q.astype(np.float64), strict=False) < ALPHA


@pytest.mark.parametrize("prompt,lookup", [
    ("the cat sat on the mat the cat sat on", True),   # "cat sat on" occurred: lookup drafts
    ("a quick brown fox jumps", False),                # no 3-token repeat: the model drafts
])
def test_hybrid_drafter_first_token_follows_the_verifier(tiny_pair, prompt, lookup):
    """SpS with the hybrid drafter emits q whichever drafter proposed (chi-square, alpha 0.001):
    lookup on a full --ngram-max match, the draft model otherwise (n_lookup_steps says which)."""
    ver, dft = tiny_pair
    with make_engine(ver, dft, k=1, drafter="hybrid", method="sps", **WARPS) as dec:
        ids = dec.tokenize(prompt)
        row = np.array(dec.verifier.decode(ids, 1)[0])
        q = NativeSampler(dec.verifier.n_vocab, SAMPLING, AcceptanceParams(), 0).warp(row)
        counts = np.zeros(len(q), np.int64)
        for seed in range(4000):
            res = dec.generate(prompt, n_predict=2, seed=seed)
            assert res.stats.n_lookup_steps == (1 if lookup else 0)
            assert res.stats.n_drafted == 1
            counts[res.tokens[0] if res.tokens else dec.verifier.model.eos] += 1
    assert chisquare_pvalue(counts, q.astype(np.float64) / q.sum()) > ALPHA


def test_hybrid_drafter_greedy_equals_the_verifier_and_uses_both(tiny_pair):
    """At temperature 0 the output is the verifier's, token for token, while some steps draft
    from the history and others from the draft model (the model's cache catches up after
    lookup steps)."""
    ver, dft = tiny_pair
    prompt = "the cat sat on the mat and the dog sat on the cat the cat sat on"
    with make_engine(ver, method="none", temp=0.0) as alone:
        expected = alone.generate(prompt, n_predict=60, seed=1).tokens
    with make_engine(ver, dft, k=4, drafter="hybrid", method="cactus", temp=0.0) as dec:
        res = dec.generate(prompt, n_predict=60, seed=1)
    assert res.tokens == expected
    assert 0 < res.stats.n_lookup_steps < res.stats.n_steps


@pytest.mark.parametrize("window", [1, 5, 1000])
def test_draft_window_prefills_the_last_tokens_only_and_keeps_greedy_exact(tiny_pair, window):
    """--draft-window W: the draft's cache holds the prompt's last W tokens (but the last, which
    opens the first step), never more, and then follows the committed tokens; at temperature 0
    the output is still the verifier's, through rejections and rollbacks, on a second request
    reusing the draft's cache too."""
    ver, dft = tiny_pair
    prompt = "the cat sat on the mat and the dog sat on the cat while the bird sang"
    with make_engine(ver, method="none", temp=0.0) as alone:
        expected = alone.generate(prompt, n_predict=40, seed=1).tokens
    with make_engine(ver, dft, k=3, method="sps", temp=0.0, draft_window=window) as dec:
        n_prompt = len(dec.tokenize(prompt))
        for _ in range(2):
            res = dec.generate(prompt, n_predict=40, seed=1)
            assert res.tokens == expected
            assert res.stats.n_drafted > res.stats.n_accepted  # rejections: rollbacks happened
            held = dec.draft.tokens
            assert held[:min(window, n_prompt - 1)] == dec.tokenize(prompt)[
                max(0, n_prompt - 1 - window):n_prompt - 1]
            assert len(held) <= min(window, n_prompt - 1) + len(res.tokens) + 3
