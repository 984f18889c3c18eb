"""Tests of the native sampling helper (native/*.c via cactus_gguf.sampling.native).

Dimension letters: V = vocabulary size, k = draft length. p = draft distribution, q = verifier
distribution, n = drafted token, h = acceptance target (native/cactus_native.h).

Kinds of test, in order: the RNG against a pure-Python xoshiro256**; warps against the NumPy
reference and hand-computed values; the Cactus gamma against hand-computed numbers and the binary-KL
definition; cg_verify token-for-token against the reference fed the same uniforms; delta = 0 equals
SpS; greedy decoding; Monte-Carlo histograms against the analytic emitted-token law; seeds; edges;
the allowed-token mask (exactly a -inf logit, against the reference, errors, and the law SpS emits).
"""
from __future__ import annotations

import ctypes
import itertools
import math
import zlib

import numpy as np
import pytest
from scipy import stats

from cactus_gguf.errors import InputError
from cactus_gguf.sampling import reference as ref
from cactus_gguf.sampling import native
from cactus_gguf.sampling import _clib
from cactus_gguf.sampling import (
    AcceptanceParams,
    BadDistributionError,
    EmptyMaskError,
    NativeArgumentError,
    NativeSampler,
    NonFiniteLogitsError,
    Rng,
    SamplingParams,
    StepResult,
    binary_kl,
    cactus_gamma,
    pack_allowed,
)

ALPHA = 0.001  # significance level of every chi-square test below
METHODS = ["sps", "cactus", "typical", "topk", "greedy", "ears"]


def sampler(V, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, **accept):
    sampling = SamplingParams(temperature, top_k, top_p, min_p)
    return NativeSampler(V, sampling, AcceptanceParams(**accept), seed)


def sp_dict(sp: SamplingParams) -> dict:
    return dict(temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p)


# ---------------------------------------------------------------------------------------------
# RNG
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63 + 7, 2**64 - 1])
def test_rng_matches_python_xoshiro256starstar(seed):
    expected = ref.XoshiroRef(seed)
    got = Rng(seed).uniforms(50)
    assert got.tolist() == [expected.uniform() for _ in range(50)]


def test_rng_seeding_is_splitmix64():
    # splitmix64 of seed 0: first output 0xE220A8397B1DCDAF (Vigna's reference implementation)
    assert Rng(0).state[0] == 0xE220A8397B1DCDAF


def test_rng_uniforms_in_unit_interval_and_copy_is_independent():
    r = Rng(7)
    u = r.uniforms(10000)
    assert u.min() >= 0.0 and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.02
    c = r.copy()
    assert c.uniforms(5).tolist() == r.uniforms(5).tolist()
    c.uniform()
    assert c.state != r.state


def test_rng_rejects_bad_seed():
    with pytest.raises(ValueError, match="seed"):
        Rng(-1)
    with pytest.raises(ValueError, match="seed"):
        Rng(2**64)


# ---------------------------------------------------------------------------------------------
# Warp
# ---------------------------------------------------------------------------------------------


def test_warp_hand_computed_softmax_and_filters():
    l = np.log(np.array([0.5, 0.3, 0.2], dtype=np.float64)).astype(np.float32)
    # plain softmax at T = 1
    np.testing.assert_allclose(sampler(3).warp(l), [0.5, 0.3, 0.2], atol=1e-7)
    # top-k = 2 keeps 0.5, 0.3 -> renormalised
    np.testing.assert_allclose(sampler(3, top_k=2).warp(l), [0.625, 0.375, 0.0], atol=1e-7)
    # top-p = 0.75: cumulative 0.5, 0.8 -> the first two
    np.testing.assert_allclose(sampler(3, top_p=0.75).warp(l), [0.625, 0.375, 0.0], atol=1e-7)
    # top-p = 0.4: the first token alone already reaches it
    np.testing.assert_allclose(sampler(3, top_p=0.4).warp(l), [1.0, 0.0, 0.0], atol=1e-7)
    # min-p = 0.5: keep prob >= 0.25 -> 0.5, 0.3
    np.testing.assert_allclose(sampler(3, min_p=0.5).warp(l), [0.625, 0.375, 0.0], atol=1e-7)
    # temperature 0.5 squares the ratios: 0.25 : 0.09 : 0.04
    np.testing.assert_allclose(sampler(3, temperature=0.5).warp(l), np.array([25, 9, 4]) / 38, atol=1e-7)
    # order is top-k before min-p: top_k=1 leaves only the argmax whatever min_p says
    np.testing.assert_allclose(sampler(3, top_k=1, min_p=0.0).warp(l), [1.0, 0.0, 0.0])


def test_warp_ties_go_to_the_lowest_id():
    l = np.array([1.0, 3.0, 3.0, 3.0, 0.0], dtype=np.float32)
    np.testing.assert_array_equal(sampler(5, temperature=0.0).warp(l), [0, 1, 0, 0, 0])
    np.testing.assert_allclose(sampler(5, top_k=2).warp(l), [0, 0.5, 0.5, 0, 0])
    # -0.0 and +0.0 are the same logit: a tie, so the lower id wins
    z = np.array([-1.0, 0.0, -0.0, -2.0], dtype=np.float32)
    z[1] = -0.0
    z[2] = 0.0
    np.testing.assert_array_equal(sampler(4, temperature=0.0).warp(z), [0, 1, 0, 0])
    np.testing.assert_allclose(sampler(4, top_k=1).warp(z), [0, 1, 0, 0])


def test_warp_matches_reference_on_many_parameter_combinations():
    rng = np.random.default_rng(0)
    combos = itertools.product([0.0, 0.6, 1.0, 1.7], [0, 1, 3, 20], [1.0, 0.95, 0.5], [0.0, 0.05, 0.5])
    for (T, top_k, top_p, min_p), V in itertools.product(combos, [1, 7, 300]):
        s = sampler(V, temperature=T, top_k=top_k, top_p=top_p, min_p=min_p)
        for trial in range(3):
            l = (rng.standard_normal(V) * 3).astype(np.float32)
            if trial == 1:
                l = np.round(l)  # many ties
            if trial == 2 and V > 2:
                l[rng.integers(0, V, V // 3)] = -np.inf
                l[0] = 0.0
            got = s.warp(l)
            want = ref.warp(l, V, T, top_k, top_p, min_p)
            np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"{T=} {top_k=} {top_p=} {min_p=}")
            np.testing.assert_array_equal(got > 0, want > 0)
            assert got.dtype == np.float32 and abs(float(got.sum(dtype=np.float64)) - 1) < 1e-5


def llm_like_logits(rng, V, rows=1):
    """Bulk N(0, 3^2) plus 20 strong tokens near 18: peaked like a language model's row."""
    l = rng.standard_normal((rows, V)) * 3.0
    for r in range(rows):
        head = rng.choice(V, 20, replace=False)
        l[r, head] = 18 + 1.5 * rng.standard_normal(20)
    return l.astype(np.float32)


@pytest.mark.parametrize(
    "params", [(0.6, 20, 0.95, 0.0), (0.6, 0, 1.0, 0.0), (0.6, 0, 0.95, 0.0), (0.8, 40, 0.95, 0.05),
               (1.0, 0, 0.9, 0.01), (1.3, 1000, 1.0, 0.0)]
)
def test_warp_matches_reference_at_qwen_vocab_size(params):
    V = 151936
    rng = np.random.default_rng(1)
    s = sampler(V, temperature=params[0], top_k=params[1], top_p=params[2], min_p=params[3])
    rows = [llm_like_logits(rng, V)[0], (rng.standard_normal(V) * 2.5).astype(np.float32)]
    for l in rows:
        got, want = s.warp(l), ref.warp(l, V, *params)
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_array_equal(got > 0, want > 0)


@pytest.mark.parametrize("top_k", [0, 50])
def test_min_p_boundary_is_exact_to_the_ulp(top_k):
    # logits within a few ulps of l_max + log(min_p): kept iff (double)l - l_max >= log(min_p)
    for min_p in [0.05, 0.1, 1 / 3, 0.5]:
        l_max = np.float32(2.75)
        edge = np.float32(float(l_max) + math.log(ref.f32(min_p)))
        near = [edge]
        for _ in range(4):
            below = np.nextafter(near[0], np.float32(-np.inf))
            above = np.nextafter(near[-1], np.float32(np.inf))
            near = [below, *near, above]
        l = np.array([l_max, *near, -5.0], dtype=np.float32)
        got = sampler(l.size, top_k=top_k, min_p=min_p).warp(l)
        want = ref.warp(l, l.size, 1.0, top_k, 1.0, min_p)
        np.testing.assert_array_equal(got > 0, want > 0)
        assert 0 < (got > 0).sum() < l.size


def test_warp_short_logits_give_zero_tail():
    s = sampler(10, temperature=0.7, top_k=3)
    l = np.array([0.1, 2.0, -1.0, 1.5], dtype=np.float32)
    out = s.warp(l)
    np.testing.assert_allclose(out, ref.warp(l, 10, 0.7, 3, 1.0, 0.0), atol=1e-7)
    assert (out[4:] == 0).all()
    probs = np.full(10, 7.0, dtype=np.float32)
    tok = s.draft(l, probs)
    assert 0 <= tok < 4 and (probs[4:] == 0).all()


def test_warp_infinite_temperature_is_uniform_over_kept_tokens():
    l = np.array([3.0, 1.0, -np.inf, 2.0], dtype=np.float32)
    np.testing.assert_allclose(sampler(4, temperature=math.inf, top_k=2).warp(l), [0.5, 0, 0, 0.5])
    np.testing.assert_allclose(sampler(4, temperature=math.inf).warp(l), [1 / 3, 1 / 3, 0, 1 / 3])


NEGATIVE_NAN = np.array([0xFFC00001], dtype=np.uint32).view(np.float32)[0]  # sign bit set


@pytest.mark.parametrize("bad", [np.nan, NEGATIVE_NAN, np.inf], ids=["nan", "-nan", "inf"])
@pytest.mark.parametrize("V", [5, 1000])
def test_nonfinite_logits_raise(bad, V):
    s = sampler(V, top_k=3)
    l = np.zeros(V, dtype=np.float32)
    l[V - 2] = bad
    with pytest.raises(NonFiniteLogitsError):
        s.warp(l)
    with pytest.raises(NonFiniteLogitsError):
        s.sample(l)
    with pytest.raises(NonFiniteLogitsError):
        s.verify(None, np.zeros(0, np.int32), l.reshape(1, V))
    l[:] = -np.inf
    with pytest.raises(NonFiniteLogitsError):
        s.warp(l)
    l[3] = -5.0  # one finite logit is enough
    np.testing.assert_array_equal(s.warp(l), np.eye(V, dtype=np.float32)[3])


# ---------------------------------------------------------------------------------------------
# Cactus gamma and binary KL
# ---------------------------------------------------------------------------------------------


def test_gamma_taylor_hand_computed():
    assert cactus_gamma(0.5, 0.1) == pytest.approx(0.5 + math.sqrt(0.05), abs=1e-15)  # 0.7236...
    assert cactus_gamma(0.5, 0.1) == pytest.approx(0.7236067977, abs=1e-10)
    assert cactus_gamma(0.1, 0.5) == pytest.approx(0.4, abs=1e-15)  # 0.1 + sqrt(2*0.5*0.1*0.9)
    assert cactus_gamma(0.9, 1.0) == 1.0  # 0.9 + sqrt(0.18) > 1 -> capped


@pytest.mark.parametrize("solver", ["taylor", "exact"])
def test_gamma_edges(solver):
    assert cactus_gamma(0.0, 5.0, solver) == 0.0
    assert cactus_gamma(1.0, 5.0, solver) == 1.0
    for q in [1e-9, 0.3, 0.999999]:
        assert cactus_gamma(q, 0.0, solver) == q  # delta = 0 is SpS exactly
    assert cactus_gamma(0.3, math.inf, solver) == 1.0


def test_gamma_exact_solves_the_binary_kl_budget():
    for q in [1e-6, 1e-3, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.99, 0.999]:
        for delta in [1e-4, 1e-2, 0.1, 0.5, 1.0, 3.0]:
            g = cactus_gamma(q, delta, "exact")
            if -math.log(q) <= delta:
                assert g == 1.0
            else:
                assert q < g < 1.0
                assert binary_kl(g, q) == pytest.approx(delta, abs=1e-9)
                assert g == pytest.approx(ref.gamma_exact(q, delta), abs=1e-12)
            t = cactus_gamma(q, delta, "taylor")
            if t <= 0.5:
                assert g >= t  # the Taylor form under-uses the budget below 0.5


def test_notes_example_taylor_overshoots_exact_does_not():
    t, e = cactus_gamma(0.5, 0.1, "taylor"), cactus_gamma(0.5, 0.1, "exact")
    assert 0.1035 < binary_kl(t, 0.5) < 0.1040  # ~0.104 > delta
    assert binary_kl(e, 0.5) == pytest.approx(0.1, abs=1e-12)
    assert e < t


def test_binary_kl_values():
    assert binary_kl(0.5, 0.5) == 0.0
    assert binary_kl(1.0, 0.25) == pytest.approx(math.log(4))
    assert binary_kl(0.7, 0.0) == math.inf
    assert binary_kl(0.0, 0.3) == pytest.approx(-math.log(0.7))


@pytest.mark.parametrize(
    "args", [(-0.1, 1.0, "taylor"), (1.1, 1.0, "taylor"), (0.5, -1.0, "taylor"), (0.5, math.nan, "exact"),
             (0.5, 1.0, "newton")]
)
def test_gamma_rejects_bad_arguments(args):
    with pytest.raises(ValueError):
        cactus_gamma(*args)


# ---------------------------------------------------------------------------------------------
# cg_verify against the NumPy reference
# ---------------------------------------------------------------------------------------------


def random_step(rng, s: NativeSampler, k: int, deterministic: bool):
    """Draft k tokens with the sampler's own draft() and build verifier logits near the draft's."""
    V = s.n_vocab
    draft_logits = (rng.standard_normal((k, V)) * 2).astype(np.float32)
    verifier_logits = (rng.standard_normal((k + 1, V)) * 2).astype(np.float32)
    verifier_logits[:k] += draft_logits * rng.uniform(0, 1.5)  # correlated: mixed accept / reject
    probs = np.zeros((k, V), dtype=np.float32)
    tokens = np.array([s.draft(draft_logits[i], probs[i]) for i in range(k)], dtype=np.int32)
    return (None if deterministic else probs), tokens, verifier_logits


def outcome(r) -> tuple[int, int, int]:
    return r.n_accepted, r.next_token, r.n_evaluated


def check_against_reference(s: NativeSampler, rng, k, deterministic, acc: AcceptanceParams):
    dp, toks, vl = random_step(rng, s, k, deterministic)
    stream = s.peek_uniforms(2 * k + 2)
    got = s.verify(dp, toks, vl)
    want = ref.verify(
        dp, toks, vl, sp_dict(s.sampling), acc.method, acc.delta, acc.solver,
        acc.typical_epsilon, acc.typical_alpha, acc.accept_top_k, uniforms=iter(stream),
    )
    assert outcome(got) == outcome(want)
    # KL is a function of the float32 q, which the C and the reference round independently
    assert got.kl_sum == pytest.approx(want.kl_sum, rel=1e-5, abs=1e-6)
    assert got.kl_max == pytest.approx(want.kl_max, rel=1e-5, abs=1e-6)
    # the C drew exactly the uniforms the reference used, in the same order
    assert s.peek_uniforms(1)[0] == stream[want.n_uniforms]
    return got


@pytest.mark.parametrize(
    "acc",
    [AcceptanceParams("sps"), AcceptanceParams("cactus", 0.5, "taylor"),
     AcceptanceParams("cactus", 2.0, "exact"), AcceptanceParams("cactus", 0.05, "exact"),
     AcceptanceParams("typical"), AcceptanceParams("typical", typical_epsilon=0.3, typical_alpha=0.9),
     AcceptanceParams("topk", accept_top_k=3), AcceptanceParams("topk", accept_top_k=40),
     AcceptanceParams("greedy")],
    ids=lambda a: f"{a.method}-{a.solver}-{a.delta}-{a.accept_top_k}-{a.typical_epsilon}",
)
def test_verify_matches_reference_token_for_token(acc):
    rng = np.random.default_rng(zlib.crc32(repr(acc).encode()))
    outcomes = set()
    for case in range(120):
        V = int(rng.choice([2, 5, 17, 64]))
        sp = SamplingParams(float(rng.choice([0.0, 0.6, 1.0, 1.5])), int(rng.choice([0, 3, 10])),
                            float(rng.choice([1.0, 0.9])), float(rng.choice([0.0, 0.05])))
        s = NativeSampler(V, sp, acc, int(rng.integers(0, 2**63)))
        k = int(rng.integers(0, 6))
        got = check_against_reference(s, rng, k, deterministic=bool(rng.random() < 0.3), acc=acc)
        outcomes.add(got.n_accepted == k)
    assert outcomes == {True, False}  # both rejections and full acceptance were exercised


def test_verify_matches_reference_at_qwen_vocab_size():
    V, k = 151936, 4
    rng = np.random.default_rng(5)
    warps = [SamplingParams(0.6, 20, 0.95, 0.0), SamplingParams(0.6, 0, 1.0, 0.0)]
    for method, sp in itertools.product(["sps", "cactus", "typical", "topk"], warps):
        acc = AcceptanceParams(method, 1.0, "exact")
        s = NativeSampler(V, sp, acc, 11)
        vl = llm_like_logits(rng, V, k + 1)
        probs = np.zeros((k, V), np.float32)
        draft_logits = vl[:k] + rng.standard_normal((k, V)).astype(np.float32)
        toks = np.array([s.draft(draft_logits[i], probs[i]) for i in range(k)], np.int32)
        stream = s.peek_uniforms(2 * k + 2)
        got = s.verify(probs, toks, vl)
        want = ref.verify(probs, toks, vl, sp_dict(sp), method, 1.0, "exact", uniforms=iter(stream))
        assert outcome(got) == outcome(want)
        assert got.kl_sum == pytest.approx(want.kl_sum, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("solver", ["taylor", "exact"])
def test_cactus_with_zero_delta_is_exactly_sps(solver):
    rng = np.random.default_rng(3)
    n_rejections = 0
    for case in range(300):
        V = int(rng.choice([3, 10, 50]))
        sp = SamplingParams(float(rng.choice([0.7, 1.0])), int(rng.choice([0, 5])), 1.0, 0.0)
        seed = int(rng.integers(0, 2**63))
        s_sps = NativeSampler(V, sp, AcceptanceParams("sps"), seed)
        s_cac = NativeSampler(V, sp, AcceptanceParams("cactus", 0.0, solver), seed)
        k = int(rng.integers(1, 6))
        drafter = NativeSampler(V, sp, AcceptanceParams("sps"), seed + 1)  # keeps the two in step
        dp, toks, vl = random_step(rng, drafter, k, deterministic=bool(rng.random() < 0.3))
        a, b = s_sps.verify(dp, toks, vl), s_cac.verify(dp, toks, vl)
        assert a == b and b.kl_sum == 0.0
        n_rejections += a.n_accepted < k
    assert 30 < n_rejections < 290  # both outcomes were exercised


@pytest.mark.parametrize("method", METHODS)
def test_greedy_decoding_is_exact_match_with_the_verifier_argmax(method):
    rng = np.random.default_rng(4)
    V, k = 12, 5
    for case in range(60):
        s = sampler(V, temperature=0.0, seed=case, method=method, delta=1.5, accept_top_k=1)
        vl = rng.integers(-3, 4, size=(k + 1, V)).astype(np.float32)  # integer logits: many ties
        argmax = vl.argmax(axis=1)  # lowest id among ties
        toks = np.where(rng.random(k) < 0.7, argmax[:k], rng.integers(0, V, k)).astype(np.int32)
        dp = np.eye(V, dtype=np.float32)[toks]  # the greedy draft is one-hot at its token
        r = s.verify(dp, toks, vl)
        al = next((i for i in range(k) if toks[i] != argmax[i]), k)
        assert r.n_accepted == al and r.next_token == argmax[al]
        if method in ("sps", "cactus", "greedy"):
            assert r.kl_sum == 0.0


# ---------------------------------------------------------------------------------------------
# Monte-Carlo: the emitted token's law (k = 1, V = 8)
# ---------------------------------------------------------------------------------------------

N_MC = 200_000
# Chosen so that, at delta = 0.3, Cactus rejects often and its residual matters: the law differs
# clearly from q, from p, between the two solvers, and from a Cactus that forgot to rescale q off n.
P_DRAFT = np.array([0.09, 0.05, 0.07, 0.06, 0.13, 0.07, 0.51, 0.02])
Q_VERIFIER = np.array([0.12, 0.08, 0.07, 0.14, 0.18, 0.24, 0.07, 0.10])


def emitted_histogram(acc: AcceptanceParams, deterministic_token: int | None = None, n: int = N_MC,
                      seed: int = 1):
    """Histogram of the first emitted token over n independent steps with k = 1."""
    V = P_DRAFT.size
    s = NativeSampler(V, SamplingParams(1.0, 0, 1.0, 0.0), acc, seed)
    vl = np.log(np.vstack([Q_VERIFIER, Q_VERIFIER])).astype(np.float32)  # row 1: bonus position
    q = s.warp(vl[0]).astype(np.float64)
    p32 = s.warp(np.log(P_DRAFT).astype(np.float32))
    dp = p32.reshape(1, V)
    if deterministic_token is None:
        p64 = p32.astype(np.float64)
        draws = np.random.default_rng(seed).choice(V, size=n, p=p64 / p64.sum())
    else:
        draws = np.full(n, deterministic_token)
    tokens = [np.array([t], dtype=np.int32) for t in range(V)]
    verify = s.verify
    counts = np.zeros(V, dtype=np.int64)
    dp_arg = None if deterministic_token is not None else dp
    for t in draws:
        r = verify(dp_arg, tokens[t], vl)
        counts[t if r.n_accepted == 1 else r.next_token] += 1
    return counts, p32.astype(np.float64), q


def chi_square_pvalue(counts, law):
    law = law / law.sum()
    support = law > 0
    assert counts[~support].sum() == 0, "a token outside the analytic support was emitted"
    return stats.chisquare(counts[support], law[support] * counts.sum()).pvalue


@pytest.mark.parametrize(
    "acc",
    [AcceptanceParams("sps"), AcceptanceParams("greedy"), AcceptanceParams("cactus", 0.3, "taylor"),
     AcceptanceParams("cactus", 0.3, "exact"),
     AcceptanceParams("typical", typical_epsilon=0.09, typical_alpha=0.9),
     AcceptanceParams("topk", accept_top_k=3)],
    ids=lambda a: f"{a.method}-{a.solver}",
)
def test_monte_carlo_emitted_token_follows_the_analytic_law(acc):
    counts, p, q = emitted_histogram(acc)
    law = ref.emitted_first_token_distribution(
        p, q, acc.method, acc.delta, acc.solver, acc.typical_epsilon, acc.typical_alpha, acc.accept_top_k)
    if acc.method in ("sps", "greedy"):
        np.testing.assert_allclose(law, q, atol=1e-6)  # the analytic law is q itself
    assert chi_square_pvalue(counts, law) > ALPHA


def test_monte_carlo_laws_are_distinguishable():
    # Guards the choice of P_DRAFT / Q_VERIFIER: each alternative law is rejected by the chi-square
    # test at the sample size used, so a wrong acceptance rule or residual cannot pass unnoticed.
    p, q = P_DRAFT, Q_VERIFIER
    taylor = ref.emitted_first_token_distribution(p, q, "cactus", 0.3, "taylor")
    exact = ref.emitted_first_token_distribution(p, q, "cactus", 0.3, "exact")
    no_rescale = np.zeros(8)  # Cactus with h[i] = q[i] off n (forgetting (1 - gamma) / (1 - q[n]))
    for n in range(8):
        h = q.copy()
        h[n] = cactus_gamma(q[n], 0.3, "taylor")
        a = min(1.0, h[n] / p[n])
        r = np.maximum(h - p, 0)
        no_rescale += p[n] * (a * np.eye(8)[n] + (1 - a) * r / r.sum())
    for law, other in [(taylor, exact), (taylor, q), (taylor, p), (taylor, no_rescale)]:
        assert N_MC * ((law - other) ** 2 / other).sum() > 500  # chi-square statistic, 7 dof


def test_cactus_residual_hand_computed():
    # q = (0.1, 0.45, 0.45), p = (0.5, 0.4, 0.1), n = 0, delta = 0.2 (Taylor):
    # gamma = 0.1 + sqrt(2 * 0.2 * 0.1 * 0.9) = 0.28974, h = (gamma, 0.35513, 0.35513),
    # accept w.p. gamma / 0.5; residual max(0, h - p) = (0, 0, 0.25513): always token 2.
    q, p = np.array([0.1, 0.45, 0.45]), np.array([[0.5, 0.4, 0.1]], np.float32)
    vl = np.log(np.vstack([q, q])).astype(np.float32)
    gamma = 0.1 + math.sqrt(2 * 0.2 * 0.1 * 0.9)
    s = sampler(3, seed=5, method="cactus", delta=0.2)
    accepted = 0
    for _ in range(4000):
        r = s.verify(p, np.array([0], np.int32), vl)
        assert r.kl_sum == pytest.approx(binary_kl(gamma, 0.1), rel=1e-6)
        if r.n_accepted == 1:
            accepted += 1
        else:
            assert r.next_token == 2
    assert stats.binomtest(accepted, 4000, gamma / 0.5).pvalue > ALPHA


def test_monte_carlo_deterministic_drafter_emits_h():
    # With p one-hot at n, the residual is q off n renormalised, so the emitted token follows h exactly
    n, delta = 2, 0.5
    acc = AcceptanceParams("cactus", delta, "exact")
    counts, _, q = emitted_histogram(acc, deterministic_token=n, n=100_000)
    g = cactus_gamma(q[n], delta, "exact")
    h = q * (1 - g) / (1 - q[n])
    h[n] = g
    assert chi_square_pvalue(counts, h) > ALPHA


def test_monte_carlo_is_sensitive_cactus_differs_from_q():
    # The same test statistic rejects q for Cactus with a large budget: the tests above can fail.
    counts, _, q = emitted_histogram(AcceptanceParams("cactus", 2.0, "taylor"), n=50_000)
    assert chi_square_pvalue(counts, q) < 1e-12


# ---------------------------------------------------------------------------------------------
# Seeds and independence
# ---------------------------------------------------------------------------------------------


def trace(s: NativeSampler, rng_seed: int, steps: int = 30):
    rng = np.random.default_rng(rng_seed)
    out = []
    for _ in range(steps):
        dp, toks, vl = random_step(rng, s, 3, deterministic=False)
        out.append((tuple(toks), s.verify(dp, toks, vl), s.sample(vl[0])))
    return out


def test_same_seed_same_trace_and_samplers_are_independent():
    mk = lambda seed: sampler(40, temperature=0.8, top_k=10, seed=seed, method="cactus", delta=1.0)
    a = trace(mk(99), 1)
    assert trace(mk(99), 1) == a
    assert trace(mk(100), 1) != a
    # interleave: calls on b between a's calls leave a's trace unchanged
    s_a, s_b = mk(99), mk(99)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(2)
    interleaved = []
    for _ in range(30):
        dp, toks, vl = random_step(rng_a, s_a, 3, deterministic=False)
        bdp, btoks, bvl = random_step(rng_b, s_b, 3, deterministic=False)
        s_b.verify(bdp, btoks, bvl)
        interleaved.append((tuple(toks), s_a.verify(dp, toks, vl), s_a.sample(vl[0])))
        s_b.sample(bvl[1])
    assert interleaved == a


# ---------------------------------------------------------------------------------------------
# Edge cases
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method,solver", [("sps", "taylor"), ("cactus", "taylor"), ("cactus", "exact")])
def test_token_outside_verifier_support_is_never_accepted(method, solver):
    V = 6
    vl = np.array([[5.0, 4.0, 0.0, 0.0, 0.0, 0.0]] * 2, dtype=np.float32)  # top_k=2: q[2:] = 0
    for seed in range(300):
        s = sampler(V, top_k=2, seed=seed, method=method, delta=5.0, solver=solver)
        dp = np.full((1, V), 1 / V, dtype=np.float32)
        r = s.verify(dp, np.array([3], np.int32), vl)
        assert r.n_accepted == 0 and r.next_token in (0, 1)
        assert r.kl_sum == 0.0  # gamma = q[n] = 0: h = q


def test_zero_draft_probability_accepts_iff_target_positive():
    V = 4
    vl = np.log(np.array([[0.4, 0.3, 0.2, 0.1]] * 2)).astype(np.float32)
    dp = np.array([[0.5, 0.5, 0.0, 0.0]], dtype=np.float32)
    for seed in range(50):
        r = sampler(V, seed=seed, method="sps").verify(dp, np.array([2], np.int32), vl)
        assert r.n_accepted == 1  # p[n] = 0 < q[n]: u * 0 < q[n]
    vl0 = np.array([[1.0, 1.0, -np.inf, 1.0]] * 2, dtype=np.float32)  # q[2] = 0 as well
    for seed in range(50):
        r = sampler(V, seed=seed, method="cactus").verify(dp, np.array([2], np.int32), vl0)
        assert r.n_accepted == 0 and r.next_token in (0, 1, 3)


def test_p_equal_q_always_accepts_and_one_hot_q():
    V, k = 30, 6
    rng = np.random.default_rng(8)
    vl = (rng.standard_normal((k + 1, V)) * 2).astype(np.float32)
    for method in ["sps", "cactus"]:
        s = sampler(V, temperature=0.9, top_k=8, seed=1, method=method)
        dp = np.stack([s.warp(vl[i]) for i in range(k)])
        for _ in range(100):
            toks = np.array([s.draft(vl[i], np.empty(V, np.float32)) for i in range(k)], np.int32)
            assert s.verify(dp, toks, vl).n_accepted == k
    # one-hot q (a huge gap): Cactus gamma is 1 on the argmax, 0 elsewhere
    vl1 = np.zeros((2, V), np.float32)
    vl1[:, 7] = 200.0
    s = sampler(V, seed=2, method="cactus", delta=0.5)
    # delta_sum: 0.5 used
    assert s.verify(None, np.array([7], np.int32), vl1) == StepResult(1, 7, 1, 0.0, 0.0, 0.0, 0.0, 0.5)
    r = s.verify(None, np.array([8], np.int32), vl1)
    assert (r.n_accepted, r.next_token, r.kl_sum) == (0, 7, 0.0)


@pytest.mark.parametrize("method", ["sps", "cactus"])
def test_all_zero_residual_falls_back_to_h(method):
    # Unnormalised draft rows p = 2 q: accept w.p. 1/2, and max(0, h - p) = 0 everywhere.
    V = 5
    q = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    vl = np.log(np.vstack([q, q])).astype(np.float32)
    s = sampler(V, seed=3, method=method, delta=0.0)
    dp = (2 * s.warp(vl[0])).reshape(1, V)
    counts = np.zeros(V)
    n_rejected = 0
    for _ in range(4000):
        r = s.verify(dp, np.array([2], np.int32), vl)
        assert 0 <= r.next_token < V
        if r.n_accepted == 0:
            n_rejected += 1
            counts[r.next_token] += 1
    assert 1700 < n_rejected < 2300
    assert stats.chisquare(counts, q * counts.sum()).pvalue > ALPHA


def test_topk_all_zero_residual_and_top_set_within_the_support():
    V = 6
    vl = np.log(np.array([[0.5, 0.3, 0.2, 1e-30, 1e-30, 1e-30]] * 2)).astype(np.float32)
    s = sampler(V, top_k=3, seed=0, method="topk", accept_top_k=2)
    dp = np.ones((1, V), np.float32)  # unnormalised: 1[T] - p <= 0 everywhere
    for _ in range(200):
        r = s.verify(dp, np.array([2], np.int32), vl)  # 2 is outside the top 2 -> rejected
        assert r.n_accepted == 0 and r.next_token in (0, 1)
        assert r.kl_sum == pytest.approx(0.5 * math.log(0.5 / 0.5) + 0.5 * math.log(0.5 / 0.3))
    # accept_top_k larger than q's support: the top set is the support (3 tokens), never a token
    # with q = 0, and KL(h||q) is that of the uniform law on the support
    s = sampler(V, top_k=3, seed=0, method="topk", accept_top_k=4)
    r = s.verify(None, np.array([0], np.int32), vl)
    kl3 = sum(math.log((1 / 3) / qi) / 3 for qi in (0.5, 0.3, 0.2))
    assert r.n_accepted == 1 and r.kl_sum == pytest.approx(kl3) and r.kl_max == pytest.approx(kl3)
    r = s.verify(None, np.array([3], np.int32), vl)  # q = 0 token: rejected even though in the top 4
    assert r.n_accepted == 0 and r.next_token in (0, 1, 2)


def test_k_zero_samples_the_bonus_from_row_zero():
    s = sampler(4, temperature=0.0)
    vl = np.array([[0.0, 3.0, 1.0, 2.0]], np.float32)
    assert s.verify(None, np.zeros(0, np.int32), vl) == StepResult(0, 1, 0, 0.0, 0.0)
    assert s.verify(np.zeros((0, 4), np.float32), np.zeros(0, np.int32), vl.ravel()).next_token == 1


def test_verify_accepts_a_zero_copy_view_on_a_c_float_buffer():
    V, k = 9, 2
    buf = (ctypes.c_float * ((k + 1) * V))(*([0.0] * ((k + 1) * V)))
    view = np.ctypeslib.as_array(buf).reshape(k + 1, V)
    view[:, 4] = 10.0
    r = sampler(V, temperature=0.0).verify(None, np.array([4, 4], np.int32), view)
    assert (r.n_accepted, r.next_token) == (2, 4)


def test_bad_distribution_rows_raise():
    V = 5
    s = sampler(V)
    vl = np.zeros((3, V), np.float32)
    toks = np.array([1, 2], np.int32)
    for bad in [np.nan, -0.1, np.inf]:
        dp = np.full((2, V), 0.2, np.float32)
        dp[1, 4] = bad  # in the second row: rows are validated up front
        with pytest.raises(BadDistributionError):
            s.verify(dp, toks, vl)
    with pytest.raises(BadDistributionError):
        s.verify(np.zeros((2, V), np.float32), toks, vl)  # sums to 0


def test_bad_token_ids_raise_native_argument_error():
    V = 5
    s = sampler(V)
    vl = np.zeros((3, V), np.float32)
    for toks in [[0, -1], [5, 0]]:
        with pytest.raises(NativeArgumentError) as e:
            s.verify(None, np.array(toks, np.int32), vl)
        assert isinstance(e.value, ValueError)


def test_boundary_validation_raises_value_error():
    V = 5
    s = sampler(V)
    toks = np.array([1], np.int32)
    vl = np.zeros((2, V), np.float32)
    cases = [
        (None, toks.astype(np.int64), vl),                      # token dtype
        (None, [1], vl),                                        # not an array
        (None, toks, vl.astype(np.float64)),                    # logits dtype
        (None, toks, np.zeros((3, V), np.float32)),             # k + 1 rows
        (None, toks, np.zeros((2, V + 1), np.float32)),         # V columns
        (None, toks, np.zeros((V, 2), np.float32).T),           # not C-contiguous
        (np.zeros((1, V), np.float64), toks, vl),               # draft dtype
        (np.zeros((2, V), np.float32), toks, vl),               # draft rows
    ]
    for dp, t, l in cases:
        with pytest.raises(ValueError):
            s.verify(dp, t, l)
    with pytest.raises(ValueError):
        s.warp(np.zeros(V + 1, np.float32))
    with pytest.raises(ValueError):
        s.warp(np.zeros(0, np.float32))
    with pytest.raises(ValueError):
        s.draft(np.zeros(V, np.float32), np.zeros(V, np.float64))
    with pytest.raises(ValueError):
        s.warp_into(np.zeros(V, np.float32), np.zeros(V, np.float32)[::-1])
    row = np.zeros(V, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        s.warp_into(row, row)  # the warp uses its output as scratch
    with pytest.raises(AttributeError):
        s.sampling = SamplingParams(temperature=0.0)  # fixed for the sampler's life


@pytest.mark.parametrize(
    "kwargs,name",
    [(dict(temperature=math.nan), "temperature"), (dict(top_k=-1), "top_k"), (dict(top_k=2.5), "top_k"),
     (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"), (dict(min_p=-0.1), "min_p"),
     (dict(min_p=1.1), "min_p")],
)
def test_sampling_params_validation(kwargs, name):
    with pytest.raises(InputError, match=name):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs,name",
    [(dict(method="eagle"), "method"), (dict(delta=-0.5), "delta"), (dict(delta=math.nan), "delta"),
     (dict(solver="newton"), "solver"), (dict(typical_epsilon=-1.0), "typical_epsilon"),
     (dict(typical_alpha=math.nan), "typical_alpha"), (dict(accept_top_k=0), "accept_top_k"),
     (dict(method="none"), "method"), (dict(end_tau=-1.0), "end_tau"),
     (dict(end_mask=np.zeros(3)), "end_mask")],
)
def test_acceptance_params_validation(kwargs, name):
    with pytest.raises(InputError, match=name):  # the documented type (a ValueError)
        AcceptanceParams(**kwargs)


def test_defaults_are_llama_cpp_and_vllm():
    assert SamplingParams() == SamplingParams(0.8, 40, 0.95, 0.05)
    assert AcceptanceParams() == AcceptanceParams("cactus", 1.0, "taylor", 0.09, 0.3, 5)
    with pytest.raises(ValueError, match="n_vocab"):
        NativeSampler(0, SamplingParams(), AcceptanceParams(), 0)


def test_c_layer_validates_parameters_on_its_own():
    """The dataclasses validate first; the C must still reject bad values passed to it directly."""
    V = 4
    work = np.empty(native._workspace_size(V), np.float32)
    probs = np.empty(V, np.float32)
    logits = np.zeros(V, np.float32)
    rng = native._RngC()
    res = native._StepResultC()
    toks = np.zeros(1, np.int32)
    vl = np.zeros((2, V), np.float32)
    addr = ctypes.addressof

    def warp_status(*sp):
        c = native._SamplerParamsC(*sp)
        return native._warp(logits.ctypes.data, V, V, None, addr(c), probs.ctypes.data, work.ctypes.data)

    assert warp_status(1.0, 0, 1.0, 0.0) == 0
    for sp in [(math.nan, 0, 1.0, 0.0), (1.0, -1, 1.0, 0.0), (1.0, 0, 0.0, 0.0), (1.0, 0, 1.5, 0.0),
               (1.0, 0, math.nan, 0.0), (1.0, 0, 1.0, -0.5), (1.0, 0, 1.0, 2.0)]:
        assert warp_status(*sp) == 1, sp
    assert native._warp(logits.ctypes.data, V + 1, V, None, addr(native._SamplerParamsC(1, 0, 1, 0)),
                        probs.ctypes.data, work.ctypes.data) == 1  # n_logits > V
    assert native._warp(None, V, V, None, addr(native._SamplerParamsC(1, 0, 1, 0)), probs.ctypes.data,
                        work.ctypes.data) == 1

    sp = native._SamplerParamsC(1.0, 0, 1.0, 0.0)

    def verify_status(*ap, k=1, n_vocab=V):
        a = native._AcceptParamsC(*ap)
        return native._verify(None, toks.ctypes.data, vl.ctypes.data, None, k, n_vocab, addr(sp),
                              addr(a), addr(rng), work.ctypes.data, addr(res))

    assert verify_status(1, 0, 1.0, 0.09, 0.3, 5) == 0
    past_last = len(native.METHOD_VALUES)  # the first value that names no rule
    for ap in [(past_last, 0, 1.0, 0.09, 0.3, 5), (-1, 0, 1.0, 0.09, 0.3, 5), (1, 2, 1.0, 0.09, 0.3, 5),
               (1, 0, -1.0, 0.09, 0.3, 5), (1, 0, math.nan, 0.09, 0.3, 5), (2, 0, 1.0, math.nan, 0.3, 5),
               (2, 0, 1.0, 0.09, -0.3, 5), (3, 0, 1.0, 0.09, 0.3, 0)]:
        assert verify_status(*ap) == 1, ap
    # ears_alpha < 0, top_gap NaN, end_tau < 0 (positions after output_kl)
    for extra in [(-0.5, math.inf, 2.0), (0.5, math.nan, 2.0), (0.5, math.inf, -1.0)]:
        assert verify_status(1, 0, 1.0, 0.09, 0.3, 5, 0, 0, *extra) == 1, extra
    assert verify_status(1, 0, 1.0, 0.09, 0.3, 5, 0, 0, 0.5, math.inf, 2.0) == 0
    assert verify_status(1, 0, 1.0, 0.09, 0.3, 5, k=-1) == 1
    assert verify_status(1, 0, 1.0, 0.09, 0.3, 5, n_vocab=0) == 1
    assert native._workspace_size(0) == 0
    assert math.isnan(native._cactus_gamma(0.5, -1.0, 0)) and math.isnan(native._cactus_gamma(0.5, 1.0, 7))


def test_exact_solver_reported_kl_never_exceeds_delta_even_by_rounding():
    """The reported KL(h||q) of --solver exact is <= delta exactly (no 1e-16 overshoot)."""
    worst = -math.inf
    for delta in (1e-3, 0.1, 0.5, 1.0, 2.0):
        s = NativeSampler(2, SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
                          AcceptanceParams(method="cactus", delta=delta, solver="exact"), 0)
        for q in np.linspace(1e-4, 1 - 1e-4, 2001):
            logits = np.log(np.array([[q, 1 - q], [0.5, 0.5]])).astype(np.float32)
            r = s.verify(None, np.array([0], np.int32), logits)
            worst = max(worst, r.kl_max - delta)
    assert worst <= 0.0


def test_sample_probs_is_the_reference_inverse_cdf():
    """cg_sample_probs (C layer) draws the reference's token for the same uniform: unnormalised
    rows, +-0 entries, sparse rows whose positive entries sit in few blocks of 64 ids, and any V."""
    rng = np.random.default_rng(12)
    c_rng = native._RngC()
    tok = ctypes.c_int32()
    addr = ctypes.addressof
    for V in [1, 5, 63, 64, 65, 300, 4099]:
        work = np.empty(native._workspace_size(V), np.float32)
        for _ in range(30):
            density = float(rng.choice([0.002, 0.3, 1.0]))
            row = (rng.random(V) * 3 * (rng.random(V) < density)).astype(np.float32)
            row[rng.integers(0, V)] = np.float32(rng.random() + 1e-3)  # at least one positive
            row[(row == 0) & (rng.random(V) < 0.5)] = -0.0
            seed = int(rng.integers(0, 2**63))
            native._rng_seed(addr(c_rng), seed)
            st = _clib._sample_probs(row.ctypes.data, V, addr(c_rng), work.ctypes.data, addr(tok))
            assert st == 0
            assert tok.value == ref.pick(row.astype(np.float64), ref.XoshiroRef(seed).uniform())
    # a bad row is reported before any uniform is drawn; the workspace is required
    bad = np.array([0.5, -0.25, 0.5], np.float32)
    work = np.empty(native._workspace_size(3), np.float32)
    native._rng_seed(addr(c_rng), 5)
    before = tuple(c_rng.s)
    assert _clib._sample_probs(bad.ctypes.data, 3, addr(c_rng), work.ctypes.data, addr(tok)) == 3
    assert tuple(c_rng.s) == before
    good = np.abs(bad)
    assert _clib._sample_probs(good.ctypes.data, 3, addr(c_rng), None, addr(tok)) == 1


# ---------------------------------------------------------------------------------------------
# Allowed-token mask
# ---------------------------------------------------------------------------------------------


def random_masks(rng, rows, V, density=None):
    """bool [rows, V], each row with at least one allowed token."""
    d = rng.choice([0.05, 0.3, 0.7, 0.97]) if density is None else density
    m = rng.random((rows, V)) < d
    m[np.arange(rows), rng.integers(0, V, rows)] = True
    return m


def with_padding_bits_set(bits, V):
    """The same mask with every bit past V set: those bits must be ignored."""
    out = bits.copy()
    if V % 32:
        out[..., -1] |= np.uint32((0xFFFFFFFF << (V % 32)) & 0xFFFFFFFF)
    return out


def test_pack_allowed_layout():
    m = np.zeros(70, bool)
    m[[0, 5, 31, 32, 69]] = True
    w = pack_allowed(m)
    assert w.dtype == np.uint32 and w.shape == (3,) and w.flags.c_contiguous
    assert w.tolist() == [1 | (1 << 5) | (1 << 31), 1, 1 << 5]
    np.testing.assert_array_equal(ref.allowed_bool(w, 70), m)  # the reference unpacks bit by bit
    assert pack_allowed(np.ones((2, 33), bool)).tolist() == [[0xFFFFFFFF, 1]] * 2
    with pytest.raises(ValueError, match="boolean"):
        pack_allowed(np.ones(5, np.int32))


@pytest.mark.parametrize("V", [1, 7, 32, 33, 300])
def test_masked_warp_is_exactly_a_minus_inf_logit_and_matches_the_reference(V):
    rng = np.random.default_rng(100 + V)
    combos = itertools.product([0.0, 0.6, 1.0], [0, 1, 3, 20], [1.0, 0.9], [0.0, 0.05])
    for T, top_k, top_p, min_p in combos:
        s = sampler(V, temperature=T, top_k=top_k, top_p=top_p, min_p=min_p)
        for trial in range(3):
            l = (rng.standard_normal(V) * 3).astype(np.float32)
            if trial == 1:
                l = np.round(l)  # ties
            m = random_masks(rng, 1, V)[0]
            if trial == 2 and V > 2:
                l[rng.integers(0, V, V // 3)] = -np.inf
                l[rng.choice(np.flatnonzero(m))] = 0.0  # an allowed finite logit remains
            bits = pack_allowed(m)
            got = s.warp(l, allowed=bits)
            # bit for bit the unmasked warp of the row with the disallowed logits at -inf
            np.testing.assert_array_equal(got, s.warp(np.where(m, l, -np.inf).astype(np.float32)))
            np.testing.assert_array_equal(got, s.warp(l, allowed=with_padding_bits_set(bits, V)))
            assert not got[~m].any()
            for allowed in (bits, m):  # the reference takes the bitmask or the boolean form
                want = ref.warp(l, V, T, top_k, top_p, min_p, allowed=allowed)
                np.testing.assert_allclose(got, want, atol=1e-6, err_msg=f"{T=} {top_k=} {top_p=} {min_p=}")
                np.testing.assert_array_equal(got > 0, want > 0)


def test_masked_warp_of_a_prefix_draft_vocabulary():
    V, n = 70, 40  # the draft scores only the first 40 ids; the mask covers all 70
    s = sampler(V, temperature=0.8, top_k=5)
    l = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    m = np.zeros(V, bool)
    m[[2, 9, 17, 39, 45, 69]] = True
    got = s.warp(l, allowed=pack_allowed(m))
    assert set(np.flatnonzero(got)) <= {2, 9, 17, 39}
    np.testing.assert_allclose(got, ref.warp(l, V, 0.8, 5, 1.0, 0.0, allowed=m), atol=1e-7)
    only_past_the_prefix = np.zeros(V, bool)
    only_past_the_prefix[[45, 69]] = True
    with pytest.raises(EmptyMaskError):
        s.warp(l, allowed=pack_allowed(only_past_the_prefix))


MASK_ACCEPTANCE = [AcceptanceParams("sps"), AcceptanceParams("cactus", 0.5, "taylor"),
                   AcceptanceParams("cactus", 2.0, "exact"), AcceptanceParams("typical"),
                   AcceptanceParams("topk", accept_top_k=3), AcceptanceParams("greedy")]


@pytest.mark.parametrize("acc", MASK_ACCEPTANCE, ids=lambda a: f"{a.method}-{a.solver}-{a.delta}")
def test_masked_verify_matches_the_reference_token_for_token(acc):
    """Draft and verifier rows masked alike: the C and the reference (same uniforms) make the same
    decisions, and the result is bit for bit that of the -inf-substituted logits without a mask."""
    rng = np.random.default_rng(zlib.crc32(repr(acc).encode()) + 1)
    outcomes = set()
    for case in range(80):
        V = int(rng.choice([2, 5, 17, 33, 64]))
        sp = SamplingParams(float(rng.choice([0.0, 0.6, 1.0, 1.5])), int(rng.choice([0, 3, 10])),
                            float(rng.choice([1.0, 0.9])), float(rng.choice([0.0, 0.05])))
        seed = int(rng.integers(0, 2**63))
        k = int(rng.integers(0, 6))
        masks = random_masks(rng, k + 1, V)
        bits = pack_allowed(masks)
        vl = (rng.standard_normal((k + 1, V)) * 2).astype(np.float32)
        dl = (vl[:k] * rng.uniform(0, 1.5) + rng.standard_normal((k, V))).astype(np.float32)
        drafter = NativeSampler(V, sp, acc, seed ^ 1)
        probs = np.zeros((k, V), np.float32)
        toks = np.array([drafter.draft(dl[i], probs[i], allowed=bits[i]) for i in range(k)], np.int32)
        if rng.random() < 0.3:  # a deterministic drafter, proposing disallowed ids too
            probs, toks = None, rng.integers(0, V, k).astype(np.int32)
        s = NativeSampler(V, sp, acc, seed)
        stream = s.peek_uniforms(2 * k + 2)
        got = s.verify(probs, toks, vl, allowed=bits)
        want = ref.verify(probs, toks, vl, sp_dict(sp), acc.method, acc.delta, acc.solver,
                          acc.typical_epsilon, acc.typical_alpha, acc.accept_top_k,
                          uniforms=iter(stream), allowed=masks if case % 2 else bits)
        assert outcome(got) == outcome(want)
        assert got.kl_sum == pytest.approx(want.kl_sum, rel=1e-5, abs=1e-6)
        assert s.peek_uniforms(1)[0] == stream[want.n_uniforms]
        substituted = np.where(masks, vl, -np.inf).astype(np.float32)
        assert NativeSampler(V, sp, acc, seed).verify(probs, toks, substituted) == got
        outcomes.add(got.n_accepted == k)
    assert outcomes == {True, False}


def test_a_row_the_mask_empties_raises_empty_mask_error():
    V = 40
    s = sampler(V, method="sps")
    l = np.random.default_rng(0).standard_normal(V).astype(np.float32)
    none = pack_allowed(np.zeros(V, bool))
    for call in (lambda a: s.warp(l, allowed=a), lambda a: s.sample(l, allowed=a),
                 lambda a: s.draft(l, np.empty(V, np.float32), allowed=a)):
        before = s.peek_uniforms(1)
        with pytest.raises(EmptyMaskError, match="empty mask"):
            call(none)
        assert s.peek_uniforms(1) == before  # no uniform is drawn when the warp fails
    # allowed tokens whose logits are all -inf: empty as well
    m = np.zeros(V, bool)
    m[[3, 4]] = True
    l2 = l.copy()
    l2[[3, 4]] = -np.inf
    with pytest.raises(EmptyMaskError):
        s.warp(l2, allowed=pack_allowed(m))
    # the mask hides no fault: a NaN at a disallowed token, or an all -inf row, is non-finite
    l3 = l.copy()
    l3[10] = np.nan
    with pytest.raises(NonFiniteLogitsError):
        s.warp(l3, allowed=pack_allowed(~np.eye(V, dtype=bool)[10]))
    with pytest.raises(NonFiniteLogitsError):
        s.warp(np.full(V, -np.inf, np.float32), allowed=pack_allowed(m))
    assert issubclass(EmptyMaskError, native.NativeError)
    # cg_verify: an empty row fails when reached, and only then
    vl = np.zeros((3, V), np.float32)
    vl[:, 7] = 5.0
    masks = np.ones((3, V), bool)
    masks[1] = False
    bits = pack_allowed(masks)
    g = sampler(V, temperature=0.0, method="sps")
    with pytest.raises(EmptyMaskError):
        g.verify(None, np.array([7, 7], np.int32), vl, allowed=bits)  # position 0 accepted: row 1 reached
    r = g.verify(None, np.array([8, 7], np.int32), vl, allowed=bits)  # rejected at 0: row 1 unread
    assert (r.n_accepted, r.next_token) == (0, 7)
    masks[1] = True
    masks[0] = False
    with pytest.raises(EmptyMaskError):
        g.verify(None, np.zeros(0, np.int32), vl[:1], allowed=pack_allowed(masks[:1]))  # k = 0: the bonus row


@pytest.mark.parametrize("T,top_k", [(0.0, 0), (0.7, 0), (1.0, 3), (2.0, 0)])
def test_masked_tokens_are_never_sampled(T, top_k):
    V = 100
    rng = np.random.default_rng(int(T * 10) + top_k)
    s = sampler(V, temperature=T, top_k=top_k, seed=4)
    probs = np.empty(V, np.float32)
    for _ in range(300):
        l = (rng.standard_normal(V) * 3).astype(np.float32)
        m = random_masks(rng, 1, V, density=0.1)[0]
        m[int(np.argmax(l))] = False  # the unmasked argmax is never available
        bits = pack_allowed(m)
        t1, t2 = s.sample(l, allowed=bits), s.draft(l, probs, allowed=bits)
        assert m[t1] and m[t2] and not probs[~m].any()
        if T == 0.0:  # greedy: the lowest-id argmax among the allowed tokens
            assert t1 == t2 == int(np.flatnonzero(m)[np.argmax(l[m])])


@pytest.mark.parametrize("method", METHODS)
def test_verify_never_emits_a_disallowed_token_whatever_the_draft(method):
    V, k = 50, 4
    rng = np.random.default_rng(zlib.crc32(method.encode()))
    s = sampler(V, temperature=1.0, seed=9, method=method, delta=3.0, accept_top_k=6)
    for _ in range(300):
        masks = random_masks(rng, k + 1, V, density=0.2)
        vl = (rng.standard_normal((k + 1, V)) * 2).astype(np.float32)
        toks = rng.integers(0, V, k).astype(np.int32)  # unmasked proposals, often disallowed
        dp = None if rng.random() < 0.5 else rng.dirichlet(np.ones(V), k).astype(np.float32)
        r = s.verify(dp, toks, vl, allowed=pack_allowed(masks))
        assert all(masks[i, toks[i]] for i in range(r.n_accepted))
        assert masks[r.n_accepted, r.next_token]
        assert r.kl_max < math.inf


def test_no_mask_changes_nothing():
    """allowed=None and an all-allowed mask (padding bits clear or set) give the unmasked results
    bit for bit, and draw the same uniforms."""
    V, k = 45, 3
    rng = np.random.default_rng(21)
    mk = lambda: sampler(V, temperature=0.8, top_k=10, seed=77, method="cactus", delta=1.0)
    plain, none, ones, padded = mk(), mk(), mk(), mk()
    all_ones = pack_allowed(np.ones((k + 1, V), bool))
    pad = with_padding_bits_set(all_ones, V)
    for _ in range(40):
        vl = (rng.standard_normal((k + 1, V)) * 2).astype(np.float32)
        dp = np.zeros((k, V), np.float32)
        toks = np.array([plain.draft(vl[i], dp[i]) for i in range(k)], np.int32)
        for other, a in ((none, None), (ones, all_ones), (padded, pad)):
            dq = np.zeros((k, V), np.float32)
            t = np.array([other.draft(vl[i], dq[i], allowed=None if a is None else a[i])
                          for i in range(k)], np.int32)
            np.testing.assert_array_equal(t, toks)
            np.testing.assert_array_equal(dq, dp)
        want = plain.verify(dp, toks, vl)
        assert none.verify(dp, toks, vl, allowed=None) == want
        assert ones.verify(dp, toks, vl, allowed=all_ones) == want
        assert padded.verify(dp, toks, vl, allowed=pad.ravel()) == want  # flat [(k+1) W] too
        np.testing.assert_array_equal(plain.warp(vl[0]), ones.warp(vl[0], allowed=all_ones[0]))
    assert plain.peek_uniforms(3).tolist() == ones.peek_uniforms(3).tolist() \
        == padded.peek_uniforms(3).tolist()


def test_mask_argument_validation():
    V, k = 40, 2  # ceil(40 / 32) = 2 words per row
    s = sampler(V)
    l = np.zeros(V, np.float32)
    good = pack_allowed(np.ones(V, bool))
    bad = [good.astype(np.int32), good.astype(np.uint64), np.ones(V, bool), good[:1],
           np.zeros(3, np.uint32), np.zeros((2, 2), np.uint32)[:, 0], good.tolist(), good.reshape(1, 2)]
    for b in bad:
        for call in (lambda: s.warp(l, allowed=b), lambda: s.sample(l, allowed=b),
                     lambda: s.draft(l, np.empty(V, np.float32), allowed=b),
                     lambda: s.warp_into(l, np.empty(V, np.float32), allowed=b)):
            with pytest.raises(ValueError, match="allowed"):
                call()
    with pytest.raises(TypeError):
        s.warp(l, good)  # keyword only
    vl = np.zeros((k + 1, V), np.float32)
    toks = np.zeros(k, np.int32)
    rows = pack_allowed(np.ones((k + 1, V), bool))
    assert 0 <= s.verify(None, toks, vl, allowed=rows).n_accepted <= k
    assert 0 <= s.verify(None, toks, vl, allowed=rows.ravel()).n_accepted <= k
    for b in [rows[:k], pack_allowed(np.ones((k + 1, V + 32), bool)), rows.astype(np.int64),
              np.asfortranarray(pack_allowed(np.ones((k + 1, 64), bool))), good]:
        with pytest.raises(ValueError, match=r"allowed.*k\+1=3"):
            s.verify(None, toks, vl, allowed=b)


def test_monte_carlo_sps_under_a_mask_emits_the_masked_verifier_law():
    """With draft and verifier masked alike, SpS emits norm(q * mask) (chi-square at ALPHA = 0.001,
    k = 1, T = 1 without truncation, so the masked warp is exactly norm(q * mask))."""
    V = P_DRAFT.size
    mask = np.array([1, 0, 1, 1, 1, 0, 1, 1], bool)  # drops q's largest token (5) and token 1
    bits = pack_allowed(np.vstack([mask, mask]))
    s = NativeSampler(V, SamplingParams(1.0, 0, 1.0, 0.0), AcceptanceParams("sps"), 12)
    vl = np.log(np.vstack([Q_VERIFIER, Q_VERIFIER])).astype(np.float32)
    dl = np.log(P_DRAFT).astype(np.float32)
    probs = np.zeros((1, V), np.float32)
    tok = np.zeros(1, np.int32)
    counts = np.zeros(V, np.int64)
    n_rejected = 0
    for _ in range(100_000):
        tok[0] = s.draft(dl, probs[0], allowed=bits[0])
        r = s.verify(probs, tok, vl, allowed=bits)
        n_rejected += r.n_accepted == 0
        counts[tok[0] if r.n_accepted == 1 else r.next_token] += 1
    law = Q_VERIFIER * mask / (Q_VERIFIER * mask).sum()
    assert chi_square_pvalue(counts, law) > ALPHA  # also asserts no disallowed token was emitted
    assert n_rejected > 10_000  # the residual draw mattered
    assert chi_square_pvalue(counts, Q_VERIFIER) < 1e-12  # sensitive: the unmasked q is rejected
