"""The rules that keep the verifier's answers: EARS, Cactus relaxed only near the verifier's top
(``top_gap``) and protected ends (``end_tau`` with an end set), in the native helper.

Each is checked three ways: decisions of cg_verify equal the NumPy reference's (sampling/reference.py)
uniform for uniform; the exact law cg_emitted_law computes equals the reference's direct mixture
sum; and a Monte-Carlo histogram of emitted tokens passes a chi-square test against that law
(significance ALPHA = 0.001 per test) while the law it would be confused with fails.
"""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from scipy import stats

from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams
from cactus_gguf.sampling import reference as ref
from cactus_gguf.sampling.native import pack_allowed

ALPHA = 1e-3
FLAT = SamplingParams(1.0, 0, 1.0, 0.0)
SP_DICT = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
# p and q of tests/test_native.py's Monte-Carlo: Cactus rejects often, so residuals matter
P_DRAFT = np.array([0.09, 0.05, 0.07, 0.06, 0.13, 0.07, 0.51, 0.02])
Q_VERIFIER = np.array([0.12, 0.08, 0.07, 0.14, 0.18, 0.24, 0.07, 0.10])
END = np.array([False, False, False, False, False, True, False, True])  # q(E) = 0.34


def _acc(kind: str, end: np.ndarray = END) -> AcceptanceParams:
    return {"ears": AcceptanceParams("ears", ears_alpha=0.7),
            "gap": AcceptanceParams("cactus", 1.0, top_gap=0.5),
            "ends": AcceptanceParams("cactus", 1.0, end_tau=0.2, end_mask=pack_allowed(end)),
            "gap+ends": AcceptanceParams("cactus", 1.0, top_gap=0.5, end_tau=0.0,
                                         end_mask=pack_allowed(end))}[kind]


def _ref_kwargs(acc: AcceptanceParams, end: np.ndarray) -> dict:
    kw = dict(ears_alpha=acc.ears_alpha, top_gap=acc.top_gap)
    if acc.end_mask is not None:
        kw.update(end_set=end, end_tau=acc.end_tau)
    return kw


def _warped(x: np.ndarray) -> np.ndarray:
    return NativeSampler(x.size, FLAT, AcceptanceParams(), 0).warp(np.log(x).astype(np.float32))


KINDS = ["ears", "gap", "ends", "gap+ends"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_c_law_equals_the_reference_mixture(kind):
    rng = np.random.default_rng(abs(hash(kind)) % 2**32)
    V = 9
    for _ in range(200):
        q = _warped(rng.dirichlet(np.full(V, 0.5)))
        p = _warped(rng.dirichlet(np.full(V, 0.5)))
        end = rng.random(V) < 0.3
        acc = _acc(kind, end)
        law = NativeSampler(V, FLAT, acc, 0).emitted_law(p, q)
        want = ref.emitted_first_token_distribution(p, q, acc.method, acc.delta, acc.solver,
                                                    **_ref_kwargs(acc, end))
        np.testing.assert_allclose(law.probs, want, atol=1e-6)
        assert law.probs.sum() == pytest.approx(1.0, abs=1e-6)  # q, p are float32 rows


@pytest.mark.parametrize("kind", KINDS)
def test_verify_decides_as_the_reference_uniform_for_uniform(kind):
    rng = np.random.default_rng(7 + KINDS.index(kind))
    outcomes = set()
    for case in range(150):
        V, k = int(rng.choice([5, 17, 40])), int(rng.integers(1, 6))
        end = rng.random(V) < 0.2
        acc = _acc(kind, end)
        vl = (rng.standard_normal((k + 1, V)) * 2).astype(np.float32)
        dl = (vl[:k] * rng.uniform(0, 1.5) + rng.standard_normal((k, V))).astype(np.float32)
        seed = int(rng.integers(0, 2**63))
        drafter = NativeSampler(V, FLAT, acc, seed ^ 1)
        probs = np.zeros((k, V), np.float32)
        toks = np.array([drafter.draft(dl[i], probs[i]) for i in range(k)], np.int32)
        if case % 4 == 0:  # a deterministic drafter
            probs = None
        s = NativeSampler(V, FLAT, acc, seed)
        stream = s.peek_uniforms(2 * k + 2)
        got = s.verify(probs, toks, vl)
        want = ref.verify(probs, toks, vl, SP_DICT, acc.method, acc.delta, acc.solver,
                          uniforms=iter(stream), **_ref_kwargs(acc, end))
        assert (got.n_accepted, got.next_token, got.n_evaluated) == (
            want.n_accepted, want.next_token, want.n_evaluated)
        assert got.kl_sum == pytest.approx(want.kl_sum, rel=1e-5, abs=1e-6)
        assert s.peek_uniforms(1)[0] == stream[want.n_uniforms]
        outcomes.add(got.n_accepted == k)
    assert outcomes == {True, False}


# a draft that favours a token near the verifier's top (0) and one far below it (6)
P_TWO = np.array([0.30, 0.05, 0.07, 0.06, 0.05, 0.02, 0.43, 0.02])


def _histogram(acc: AcceptanceParams, p_draft: np.ndarray, n: int = 200_000, seed: int = 3
               ) -> np.ndarray:
    """Counts of the first emitted token over n steps with k = 1 (drafts drawn from p)."""
    V = p_draft.size
    s = NativeSampler(V, FLAT, acc, seed)
    vl = np.log(np.vstack([Q_VERIFIER, Q_VERIFIER])).astype(np.float32)
    dp = _warped(p_draft).reshape(1, V)
    tokens = [np.array([t], np.int32) for t in range(V)]
    counts = np.zeros(V, np.int64)
    for t in np.random.default_rng(seed).choice(V, size=n, p=dp[0] / dp[0].sum()):
        r = s.verify(dp, tokens[t], vl)
        counts[t if r.n_accepted == 1 else r.next_token] += 1
    return counts


def _pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    law = law / law.sum()
    assert counts[law == 0].sum() == 0, "a token outside the law's support was emitted"
    on = law > 0
    return stats.chisquare(counts[on], law[on] * counts.sum()).pvalue


@pytest.mark.parametrize("kind, p_draft, end", [
    ("ears", P_DRAFT, END), ("gap", P_TWO, END),
    ("ends", P_TWO, END),                       # the draft would lower q(E) = 0.34: SpS there
    ("ends", P_TWO, np.eye(8, dtype=bool)[0]),  # the draft favours the end token: Cactus kept
    ("gap+ends", P_TWO, END)], ids=["ears", "gap", "ends-fallback", "ends-kept", "gap+ends"])
def test_monte_carlo_emitted_token_follows_the_exact_law(kind, p_draft, end):
    acc = _acc(kind, end)
    p, q = _warped(p_draft), _warped(Q_VERIFIER)
    law = NativeSampler(8, FLAT, acc, 0).emitted_law(p, q).probs
    counts = _histogram(acc, p_draft)
    assert _pvalue(counts, law) > ALPHA
    # power: each law it could be confused with (q, plain Cactus) that differs from it by a
    # chi-square statistic over 100 at this sample size is rejected by the histogram
    plain = NativeSampler(8, FLAT, AcceptanceParams("cactus", 1.0), 0).emitted_law(p, q).probs
    n = counts.sum()
    rivals = [other for other in (q.astype(np.float64), plain)
              if n * ((law - other) ** 2 / other).sum() > 100]
    assert rivals, "the case cannot tell the rule from q or plain Cactus"
    for other in rivals:
        assert _pvalue(counts, other) < ALPHA


def test_protected_ends_never_lower_the_chance_of_ending():
    """Where q(E) >= end_tau the emitted law keeps P(E) >= q(E); plain Cactus often lowers it."""
    rng = np.random.default_rng(11)
    V, lowered = 12, 0
    for _ in range(300):
        q = _warped(rng.dirichlet(np.full(V, 0.4)))
        p = _warped(rng.dirichlet(np.full(V, 0.4)))
        end = rng.random(V) < 0.25
        q_end = float(q[end].sum())
        acc = AcceptanceParams("cactus", 1.0, end_tau=0.1, end_mask=pack_allowed(end))
        law = NativeSampler(V, FLAT, acc, 0).emitted_law(p, q)
        plain = NativeSampler(V, FLAT, AcceptanceParams("cactus", 1.0), 0).emitted_law(p, q)
        if q_end >= 0.1:
            assert law.probs[end].sum() >= q_end - 1e-6
            lowered += plain.probs[end].sum() < q_end - 1e-3
            assert law.delta in (0.0, 1.0)  # kept, or SpS at that position
        else:  # unprotected: exactly plain Cactus
            np.testing.assert_array_equal(law.probs, plain.probs)
    assert lowered > 30  # the guard had something to guard against


def test_ears_at_alpha_zero_is_sps_and_never_accepts_what_the_verifier_excludes():
    p, q = _warped(P_DRAFT), _warped(Q_VERIFIER)
    law = NativeSampler(8, FLAT, AcceptanceParams("ears", ears_alpha=0.0), 0).emitted_law(p, q)
    np.testing.assert_allclose(law.probs, q, atol=1e-7)
    assert law.kl == pytest.approx(0.0, abs=1e-7)  # float32 rows: q sums to 1 within 1e-7
    # q excludes tokens 6 and 7 (top-k 6): a large alpha still never emits them
    cut = SamplingParams(1.0, 6, 1.0, 0.0)
    s = NativeSampler(8, cut, AcceptanceParams("ears", ears_alpha=5.0), 1)
    vl = np.log(np.vstack([Q_VERIFIER, Q_VERIFIER])).astype(np.float32)
    q_cut = s.warp(vl[0])
    assert q_cut[6] == 0 and q_cut[2] == 0  # ties at 0.07 go to the lower id: 2 and 6 are cut
    for t in (2, 6):
        for _ in range(200):
            r = s.verify(None, np.array([t], np.int32), vl)
            assert r.n_accepted == 0 and q_cut[r.next_token] > 0


@pytest.mark.parametrize("alpha", [1e300, sys.float_info.max, math.inf])
def test_ears_at_the_largest_alphas_takes_the_limits_exactly(alpha):
    """alpha (1 - max q) is 0 where q is one-hot, for every alpha (inf x 0 was NaN, and greedy EARS
    at alpha = inf accepted nothing, not even exact matches); elsewhere a huge alpha accepts every
    draft q allows, so what is emitted is p on the support of q plus the residual of the rest."""
    greedy = NativeSampler(8, SamplingParams(0.0, 0, 1.0, 0.0),
                           AcceptanceParams("ears", ears_alpha=alpha), 0)
    vl = np.log(np.vstack([Q_VERIFIER, Q_VERIFIER])).astype(np.float32)
    top = int(np.argmax(Q_VERIFIER))
    p = _warped(P_DRAFT)
    assert greedy.verify(p[None], np.array([top], np.int32), vl).n_accepted == 1
    assert greedy.verify(p[None], np.array([(top + 1) % 8], np.int32), vl).n_accepted == 0
    q = _warped(Q_VERIFIER)
    law = NativeSampler(8, FLAT, AcceptanceParams("ears", ears_alpha=alpha), 0).emitted_law(p, q)
    want = ref.emitted_first_token_distribution(p, q, "ears", ears_alpha=alpha)
    assert np.all(np.isfinite(law.probs)) and law.acceptance == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(law.probs, want, atol=1e-7)
    np.testing.assert_allclose(law.probs, p, atol=1e-7)  # q > 0 everywhere here: P = p


def test_a_top_gap_of_infinity_is_the_papers_cactus_and_zero_relaxes_only_the_top():
    p, q = _warped(P_DRAFT), _warped(Q_VERIFIER)
    plain = NativeSampler(8, FLAT, AcceptanceParams("cactus", 1.0), 0).emitted_law(p, q).probs
    inf = NativeSampler(8, FLAT, AcceptanceParams("cactus", 1.0, top_gap=math.inf), 0)
    np.testing.assert_array_equal(inf.emitted_law(p, q).probs, plain)
    # top_gap 0: only the verifier's argmax (token 5, q = 0.24) is relaxed; every other draft is
    # accepted with SpS's min(1, q/p)
    zero = NativeSampler(8, FLAT, AcceptanceParams("cactus", 1.0, top_gap=0.0), 0)
    acc = zero.emitted_law(p, q).acceptance
    sps_acc = float(np.minimum(p, q).sum())
    gamma5 = min(1.0, q[5] + math.sqrt(2 * 1.0 * q[5] * (1 - q[5])))
    assert acc == pytest.approx(sps_acc - min(p[5], q[5]) + min(p[5], gamma5), abs=1e-6)


def test_the_new_parameters_are_validated():
    with pytest.raises(ValueError, match="ears_alpha"):
        AcceptanceParams("ears", ears_alpha=-1.0)
    with pytest.raises(ValueError, match="top_gap"):
        AcceptanceParams("cactus", top_gap=float("nan"))
    with pytest.raises(ValueError, match="end_mask"):
        AcceptanceParams("cactus", end_tau=0.1, end_mask=np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="ceil"):
        NativeSampler(100, FLAT, AcceptanceParams("cactus", end_tau=0.1,
                                                  end_mask=np.zeros(3, np.uint32)), 0)
