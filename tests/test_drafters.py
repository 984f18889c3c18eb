"""Drafters (model, n-gram prompt lookup), adaptive draft length, and the KL each rule pays.

Statistical tests: Pearson chi-square, alpha = 0.001, fixed seeds (deterministic).
"""
from __future__ import annotations

import numpy as np
import pytest

from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams
from cactus_gguf.sampling import reference
from cactus_gguf.speculative import FixedDraftLength, NgramDrafter

from support.harness import assert_one_line_error, make_engine, run_cli
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


# ------------------------------------------------------------------------------------------------
# Synthetic acceptance (llama-server's --spec-synth-rates / --spec-synth-len, benchmarking only)
# ------------------------------------------------------------------------------------------------

def test_synthetic_rates_resolve_as_llama_server():
    from cactus_gguf.speculative.drafters import SynthDrafter, synth_rates

    assert synth_rates(None, None, 4) == ()
    assert synth_rates("0.75,0.5625", None, 2) == (0.75, 0.5625)
    assert synth_rates(None, 5.0, 4) == (1.0, 1.0, 1.0, 1.0)  # L = k + 1: every draft
    assert synth_rates(None, 1.0, 3) == (0.0, 0.0, 0.0)  # L = 1: none
    p = (np.sqrt(8.0) - 1.0) / 2.0  # p + p^2 = 1.75: L = 2.75 over two positions
    assert synth_rates(None, 2.75, 2) == pytest.approx((p, p * p), abs=1e-12)
    d = SynthDrafter(NgramDrafter(3, 1), (0.5, 0.25, 0.0), seed=1)
    assert d.conditional == (0.5, 0.5, 0.0)  # c_i = r_i / r_{i-1}; 0 once a rate is 0


def test_synthetic_acceptance_checks_its_values_before_loading(tmp_path):
    from cactus_gguf.errors import InputError
    from cactus_gguf.options import Request

    assert Request(k=2, spec_synth_rates=[0.75, 0.5]).spec_synth_rates == "0.75,0.5"
    for kw, words in [(dict(k=2, spec_synth_rates="0.5,0.7"), "must not increase"),
                      (dict(k=2, spec_synth_rates="0.5,x"), "comma-separated numbers"),
                      (dict(k=2, spec_synth_rates="1.5,1"), "within [0, 1]"),
                      (dict(k=3, spec_synth_rates="0.5,0.5"), "k=3 of them, got 2"),
                      (dict(k="auto", k_max=2, spec_synth_rates="1"), "k_max=2 of them, got 1"),
                      (dict(k=2, spec_synth_len=3.5), "must be in [1, 3]"),
                      (dict(k=2, spec_synth_len=0.5), "must be >= 1"),
                      (dict(k=1, spec_synth_len=2.0, spec_synth_rates="1"), "not both")]:
        with pytest.raises(InputError, match=None) as e:
            Request(**kw)
        assert words in str(e.value), (kw, str(e.value))
    r = run_cli("run", str(tmp_path / "absent.gguf"), "-p", "x", "-k", "2",
                "--spec-synth-rates", "0.5,0.9")
    assert_one_line_error(r, "--spec-synth-rates", "must not increase")


@pytest.mark.parametrize("method", ["greedy", "sps", "cactus"])
def test_synthetic_rates_zero_refuse_every_draft_and_give_the_verifier_alone(tiny_pair, method):
    """The drafts draw from their own stream (as under --method greedy: docs/behaviour.md "Same
    seed with or without a draft"), so refusing every draft leaves the verifier alone's tokens."""
    ver, dft = tiny_pair
    prompt = "the cat sat on"
    with make_engine(ver, method="none", **WARPS) as alone:
        want = alone.generate(prompt, n_predict=24, seed=7).tokens
    with make_engine(ver, dft, k=3, method=method, spec_synth_rates="0,0,0", **WARPS) as dec:
        res = dec.generate(prompt, n_predict=24, seed=7)
    assert res.tokens == want  # one uniform of the verifier's stream per token, as the verifier
    assert res.stats.n_drafted > 0 and res.stats.n_accepted == 0


def test_synthetic_rates_one_accept_every_draft_deterministically(tiny_pair):
    ver, dft = tiny_pair
    runs = []
    with make_engine(ver, dft, k=4, method="greedy", temp=0.0,
                     spec_synth_rates="1,1,1,1") as dec:
        for _ in range(2):
            res = dec.generate("the cat sat on", n_predict=32, seed=3)
            runs.append((res.tokens, res.stats.n_drafted, res.stats.n_accepted))
    tokens, n_drafted, n_accepted = runs[0]
    assert runs[1] == runs[0]  # same seed, same coins
    assert n_drafted > 0 and n_accepted == n_drafted  # whatever the verifier says
    with make_engine(ver, dft, k=4, method="greedy", temp=0.0) as dec:
        real = dec.generate("the cat sat on", n_predict=32, seed=3)
    assert real.stats.n_accepted < real.stats.n_drafted  # the noisy draft is refused sometimes


def test_synthetic_rates_deterministic_per_seed(tiny_pair):
    ver, dft = tiny_pair
    rates = ",".join(repr(0.75 ** (i + 1)) for i in range(4))
    with make_engine(ver, dft, k=4, method="greedy", spec_synth_rates=rates, **WARPS) as dec:
        a, b = (dec.generate("the cat sat on", n_predict=32, seed=11) for _ in range(2))
    assert (a.tokens, a.stats.n_drafted, a.stats.n_accepted) == (
        b.tokens, b.stats.n_drafted, b.stats.n_accepted)
    assert 0 < a.stats.n_accepted < a.stats.n_drafted
