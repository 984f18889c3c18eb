"""The divergence of what is emitted: the exact law P of the token a draft position emits, its
KL(P || q), and the output budget that bounds it (native/law.c; docs/maths.md, "The output budget").

p = draft distribution, q = verifier distribution (both warped), V = vocabulary size. The NumPy
reference (cactus_gguf.sampling.reference) sums the mixture over every drafted n directly, so it
shares no code with the C's sorted sums.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from cactus_gguf.options import LoadOptions, Request
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams
from cactus_gguf.sampling import reference as ref
from cactus_gguf.speculative import Engine

ALPHA = 0.001  # significance level of the chi-square tests
FLAT = SamplingParams(1.0, 0, 1.0, 0.0)  # no warp: the rows given are p and q


def law_of(acc: AcceptanceParams, p, q, token=None):
    return NativeSampler(q.size, FLAT, acc, 0).emitted_law(p, q, token=token)


def dyadic(x):
    """x (sums to 1) rounded to multiples of 2^-22, its largest entry absorbing the rounding: a
    float32 row whose sum is exactly 1, so the C and the reference see the same distribution."""
    d = np.round(x * 2**22) / 2**22
    d[np.argmax(d)] += 1.0 - d.sum()
    return d.astype(np.float32)


def random_pair(rng, V, zeros=True):
    """A (p, q) pair of float32 rows summing exactly to 1; with ``zeros`` some tokens only one of
    them supports."""
    p = rng.dirichlet(np.full(V, 0.4))
    q = rng.dirichlet(np.full(V, 0.4))
    if zeros:
        p[rng.integers(V)] = 0.0
        q[rng.integers(V)] = 0.0
    return dyadic(p / p.sum()), dyadic(q / q.sum())


def reference_law(acc, p, q, token=None):
    return ref.emitted_first_token_distribution(
        None if p is None else p.astype(np.float64), q.astype(np.float64), acc.method, acc.delta,
        acc.solver, acc.typical_epsilon, acc.typical_alpha, acc.accept_top_k, drafted=token)


RULES = [AcceptanceParams("cactus", 0.3, "taylor"), AcceptanceParams("cactus", 0.1, "exact"),
         AcceptanceParams("cactus", 2.0, "exact"), AcceptanceParams("cactus", 0.0),
         AcceptanceParams("sps"), AcceptanceParams("greedy"),
         AcceptanceParams("typical", typical_alpha=0.9), AcceptanceParams("topk", accept_top_k=3)]


@pytest.mark.parametrize("acc", RULES, ids=lambda a: f"{a.method}-{a.solver}-{a.delta}")
@pytest.mark.parametrize("V", [5, 12, 50])
def test_law_and_its_kl_equal_the_direct_mixture(acc, V):
    rng = np.random.default_rng(V)
    for _ in range(40):
        p, q = random_pair(rng, V)
        law = law_of(acc, p, q)
        expected = reference_law(acc, p, q)
        np.testing.assert_allclose(law.probs, expected, atol=1e-12, rtol=0)
        assert law.kl == pytest.approx(ref.kl(expected, q), abs=1e-12)
        a = np.minimum(p.astype(np.float64), q.astype(np.float64)).sum()
        if acc.method == "sps" or acc.delta == 0.0 and acc.method == "cactus":
            assert law.kl == pytest.approx(0.0, abs=1e-12)
            assert law.acceptance == pytest.approx(a, abs=1e-12)
        assert law.probs[q == 0].max() == 0.0  # nothing the verifier excludes is ever emitted


def test_deterministic_drafter_law_is_the_target_itself():
    """p one-hot at n (n-gram drafts): P = h_n, so KL(P || q) = KL(h_n || q) <= delta."""
    rng = np.random.default_rng(3)
    for _ in range(20):
        _, q = random_pair(rng, 9, zeros=False)
        n = int(rng.integers(9))
        acc = AcceptanceParams("cactus", 0.4, "exact")
        law = law_of(acc, None, q, token=n)
        h = ref.target(q.astype(np.float64), n, "cactus", 0.4, "exact")
        np.testing.assert_allclose(law.probs, h, atol=1e-7)
        assert law.kl <= 0.4 + 1e-9


# The per-target budget's divergence, measured: a hand-made pair where KL(P || q) is well above
# delta (the draft puts half its mass where q puts 0.1, and Cactus lets nearly all of it through).
P5 = np.array([0.5, 0.2, 0.1, 0.1, 0.1], np.float32)
Q5 = np.array([0.1, 0.1, 0.2, 0.3, 0.3], np.float32)


def test_target_budget_emits_more_divergence_than_delta():
    kl = {d: law_of(AcceptanceParams("cactus", d, "exact"), P5, Q5).kl for d in (0.1, 0.5)}
    assert kl[0.1] == pytest.approx(0.17094, abs=1e-4)  # 1.7 x the budget
    assert kl[0.5] == pytest.approx(0.64115, abs=1e-4)
    assert kl[0.1] > 0.1 and kl[0.5] > 0.5


def emitted_histogram(acc, p, q, n, seed):
    """First emitted token of n independent k = 1 steps, the draft drawn from p."""
    V = q.size
    s = NativeSampler(V, FLAT, acc, seed)
    vl = np.log(np.vstack([q, q]).astype(np.float64)).astype(np.float32)
    draws = np.random.default_rng(seed).choice(V, size=n, p=p.astype(np.float64) / p.sum())
    tokens = [np.array([t], np.int32) for t in range(V)]
    counts = np.zeros(V, np.int64)
    for t in draws:
        r = s.verify(p.reshape(1, V), tokens[t], vl)
        counts[t if r.n_accepted == 1 else r.next_token] += 1
    return counts


@pytest.mark.parametrize("budget", ["target", "output"])
def test_the_computed_law_is_what_verify_emits(budget):
    """Monte Carlo: 100,000 steps; the emitted tokens' histogram against the C law (chi-square at
    ALPHA); the law is also far (statistic > 200) from q and p, so a wrong law would fail."""
    acc = AcceptanceParams("cactus", 0.1, "exact", budget=budget)
    s = NativeSampler(5, FLAT, acc, 0)
    q = s.warp(np.log(Q5.astype(np.float64)).astype(np.float32))  # q as verify sees it
    law = s.emitted_law(P5, q)
    n = 100_000
    counts = emitted_histogram(acc, P5, q, n, seed=11)
    assert stats.chisquare(counts, law.probs / law.probs.sum() * n).pvalue > ALPHA
    for other in (q.astype(np.float64), P5.astype(np.float64)):
        assert n * ((law.probs - other) ** 2 / other).sum() > 200


def test_output_budget_bounds_the_emitted_kl_and_never_accepts_less_than_sps():
    rng = np.random.default_rng(7)
    n_bound = 0
    for trial in range(150):
        p, q = random_pair(rng, int(rng.integers(5, 40)), zeros=trial % 2 == 0)
        sps = float(np.minimum(p.astype(np.float64), q.astype(np.float64)).sum())
        for delta in (0.01, 0.1, 0.5, 1.0):
            for solver in ("taylor", "exact"):
                out = law_of(AcceptanceParams("cactus", delta, solver, budget="output"), p, q)
                tgt = law_of(AcceptanceParams("cactus", delta, solver), p, q)
                assert out.kl <= delta + 1e-12
                assert out.acceptance >= sps - 1e-12
                assert 0.0 <= out.delta <= delta
                assert out.acceptance <= tgt.acceptance + 1e-12  # it only ever gives up acceptance
                if tgt.kl <= delta:  # nothing to bound: the paper's rule itself
                    assert out.delta == delta and out.acceptance == tgt.acceptance
                else:
                    n_bound += 1
                    # the same delta' as the rule's reference (bisection on the direct mixture)
                    expect = ref.output_budget_delta(p.astype(np.float64), q.astype(np.float64),
                                                     delta, solver)
                    assert out.delta == pytest.approx(expect, abs=delta * 2**-18)
                    # and tight: the bound is reached to within the bisection's resolution
                    assert out.kl > delta * 0.9
    assert n_bound > 300  # the bound was active in most cases, so it was tested


def test_output_budget_at_delta_zero_is_sps_exactly():
    rng = np.random.default_rng(1)
    p, q = random_pair(rng, 20)
    vl = np.log(np.vstack([q] * 3).astype(np.float64) + 1e-30).astype(np.float32)
    accept = np.where(p > 0, np.minimum(1.0, q / np.maximum(p, 1e-30)), 1.0)
    toks = np.argsort(np.abs(accept - 0.5))[:2].astype(np.int32)  # drafts accepted half the time
    dp = np.vstack([p, p])
    outcomes = set()
    for seed in range(20):
        a = NativeSampler(20, FLAT, AcceptanceParams("cactus", 0.0, budget="output"), seed)
        b = NativeSampler(20, FLAT, AcceptanceParams("sps"), seed)
        ra, rb = a.verify(dp, toks, vl), b.verify(dp, toks, vl)
        assert (ra.n_accepted, ra.next_token, ra.n_evaluated) == (rb.n_accepted, rb.next_token,
                                                                  rb.n_evaluated)
        assert ra.output_kl_sum == pytest.approx(0.0, abs=1e-6)  # q warped: sums to 1 +- 1e-7
        outcomes.add(ra.n_accepted)
    assert len(outcomes) > 1  # both rejections and acceptances were compared


def test_verify_reports_the_law_of_each_evaluated_position():
    """k = 1: output_kl_sum is the position's KL(P || q); the target KL is the binary KL of its
    gamma; with the output budget the target used is delta' and its KL at most delta'."""
    acc_t = AcceptanceParams("cactus", 0.1, "exact")
    acc_o = AcceptanceParams("cactus", 0.1, "exact", budget="output")
    for acc in (acc_t, acc_o):
        s = NativeSampler(5, FLAT, acc, 0)
        q = s.warp(np.log(Q5.astype(np.float64)).astype(np.float32))
        law = s.emitted_law(P5, q)
        vl = np.log(np.vstack([Q5, Q5]).astype(np.float64)).astype(np.float32)
        r = s.verify(P5.reshape(1, 5), np.array([0], np.int32), vl)
        assert r.n_evaluated == 1
        assert r.output_kl_sum == pytest.approx(law.kl, abs=1e-15) and r.output_kl_max == r.output_kl_sum
        assert r.delta_sum == pytest.approx(law.delta, abs=1e-15)
        assert r.kl_sum <= law.delta + 1e-12
    assert law.delta < 0.1  # the output budget had to lower the per-draft budget here
    off = NativeSampler(5, FLAT, AcceptanceParams("cactus", 0.1, "exact", output_kl=False), 0)
    r = off.verify(P5.reshape(1, 5), np.array([0], np.int32), vl)
    assert r.output_kl_sum == 0.0 and r.output_kl_max == 0.0


def test_bad_rows_are_refused():
    s = NativeSampler(5, FLAT, AcceptanceParams("cactus", 0.1), 0)
    with pytest.raises(ValueError, match="token"):
        s.emitted_law(None, Q5)
    with pytest.raises(ValueError, match="float32"):
        s.emitted_law(P5.astype(np.float64), Q5)
    from cactus_gguf.sampling import BadDistributionError
    with pytest.raises(BadDistributionError):
        s.emitted_law(P5, np.array([0.5, -0.1, 0.2, 0.2, 0.2], np.float32))


# -- the real pair --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real(qwen_pair):
    ver, dft = qwen_pair
    with Engine(ver, dft, LoadOptions(n_ctx=1024),
                defaults=Request(k=4, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                 top_gap=float("inf"), protect_ends="off")) as eng:  # paper's
        yield eng


def test_real_pair_reports_output_kl_and_the_output_budget_bounds_it(real):
    prompt = "Once upon a time, in a land far away, there lived a"
    target = real.generate(prompt, n_predict=24, seed=3, delta=0.1).stats
    output = real.generate(prompt, n_predict=24, seed=3, delta=0.1, budget="output").stats
    assert target.output_kl_max > 0.1  # untruncated T = 1: the emitted law overshoots delta
    assert output.output_kl_max <= 0.1 + 1e-9
    assert 0.0 < output.delta_mean < 0.1 and target.delta_mean == pytest.approx(0.1)
    assert target.output_kl_mean == pytest.approx(
        target.output_kl_sum / (target.n_accepted + target.n_steps))
    assert math.isfinite(output.output_kl_sum)
    # each draft's target stays within its δ' <= δ too, exactly so with the exact solver (Taylor's
    # γ can overshoot its δ' where γ > 0.5: seen at 0.167 on an AVX2-only EPYC)
    exact = real.generate(prompt, n_predict=24, seed=3, delta=0.1, budget="output",
                          solver="exact").stats
    assert exact.output_kl_max <= 0.1 + 1e-9 and exact.kl_max <= 0.1 + 1e-9
