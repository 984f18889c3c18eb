"""Issue #6, kind 4: the native helper under random inputs (hypothesis).

Dimension letters: V = vocabulary size, k = draft length; p = draft distribution, q = verifier
distribution (both warped), n = drafted token, h = acceptance target.

Properties: warped rows are probability distributions (finite, >= 0, sum 1) on the kept set and
match the NumPy reference; sampled tokens are in range with positive probability; a verification
step returns AL in [0, k], a token in range that the verifier's warped distribution allows, and no
NaN; q > 0 = p and p > 0 = q, p = q, one-hot q and all-zero residuals are handled; NaN / +inf logits
are an error, never a token; the same seed gives the same trace and samplers never share state; an
allowed-token mask is exactly a -inf logit, and no step emits a disallowed token.
Example counts are modest so the file runs in well under a minute.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cactus_gguf.sampling import reference as ref
from cactus_gguf.sampling import (AcceptanceParams, BadDistributionError, NativeSampler,
                                NonFiniteLogitsError, SamplingParams, pack_allowed)

METHODS = ["sps", "cactus", "typical", "topk", "greedy", "ears"]
FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ---- strategies --------------------------------------------------------------------------------------

@st.composite
def logits_rows(draw, n_rows: int, V: int, allow_neg_inf: bool = True) -> np.ndarray:
    """float32 [n_rows, V]: a mix of spreads (flat to peaked), ties, and some -inf (never a whole row)."""
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    scale = draw(st.sampled_from([0.0, 0.1, 1.0, 3.0, 20.0]))
    rows = (rng.standard_normal((n_rows, V)) * scale).astype(np.float32)
    if draw(st.booleans()):
        rows = np.round(rows)  # ties
    if allow_neg_inf and V > 1 and draw(st.booleans()):
        mask = rng.random((n_rows, V)) < draw(st.sampled_from([0.1, 0.5, 0.9]))
        mask[np.arange(n_rows), rng.integers(0, V, n_rows)] = False  # keep one finite per row
        rows[mask] = -np.inf
    return rows


sampling_params = st.builds(
    SamplingParams,
    temperature=st.one_of(st.sampled_from([0.0, -1.0, 1.0]), st.floats(0.05, 5.0)),
    top_k=st.integers(0, 12),
    top_p=st.one_of(st.just(1.0), st.floats(0.05, 1.0)),
    min_p=st.one_of(st.just(0.0), st.floats(0.0, 1.0)),
)

acceptance_params = st.builds(
    AcceptanceParams,
    method=st.sampled_from(METHODS),
    delta=st.one_of(st.just(0.0), st.floats(0.0, 5.0), st.just(math.inf)),
    solver=st.sampled_from(["taylor", "exact"]),
    accept_top_k=st.integers(1, 6),
)


def ref_warp(row: np.ndarray, V: int, sp: SamplingParams) -> np.ndarray:
    return ref.warp(row, V, sp.temperature, sp.top_k, sp.top_p, sp.min_p)


def top_p_boundary_tie(row: np.ndarray, sp: SamplingParams) -> bool:
    """True when a prefix of the (top-k-cut) softmax sums to top_p within rounding."""
    l = np.sort(row[np.isfinite(row)].astype(np.float64))[::-1]
    if 0 < sp.top_k < l.size:
        l = l[:sp.top_k]
    e = np.exp(l - l[0])
    return bool(np.any(np.abs(np.cumsum(e) / e.sum() - np.float32(sp.top_p)) < 1e-9))


def assert_distribution(p: np.ndarray, row: np.ndarray, sp: SamplingParams) -> None:
    n = row.shape[0]
    assert np.isfinite(p).all() and (p >= 0).all()
    assert abs(float(p.astype(np.float64).sum()) - 1.0) < 1e-5
    assert not p[n:].any()                                  # ids past the row's length: 0
    assert not p[:n][np.isneginf(row)].any()                # -inf logits: probability 0
    assert p[int(np.argmax(row))] > 0                       # every warp keeps the argmax
    if sp.top_k > 0:
        assert np.count_nonzero(p) <= sp.top_k
    if not sp.temperature > 0:
        assert np.count_nonzero(p) == 1


# ---- warp and sampling ------------------------------------------------------------------------------

@FUZZ
@given(data=st.data(), V=st.integers(1, 48), sp=sampling_params)
def test_warp_is_a_distribution_and_matches_the_reference(data, V, sp):
    n = data.draw(st.integers(1, V), label="n_logits")
    row = data.draw(logits_rows(1, n))[0]
    s = NativeSampler(V, sp, AcceptanceParams(), 0)
    p = s.warp(row)
    assert_distribution(p, row, sp)
    if sp.temperature > 0 and sp.top_p < 1.0 and top_p_boundary_tie(row, sp):
        return  # the cumulative mass hits top_p exactly: the C's exact compare and the
        #         reference's rounded cumsum may keep different (equally valid) prefixes
    want = ref_warp(row, V, sp)
    # same kept set, except that the C flushes to 0 what would be a subnormal float (below
    # exp(-87.3) of the largest probability, documented); values to float rounding
    assert not ((p > 0) & (want == 0)).any()
    assert not ((p == 0) & (want > 1e-37)).any()
    np.testing.assert_allclose(p, want, rtol=1e-5, atol=1e-6)


@FUZZ
@given(data=st.data(), V=st.integers(1, 48), sp=sampling_params, seed=st.integers(0, 2**64 - 1))
def test_sampled_tokens_are_in_range_with_positive_probability(data, V, sp, seed):
    n = data.draw(st.integers(1, V), label="n_logits")
    rows = data.draw(logits_rows(8, n))
    a, b = (NativeSampler(V, sp, AcceptanceParams(), seed) for _ in range(2))
    probs = np.empty(V, np.float32)
    for row in rows:
        t = a.draft(row, probs)
        assert 0 <= t < n and probs[t] > 0
        assert_distribution(probs, row, sp)
        assert b.sample(row) == t  # same seed, same draws; draft and sample use one uniform each


# ---- verification -----------------------------------------------------------------------------------

@st.composite
def steps(draw):
    """(sampler factory, draft_probs or None, draft tokens, verifier logits, mode)."""
    V = draw(st.integers(2, 40), label="V")
    k = draw(st.integers(0, 5), label="k")
    sp = draw(sampling_params, label="sampling")
    ap = draw(acceptance_params, label="acceptance")
    vl = draw(logits_rows(k + 1, V), label="verifier_logits")
    seed = draw(st.integers(0, 2**64 - 1), label="seed")
    mode = draw(st.sampled_from(["model", "same", "deterministic", "arbitrary", "scaled"]),
                label="draft mode")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    drafter = NativeSampler(V, sp, ap, seed ^ 0x5EED)
    probs = np.zeros((k, V), np.float32)
    tokens = np.zeros(k, np.int32)
    if mode == "model":        # a draft model: its own logits, warped the same way, sampled from p
        dl = draw(logits_rows(k, V), label="draft_logits") if k else np.zeros((0, V), np.float32)
        for i in range(k):
            tokens[i] = drafter.draft(dl[i], probs[i])
    elif mode == "same":       # p = q exactly: the draft is the verifier
        for i in range(k):
            tokens[i] = drafter.draft(vl[i], probs[i])
    elif mode == "deterministic":  # p one-hot (n-gram drafter): any id, q[n] may be 0
        tokens[:] = rng.integers(0, V, k)
        probs = None
    elif mode == "arbitrary":  # any valid row and any id: p[n] = 0 < q[n] and q[n] = 0 < p[n]
        probs[:] = rng.random((k, V)) * (rng.random((k, V)) < 0.5)
        probs[np.arange(k), rng.integers(0, V, k)] += 0.1  # never an all-zero row
        tokens[:] = rng.integers(0, V, k)
    else:                      # "scaled": p = c q with c >= 1, unnormalised: residual max(0, h-p) = 0
        for i in range(k):
            tokens[i] = drafter.draft(vl[i], probs[i])
            probs[i] *= np.float32(draw(st.floats(1.0, 4.0)))
    return V, k, sp, ap, vl, probs, tokens, seed, mode


@FUZZ
@given(case=steps())
def test_verification_step_invariants(case):
    V, k, sp, ap, vl, probs, tokens, seed, mode = case
    s = NativeSampler(V, sp, ap, seed)
    r = s.verify(probs, tokens, vl)
    assert 0 <= r.n_accepted <= k
    assert r.n_evaluated == (k if r.n_accepted == k else r.n_accepted + 1)
    assert 0 <= r.next_token < V
    assert not math.isnan(r.kl_sum) and not math.isnan(r.kl_max)
    assert r.kl_sum >= 0 and r.kl_max >= 0
    assert r.kl_max <= r.kl_sum * (1 + 1e-12) or r.kl_max == math.inf
    q = [ref_warp(vl[i], V, sp) for i in range(k + 1)]
    # no rule emits what the verifier forbids (q = 0), drafted or not; KL(h || q) stays finite
    assert r.kl_max < math.inf
    for i in range(r.n_accepted):
        assert q[i][tokens[i]] > 0, f"accepted draft {i} (id {tokens[i]}) has q = 0"
    assert q[r.n_accepted][r.next_token] > 0
    if mode == "same" and ap.method in ("sps", "cactus"):
        assert r.n_accepted == k  # p = q: u p[n] < h[n] always (h[n] >= q[n] = p[n] > 0)
    if not sp.temperature > 0 and ap.method in ("sps", "cactus", "typical", "greedy"):
        # one-hot q: exact match with the argmax, then the argmax
        arg = [int(np.argmax(vl[i])) for i in range(k + 1)]
        n_match = next((i for i in range(k) if tokens[i] != arg[i]), k)
        if ap.method in ("typical", "greedy") or mode not in ("arbitrary", "scaled"):
            assert r.n_accepted == n_match
        else:  # p[n] may exceed 1 (unnormalised rows): a match can still be rejected
            assert r.n_accepted <= n_match
        assert r.next_token == arg[r.n_accepted]
    # the same seed replays the step exactly
    assert NativeSampler(V, sp, ap, seed).verify(probs, tokens, vl) == r


@settings(max_examples=150, deadline=None, derandomize=True)
@given(data=st.data(), V=st.integers(2, 40), k=st.integers(1, 5),
       sp=st.builds(SamplingParams, temperature=st.floats(0.3, 3.0), top_k=st.integers(0, 8),
                    top_p=st.floats(0.1, 0.95), min_p=st.one_of(st.just(0.0), st.floats(0, 0.5))),
       method=st.sampled_from(["sps", "cactus"]))
def test_draft_and_verifier_warps_are_identical(data, V, k, sp, method):
    """A draft that is the verifier (p = q after the same top-k / top-p / min-p / temperature, and
    the drafted token sampled from that very p) is always accepted, with any seed: any difference
    in how the two sides are warped would show up as rejections."""
    vl = data.draw(logits_rows(k + 1, V))
    for seed in range(10):
        s = NativeSampler(V, sp, AcceptanceParams(method, delta=0.0), seed)
        probs = np.zeros((k, V), np.float32)
        tokens = np.array([s.draft(vl[i], probs[i]) for i in range(k)], np.int32)
        r = s.verify(probs, tokens, vl)
        assert r.n_accepted == k, (seed, r)
        assert ref_warp(vl[k], V, sp)[r.next_token] > 0


@FUZZ
@given(data=st.data(), V=st.integers(1, 40), k=st.integers(0, 4), sp=sampling_params,
       ap=acceptance_params, bad=st.sampled_from([np.nan, np.inf, "all-neg-inf"]))
def test_non_finite_logits_are_an_error_never_a_token(data, V, k, sp, ap, bad):
    vl = data.draw(logits_rows(k + 1, V))
    j = data.draw(st.integers(0, V - 1))
    if bad == "all-neg-inf":
        vl[0, :] = -np.inf
    else:
        vl[0, j] = bad  # row 0 is always needed (the first test or the bonus)
    s = NativeSampler(V, sp, ap, 1)
    tokens = np.zeros(k, np.int32)
    with pytest.raises(NonFiniteLogitsError):
        s.verify(None, tokens, vl)
    probs = np.empty(V, np.float32)
    for call in (lambda: s.warp(vl[0]), lambda: s.sample(vl[0]), lambda: s.draft(vl[0], probs)):
        with pytest.raises(NonFiniteLogitsError):
            call()
    if k:  # a NaN / inf in a draft row is a bad distribution
        p = np.full((k, V), 1.0 / V, np.float32)
        p[k - 1, j] = np.nan if bad == "all-neg-inf" else bad
        with pytest.raises(BadDistributionError):
            s.verify(p, tokens, np.zeros((k + 1, V), np.float32))


def allowed_rows(rng, vl: np.ndarray, density: float) -> np.ndarray:
    """bool [rows, V]: random masks, each row keeping at least one finite logit allowed."""
    m = rng.random(vl.shape) < density
    for i in range(vl.shape[0]):
        m[i, rng.choice(np.flatnonzero(np.isfinite(vl[i])))] = True
    return m


@FUZZ
@given(data=st.data(), V=st.integers(1, 48), sp=sampling_params, density=st.sampled_from([0.1, 0.5, 1.0]))
def test_masked_warp_is_the_warp_of_the_minus_inf_row(data, V, sp, density):
    n = data.draw(st.integers(1, V), label="n_logits")
    row = data.draw(logits_rows(1, n))[0]
    m = allowed_rows(np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))), row[None], density)[0]
    mask = np.zeros(V, bool)
    mask[:n] = m
    s = NativeSampler(V, sp, AcceptanceParams(), 0)
    p = s.warp(row, allowed=pack_allowed(mask))
    substituted = np.where(m, row, -np.inf).astype(np.float32)
    np.testing.assert_array_equal(p, s.warp(substituted))
    assert_distribution(p, substituted, sp)
    assert not p[~mask].any()


@FUZZ
@given(case=steps(), data=st.data())
def test_masked_steps_are_the_minus_inf_steps_and_emit_only_allowed_tokens(case, data):
    V, k, sp, ap, vl, probs, tokens, seed, _ = case
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    masks = allowed_rows(rng, vl, data.draw(st.sampled_from([0.1, 0.5, 0.9])))
    r = NativeSampler(V, sp, ap, seed).verify(probs, tokens, vl, allowed=pack_allowed(masks))
    substituted = np.where(masks, vl, -np.inf).astype(np.float32)
    assert NativeSampler(V, sp, ap, seed).verify(probs, tokens, substituted) == r
    # whatever the draft proposed (p is not masked here), only allowed tokens come out
    assert all(masks[i, tokens[i]] for i in range(r.n_accepted))
    assert masks[r.n_accepted, r.next_token]


# ---- randomness ------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=steps(), other_seed=st.integers(0, 2**64 - 1))
def test_same_seed_same_trace_and_samplers_never_share_state(case, other_seed):
    V, k, sp, ap, vl, probs, tokens, seed, _ = case

    def trace(s, interleave=None):
        out = []
        for _ in range(6):
            out.append((s.verify(probs, tokens, vl), s.sample(vl[0])))
            if interleave is not None:  # another sampler drawing in between
                interleave.verify(probs, tokens, vl)
                interleave.sample(vl[-1])
        return out

    alone = trace(NativeSampler(V, sp, ap, seed))
    assert trace(NativeSampler(V, sp, ap, seed)) == alone
    assert trace(NativeSampler(V, sp, ap, seed), NativeSampler(V, sp, ap, other_seed)) == alone
    assert trace(NativeSampler(V, sp, ap, seed), NativeSampler(V, sp, ap, seed)) == alone


# ---- found by the fuzzing above ---------------------------------------------------------------------

@pytest.mark.parametrize("delta", [5e-324, 1e-300, 1e-40, 1e-20])
@pytest.mark.parametrize("q", [0.26894143, 0.5, 0.7310586, 1e-6])
def test_tiny_budgets_keep_kl_non_negative_and_within_budget(q, delta):
    """Regression: the binary KL lost ~1e-17 to cancellation when gamma is near q[n], so a tiny
    delta gave a negative reported KL and an exact-solver gamma ~1e-9 above q[n] (KL ~1e-17 >> delta)."""
    from cactus_gguf.sampling import cactus_gamma

    g = cactus_gamma(q, delta, "exact")
    # for tiny delta the root is q + sqrt(2 delta q (1 - q)) (the Taylor form), to float resolution
    gap = math.sqrt(2 * delta * q * (1 - q))
    assert q <= g and abs((g - q) - gap) <= 1e-3 * gap + 4 * np.spacing(q)
    V = 2
    vl = np.log(np.array([[q, 1 - q]] * 3)).astype(np.float32)
    s = NativeSampler(V, SamplingParams(1.0, 0, 1.0, 0.0), AcceptanceParams("cactus", delta, "exact"), 0)
    p = np.stack([s.warp(vl[0])] * 2)
    r = s.verify(p, np.array([0, 0], np.int32), vl)
    assert r.n_accepted == 2 and 0.0 <= r.kl_max <= r.kl_sum <= 2 * max(delta * 1.01, 1e-30)
