"""Plain NumPy reference of the native helper's math, for tests (slow, simple, independent).

Dimension letters: V = vocabulary size, k = draft length. Names follow native/cactus_native.h:
p = draft distribution, q = verifier distribution (both warped), n = drafted token, h = target.

Conventions mirrored from the C in native/ so that, fed the same uniforms, the reference makes
the same decisions:
- warped rows are rounded to float32 (the C stores probabilities as float32), all else is float64;
- sums are sequential in token-id order (np.cumsum, not the pairwise np.sum);
- inverse-CDF draw: the first i whose running sum exceeds u * total, else the last positive index;
- acceptance test u < min(1, h[n] / p[n]) is evaluated as u * p[n] < h[n];
- uniforms are consumed in the order documented in native/cactus_native.h (cg_verify);
- an allowed-token mask sets the disallowed logits to -inf before any warp (after the NaN / +inf
  check of the row as given), and a row left with no finite logit is an EmptyMask error.

Independent of the C: the warp sorts (np.lexsort) instead of radix-selecting, and the exact Cactus
gamma is found by plain bisection instead of safeguarded Newton.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..options import default

# ---------------------------------------------------------------------------------------------
# RNG: xoshiro256** seeded by splitmix64, in Python integers
# ---------------------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _rotl(x: int, s: int) -> int:
    return ((x << s) | (x >> (64 - s))) & _M64


class XoshiroRef:
    """Pure-Python xoshiro256** (Blackman & Vigna) with splitmix64 seeding."""

    def __init__(self, seed: int) -> None:
        x = seed & _M64
        self.s = []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & _M64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
            self.s.append(z ^ (z >> 31))

    def next_u64(self) -> int:
        s = self.s
        result = (_rotl((s[1] * 5) & _M64, 7) * 9) & _M64
        t = (s[1] << 17) & _M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result

    def uniform(self) -> float:
        return (self.next_u64() >> 11) * 2.0**-53


# ---------------------------------------------------------------------------------------------
# Warp
# ---------------------------------------------------------------------------------------------


def f32(x: float) -> float:
    """The value a float32 C struct field holds."""
    return float(np.float32(x))


class EmptyMask(ValueError):
    """The allowed-token mask leaves no finite logit (the C's CG_ERR_EMPTY_MASK)."""


def allowed_bool(allowed: np.ndarray, n: int) -> np.ndarray:
    """An allowed-token mask as bool [n]: from bool [>= n], or from the C's uint32 bitmask
    [ceil(V / 32)] (bit i % 32 of word i // 32 is token i, read by that definition)."""
    a = np.asarray(allowed)
    if a.dtype == np.bool_:
        return a[:n].copy()
    if a.dtype != np.uint32:
        raise ValueError("allowed must be bool [V] or a uint32 bitmask [ceil(V/32)]")
    i = np.arange(n)
    return ((a[i // 32] >> (i % 32).astype(np.uint32)) & np.uint32(1)).astype(bool)


def warp(logits: np.ndarray, n_vocab: int, temperature: float, top_k: int, top_p: float,
         min_p: float, allowed: np.ndarray | None = None) -> np.ndarray:
    """Warped distribution, float32 [V]: top-k -> top-p -> min-p -> temperature (llama.cpp order).

    logits: float [n <= V]. Params are taken as the float32 values the C struct holds.
    allowed: None, bool [V] or a uint32 bitmask [ceil(V / 32)]: disallowed tokens get logit -inf.
    Raises ValueError on NaN / +inf (anywhere, allowed or not), or when every logit is -inf;
    EmptyMask (a ValueError) when no allowed token has a finite logit.
    """
    temperature, top_p, min_p = f32(temperature), f32(top_p), f32(min_p)
    l = np.asarray(logits, dtype=np.float32).astype(np.float64)
    n = l.shape[0]
    if np.isnan(l).any() or np.isposinf(l).any() or not np.isfinite(l).any():
        raise ValueError("non-finite logits")
    if allowed is not None:
        l = np.where(allowed_bool(allowed, n), l, -np.inf)
        if not np.isfinite(l).any():
            raise EmptyMask("no allowed token has a finite logit")
    out = np.zeros(n_vocab, dtype=np.float64)
    m = l.max()
    if not temperature > 0:
        out[int(np.argmax(l))] = 1.0  # np.argmax: the first (lowest id) maximum
        return out.astype(np.float32)
    ids = np.arange(n)
    order = np.lexsort((ids, -l))  # value descending, id ascending
    kept = order[np.isfinite(l[order])]
    if 0 < top_k < kept.size:
        kept = kept[:top_k]
    if top_p < 1.0:
        e = np.exp(l[kept] - m)
        z = np.cumsum(e)[-1]
        c = np.cumsum(e / z)
        hit = np.nonzero(c >= top_p)[0]
        if hit.size:
            kept = kept[: hit[0] + 1]
    if min_p > 0.0:
        kept = kept[l[kept] - m >= math.log(min_p)]  # s_i >= min_p s_max  <=>  l_i - m >= log min_p
    e = np.exp((l[kept] - m) * (1.0 / temperature))
    out[kept] = e / e.sum()
    return out.astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Sampling, Cactus gamma, KL
# ---------------------------------------------------------------------------------------------


def pick(w: np.ndarray, u: float) -> int:
    """Inverse-CDF draw from non-negative weights w (float64) with uniform u."""
    c = np.cumsum(w)
    i = int(np.searchsorted(c, u * c[-1], side="right"))  # first i with c[i] > u * total
    if i >= w.shape[0]:
        i = int(np.nonzero(w > 0)[0][-1])  # last-index fallback against rounding
    return i


def binary_kl(g: float, q: float) -> float:
    a = 0.0 if g == 0.0 else (math.inf if q == 0.0 else g * math.log(g / q))
    b = 0.0 if g == 1.0 else (math.inf if q == 1.0 else (1.0 - g) * math.log((1.0 - g) / (1.0 - q)))
    return a + b


def gamma_taylor(q: float, delta: float) -> float:
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    return min(1.0, q + math.sqrt(2.0 * delta * q * (1.0 - q)))


def gamma_exact(q: float, delta: float) -> float:
    """Root in [q, 1] of binary_kl(g, q) = delta by bisection (or 1 if -log q <= delta)."""
    if q <= 0.0:
        return 0.0
    if q >= 1.0:
        return 1.0
    if delta == 0.0:
        return q
    if -math.log(q) <= delta:
        return 1.0
    lo, hi = q, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if binary_kl(mid, q) > delta:
            hi = mid
        else:
            lo = mid
    return 0.5 * (lo + hi)


def gamma(q: float, delta: float, solver: str) -> float:
    return gamma_taylor(q, delta) if solver == "taylor" else gamma_exact(q, delta)


def gap_delta(q: np.ndarray, n: int, delta: float, top_gap: float) -> float:
    """Cactus's budget for draft n under top_gap: delta when q[n] >= max(q) exp(-top_gap), else 0."""
    if top_gap == math.inf:
        return delta
    return delta if q[n] >= float(np.float32(q.max())) * math.exp(-top_gap) else 0.0


def target(q: np.ndarray, n: int, method: str, delta: float, solver: str,
           top_gap: float = math.inf) -> np.ndarray:
    """The acceptance target h for drafted token n: q for SpS (and greedy); for Cactus h[n] = gamma,
    h[i] = q[i] (1 - gamma) / (1 - q[n]) elsewhere (q itself when gamma = q[n]); under ``top_gap``
    a draft far below the verifier's top gets delta 0 (h = q)."""
    h = q.copy()
    delta = gap_delta(q, n, delta, top_gap) if method == "cactus" else delta
    if method == "cactus":
        g = gamma(q[n], delta, solver)
        if g != q[n]:
            h = q * ((1.0 - g) / (1.0 - q[n]))
            h[n] = g
    return h


def top_set(q: np.ndarray, kk: int) -> np.ndarray:
    """Ids of the top kk entries of q with q > 0, ties -> lower id."""
    kk = min(kk, q.shape[0])
    top = np.lexsort((np.arange(q.shape[0]), -q))[:kk]
    return top[q[top] > 0]


# ---------------------------------------------------------------------------------------------
# One verification step
# ---------------------------------------------------------------------------------------------


@dataclass
class Step:
    n_accepted: int
    next_token: int
    n_evaluated: int
    kl_sum: float
    kl_max: float
    n_uniforms: int


class _Uniforms:
    """The uniforms a step draws, in the C's order, counted (``used``)."""

    def __init__(self, uniforms: Iterator[float] | None) -> None:
        self._it = uniforms
        self.used = 0

    def __call__(self) -> float:
        self.used += 1
        return next(self._it)


def _rescaled_residual(r: np.ndarray, fallback: np.ndarray, v: float) -> int:
    """The residual token: drawn from ``r`` (float64 [V]) with uniform v, or from ``fallback`` when
    r is all zero."""
    return pick(r if np.cumsum(r)[-1] > 0 else fallback, v)


def _test_position(method: str, p: np.ndarray, q: np.ndarray, n: int, d: float, draw: _Uniforms,
                   rule: dict) -> tuple[bool, int, float]:
    """The acceptance test at one drafted position: (accepted, emitted token, KL charged).

    p, q: float64 [V] draft and warped verifier distributions; n: the drafted token; d: the
    Cactus budget here; rule: solver, typical_epsilon, typical_alpha, accept_top_k, ears_alpha,
    top_gap. Draws one uniform, and one more for a residual.
    """
    u = draw()
    if method in ("sps", "cactus"):
        h = target(q, n, method, d, rule["solver"], rule["top_gap"])
        kl = binary_kl(h[n], q[n]) if method == "cactus" else 0.0
        if u * p[n] < h[n]:
            return True, n, kl
        return False, _rescaled_residual(np.maximum(h - p, 0.0), h, draw()), kl
    if method == "typical":
        pos = q[q > 0]
        entropy = float(-np.cumsum(pos * np.log(pos))[-1])
        thr = min(rule["typical_epsilon"], rule["typical_alpha"] * math.exp(-entropy))
        accepted = q[n] > thr
        token = n if accepted else int(np.argmax(q))
        return accepted, token, -math.log(q[token])
    if method == "topk":
        top = top_set(q, rule["accept_top_k"])
        kk = top.size
        kl = max(0.0, float(-np.log(kk * q[top]).sum() / kk))
        ind = np.zeros(q.shape[0])
        ind[top] = 1.0
        if ind[n]:
            return True, n, kl
        r = np.where(ind > 0, np.maximum(1.0 - p, 0.0), 0.0)
        return False, _rescaled_residual(r, ind, draw()), kl
    if method == "greedy":
        token = pick(q, u)
        return token == n, token, 0.0
    if method == "ears":
        q_max = float(np.float32(q.max()))  # alpha (1 - max q): 0 at one-hot q, any alpha
        thr = 0.0 if q_max >= 1.0 else rule["ears_alpha"] * (1.0 - q_max)
        if q[n] > 0 and u * p[n] < (q[n] + thr * p[n] if p[n] > 0 else q[n]):
            return True, n, 0.0
        return False, _rescaled_residual(np.maximum(q - p, 0.0), q, draw()), 0.0
    raise ValueError(method)


def verify(draft_probs: np.ndarray | None, draft_tokens: np.ndarray, verifier_logits: np.ndarray,
           sampling: dict, method: str, delta: float = default("delta"),
           solver: str = default("solver"),
           typical_epsilon: float = default("typical_epsilon"),
           typical_alpha: float = default("typical_alpha"), accept_top_k: int = default("accept_top_k"),
           uniforms: Iterator[float] | None = None, allowed: np.ndarray | None = None,
           ears_alpha: float = default("ears_alpha"), top_gap: float = math.inf,
           end_set: np.ndarray | None = None, end_tau: float = 2.0) -> Step:
    """One draft-verify step (see cactus_native.h), consuming `uniforms` in the C's order.

    draft_probs: float32 [k, V] or None (one-hot drafter); draft_tokens: int [k];
    verifier_logits: float32 [k+1, V]; sampling: kwargs of `warp` (without n_vocab);
    allowed: None, or k+1 masks (bool [k+1, V] or uint32 [k+1, ceil(V / 32)]), row i for row i.
    end_set, end_tau: protected ends (bool [V] end set, threshold): see ``protected_delta``.
    """
    k = int(draft_tokens.shape[0])
    V = verifier_logits.shape[-1]
    draw = _Uniforms(uniforms)
    rule = dict(solver=solver, typical_epsilon=typical_epsilon, typical_alpha=typical_alpha,
                accept_top_k=accept_top_k, ears_alpha=ears_alpha, top_gap=top_gap)
    kl_sum = kl_max = 0.0
    masks = [None] * (k + 1) if allowed is None else [allowed[i] for i in range(k + 1)]
    for i in range(k):
        q = warp(verifier_logits[i], V, **sampling, allowed=masks[i]).astype(np.float64)
        n = int(draft_tokens[i])
        if draft_probs is None:
            p = np.zeros(V)
            p[n] = 1.0
        else:
            p = draft_probs[i].astype(np.float64)
        d = delta
        if method == "cactus" and end_set is not None:
            d = protected_delta(draft_probs[i] if draft_probs is not None else None, q, delta, solver,
                                end_set, end_tau, top_gap, drafted=n)
        accepted, token, kl = _test_position(method, p, q, n, d, draw, rule)
        kl_sum += kl
        kl_max = max(kl_max, kl)
        if not accepted:
            return Step(i, token, i + 1, kl_sum, kl_max, draw.used)
    q = warp(verifier_logits[k], V, **sampling, allowed=masks[k]).astype(np.float64)
    token = pick(q, draw())
    return Step(k, token, k, kl_sum, kl_max, draw.used)


def emitted_first_token_distribution(p: np.ndarray | None, q: np.ndarray, method: str,
                                     delta: float = default("delta"), solver: str = default("solver"),
                                     typical_epsilon: float = default("typical_epsilon"),
                                     typical_alpha: float = default("typical_alpha"),
                                     accept_top_k: int = 5, drafted: int | None = None,
                                     ears_alpha: float = default("ears_alpha"),
                                     top_gap: float = math.inf,
                                     end_set: np.ndarray | None = None,
                                     end_tau: float = 2.0) -> np.ndarray:
    """Analytic law of the token emitted at a position (Hao & Mou 2026, arXiv:2604.04987; the
    mixture law of the emitted token):

    P(x) = sum_n p[n] (1[x = n] a_n + (1 - a_n) r_n[x]),  a_n = acceptance prob., r_n = residual law.
    p: float [V] draft distribution, or None with `drafted` for a one-hot drafter. Cactus with
    ``end_set`` (bool [V]): at the budget ``protected_delta`` picks.
    """
    if method == "cactus" and end_set is not None:
        delta = protected_delta(p, q, delta, solver, end_set, end_tau, top_gap, drafted)
    V = q.shape[0]
    q = q.astype(np.float64)
    if p is None:
        p = np.zeros(V)
        p[drafted] = 1.0
    p = p.astype(np.float64)
    out = np.zeros(V)
    for n in np.nonzero(p > 0)[0]:
        if method in ("sps", "cactus", "greedy"):
            h = target(q, n, method, delta, solver, top_gap)
            a = min(1.0, h[n] / p[n])
            r = np.maximum(h - p, 0.0)
            r = r / r.sum() if r.sum() > 0 else h
            if method == "greedy":  # x ~ q, accept iff x = n: emitted token ~ q whatever n
                a, r = 0.0, q
        elif method == "typical":
            pos = q[q > 0]
            thr = min(typical_epsilon, typical_alpha * math.exp(-float(-(pos * np.log(pos)).sum())))
            a = 1.0 if q[n] > thr else 0.0
            r = np.zeros(V)
            r[int(np.argmax(q))] = 1.0
        elif method == "topk":
            ind = np.zeros(V)
            ind[top_set(q, accept_top_k)] = 1.0
            a = ind[n]
            r = np.maximum(ind - p, 0.0)
            r = r / r.sum() if r.sum() > 0 else ind / ind.sum()
        elif method == "ears":  # EARS (arXiv:2512.13194), never a token q excludes
            q_max = float(np.float32(q.max()))  # alpha (1 - max q): 0 at one-hot q, any alpha
            thr = 0.0 if q_max >= 1.0 else ears_alpha * (1.0 - q_max)
            a = min(1.0, q[n] / p[n] + thr) if q[n] > 0 else 0.0
            r = np.maximum(q - p, 0.0)
            r = r / r.sum() if r.sum() > 0 else q
        else:
            raise ValueError(method)
        out += p[n] * a * np.eye(V)[n] + p[n] * (1.0 - a) * r
    return out


def kl(P: np.ndarray, q: np.ndarray) -> float:
    """KL(P || q) in nats, 0 log 0 = 0 (+inf where P > 0 = q)."""
    P, q = np.asarray(P, np.float64), np.asarray(q, np.float64)
    on = P > 0
    if np.any(q[on] == 0):
        return math.inf
    return float(np.sum(P[on] * np.log(P[on] / q[on])))


END_TOLERANCE = 1e-6  # native/law.c CG_END_TOLERANCE: P(E) = q(E) ties stay on one side


def protected_delta(p: np.ndarray | None, q: np.ndarray, delta: float, solver: str,
                    end_set: np.ndarray, end_tau: float, top_gap: float = math.inf,
                    drafted: int | None = None) -> float:
    """Protected ends (native/law.c): where q(E) >= end_tau and q(E) > 0, delta only if the law
    at delta keeps P(E) >= q(E) - END_TOLERANCE, else 0 (SpS); delta elsewhere."""
    q64 = q.astype(np.float64)
    q_end = float(q64[end_set].sum())
    if not delta > 0 or not q_end > 0 or q_end < end_tau:
        return delta
    law = emitted_first_token_distribution(p, q, "cactus", delta, solver, drafted=drafted,
                                           top_gap=top_gap)
    return delta if law[end_set].sum() >= q_end - END_TOLERANCE else 0.0


def output_budget_delta(p: np.ndarray | None, q: np.ndarray, delta: float, solver: str,
                        drafted: int | None = None, steps: int = 20) -> float:
    """The per-draft budget delta' of the output budget, by the rule native/law.c documents:
    delta itself if its law already keeps KL(P || q) <= delta, else ``steps`` bisections on
    [0, delta] keeping only feasible points. Built on emitted_first_token_distribution (the direct
    O(V^2) mixture), not on the C's sorted sums."""
    def kl_at(d: float) -> float:
        return kl(emitted_first_token_distribution(p, q, "cactus", d, solver, drafted=drafted), q)

    if delta == 0.0 or kl_at(delta) <= delta:
        return delta
    lo, hi = 0.0, delta
    for _ in range(steps):
        mid = 0.5 * (lo + hi)
        if kl_at(mid) <= delta:
            lo = mid
        else:
            hi = mid
    return lo
