"""Native sampling helper: a thin ctypes facade over the C library of native/ (its contract:
native/cactus_native.h; the maths: docs/maths.md).

Dimension letters: ``V`` = vocabulary size, ``k`` = draft length (tokens proposed per step).

Glossary (the same as in ``native/cactus_native.h``):

- ``p``: the draft distribution at a position, ``q``: the verifier's, both after the same warps.
- drafted: the token ``n`` the draft sampled from ``p``; accepted: a drafted token kept by the test.
- residual: on the first rejection, a token drawn from ``norm(max(0, h - p))``.
- bonus: when all ``k`` drafts are accepted, a token drawn from ``q`` at position ``k + 1``.
- acceptance length (AL): accepted drafts in one step, ``0..k``.
- ``h``: the target the acceptance test uses (``q`` for SpS, the Cactus target for Cactus).

Rules: Y. Hao, L. Mou, "Cactus: Accelerating Auto-Regressive Decoding with Constrained Acceptance
Speculative Sampling", ICLR 2026, arXiv:2604.04987; SpS: Leviathan et al. 2023, Chen et al. 2023.

Everything per token (warp, sample, verify) runs in C on caller-visible buffers; this module checks
dtypes and shapes, passes pointers, and maps each C status code to its own exception.

Allowed-token masks (optional, for grammar-constrained decoding): ``allowed`` is a uint32 bitmask of
``W = ceil(V / 32)`` words per row, bit ``i % 32`` of word ``i // 32`` set = token ``i`` allowed
(``pack_allowed`` builds it from a boolean array). A disallowed token is treated exactly like a
``-inf`` logit, so every warped row is a distribution over the allowed tokens only.
"""
from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

import numpy as np

from .errors import (CG_OK, BadDistributionError, EmptyMaskError, NativeArgumentError,
                     NativeError, NonFiniteLogitsError, raise_status)
from ._clib import (BUDGET_VALUES, METHOD_VALUES, SOLVER_VALUES, _AcceptParamsC, _LawC, _RngC,
                    _SamplerParamsC, _StepResultC, _cactus_gamma, _emitted_law, _rng_seed,
                    _rng_uniform, _verify, _warp, _warp_sample, _workspace_size)
from .params import SOLVERS, AcceptanceParams, SamplingParams

__all__ = [
    "AcceptanceParams",
    "BadDistributionError",
    "EmptyMaskError",
    "Law",
    "NativeArgumentError",
    "NativeError",
    "NativeSampler",
    "NonFiniteLogitsError",
    "Rng",
    "SamplingParams",
    "StepResult",
    "binary_kl",
    "cactus_gamma",
    "pack_allowed",
]


_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)
_U32 = np.dtype(np.uint32)


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


# ---------------------------------------------------------------------------------------------
# Configuration and results
# ---------------------------------------------------------------------------------------------


# Fields whose C type is an enum: the record holds the option's name, C the library's value for it.
_ENUM_FIELDS = {"method": METHOD_VALUES, "solver": SOLVER_VALUES, "budget": BUDGET_VALUES}


def c_params(ctype: type[ctypes.Structure], record) -> ctypes.Structure:
    """The C struct ``ctype`` filled by field name from the same-named fields of ``record`` (a
    SamplingParams or AcceptanceParams): enum fields through the library's name -> value maps,
    booleans as 0 / 1, arrays as their address (the record keeps them alive). Every C field must have its record field and the other way round, so a
    field added on one side only fails here, not silently in C."""
    c_fields = [name for name, _ in ctype._fields_]
    r_fields = [f.name for f in dataclass_fields(record)]
    if sorted(c_fields) != sorted(r_fields):
        raise TypeError(f"{type(record).__name__} fields {r_fields} do not match "
                        f"{ctype.__name__} fields {c_fields}")
    values = {}
    for name in c_fields:
        value = getattr(record, name)
        values[name] = (_ENUM_FIELDS[name][value] if name in _ENUM_FIELDS
                        else int(value) if isinstance(value, bool)
                        else _addr(value) if isinstance(value, np.ndarray)  # read in place by C
                        else value)
    return ctype(**values)


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outcome of one verification step.

    - ``n_accepted``: acceptance length AL, accepted drafts ``0..k``.
    - ``next_token``: the residual token (``n_accepted < k``) or the bonus token (``n_accepted == k``).
    - ``n_evaluated``: drafted positions that went through the test, ``min(AL + 1, k)``.
    - ``kl_sum``, ``kl_max``: sum and max over evaluated positions of KL(h || q), nats (max 0 if
      none): the divergence of each drafted token's *target*, what the paper's delta bounds.
    - ``output_kl_sum``, ``output_kl_max``: the same for KL(P || q), P the law of the token each
      evaluated position emits (``NativeSampler.emitted_law``): what the output actually diverges.
    - ``delta_sum``: Cactus, sum over evaluated positions of the per-draft budget used (delta for
      ``budget="target"``, the delta' <= delta searched for ``"output"``); else 0.
    """

    n_accepted: int
    next_token: int
    n_evaluated: int
    kl_sum: float
    kl_max: float
    output_kl_sum: float = 0.0
    output_kl_max: float = 0.0
    delta_sum: float = 0.0


@dataclass(frozen=True, slots=True)
class Law:
    """The law of the token one drafted position emits (accepted draft or residual).

    - ``probs``: float64 [V], P(x) = sum_n p[n] (1[x = n] a_n + (1 - a_n) r_n[x])
      (docs/maths.md, "The emitted law").
    - ``kl``: KL(P || q) in nats (0 for sps and greedy, where P = q).
    - ``acceptance``: the chance the drafted token is accepted, sum_n p[n] a_n.
    - ``delta``: Cactus, the per-draft budget the position used; else 0.
    """

    probs: np.ndarray
    kl: float
    acceptance: float
    delta: float


# ---------------------------------------------------------------------------------------------
# RNG
# ---------------------------------------------------------------------------------------------


def _check_seed(seed) -> int:
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


class Rng:
    """The C generator (xoshiro256** seeded by splitmix64) as an object; for tests and tools.

    ``Rng(seed)`` gives the stream a ``NativeSampler`` with the same seed consumes.
    """

    __slots__ = ("_c",)

    def __init__(self, seed: int) -> None:
        self._c = _RngC()
        _rng_seed(ctypes.addressof(self._c), _check_seed(seed))

    def uniform(self) -> float:
        """One uniform double in [0, 1) (53 random bits)."""
        return _rng_uniform(ctypes.addressof(self._c))

    def uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` uniforms: float64 [n]."""
        a = ctypes.addressof(self._c)
        return np.array([_rng_uniform(a) for _ in range(n)], dtype=np.float64)

    def copy(self) -> Rng:
        """An independent generator at the same point of the stream."""
        other = Rng.__new__(Rng)
        other._c = _RngC()
        ctypes.pointer(other._c)[0] = self._c
        return other

    @property
    def state(self) -> tuple[int, int, int, int]:
        """The four 64-bit words of the xoshiro256** state."""
        return tuple(self._c.s)


# ---------------------------------------------------------------------------------------------
# Sampler
# ---------------------------------------------------------------------------------------------


def _check_logits_row(logits, n_vocab: int, name: str = "logits") -> None:
    if (
        type(logits) is not np.ndarray
        or logits.dtype != _F32
        or logits.ndim != 1
        or not 1 <= logits.shape[0] <= n_vocab
        or not logits.flags.c_contiguous
    ):
        raise ValueError(f"{name} must be a C-contiguous float32 array [n], 1 <= n <= V={n_vocab}")


def _check_probs_out(out, logits: np.ndarray, n_vocab: int, name: str) -> None:
    if (
        type(out) is not np.ndarray
        or out.dtype != _F32
        or out.shape != (n_vocab,)
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(f"{name} must be a writable C-contiguous float32 array [V={n_vocab}]")
    if np.may_share_memory(out, logits):
        raise ValueError(f"{name} must not overlap logits (the warp uses it as scratch)")


def mask_words(n_vocab: int) -> int:
    """Words per row of an allowed-token mask over ``n_vocab`` tokens: ``ceil(n_vocab / 32)``."""
    return (n_vocab + 31) // 32


def pack_allowed(allowed) -> np.ndarray:
    """Pack a boolean array ``[..., V]`` (True = allowed) into the C bitmask ``uint32 [..., ceil(V/32)]``.

    Bit ``i % 32`` of word ``i // 32`` is token ``i``; the padding bits past V are 0. The result is
    C-contiguous, ready for the ``allowed=`` argument of ``NativeSampler`` (one row, or ``k + 1``
    rows for ``verify``).
    """
    a = np.asarray(allowed)
    if a.dtype != np.bool_ or a.ndim < 1:
        raise ValueError("allowed must be a boolean array [..., V]")
    n_vocab = a.shape[-1]
    padded = np.zeros(a.shape[:-1] + (32 * mask_words(n_vocab),), dtype=np.uint8)
    padded[..., :n_vocab] = a
    packed = np.packbits(padded, axis=-1, bitorder="little")  # byte j: tokens 8j .. 8j + 7
    return np.ascontiguousarray(packed).view("<u4").astype(_U32)


def _allowed_addr(allowed: np.ndarray, shapes: tuple, what: str) -> int:
    """The address of a checked (not None) mask."""
    if (
        type(allowed) is not np.ndarray
        or allowed.dtype != _U32
        or allowed.shape not in shapes
        or not allowed.flags.c_contiguous
        or not allowed.flags.aligned
    ):
        got = (f"{allowed.dtype} {allowed.shape}" if type(allowed) is np.ndarray
               else type(allowed).__name__)
        raise ValueError(
            f"allowed must be None or a C-contiguous uint32 bitmask {what} (see pack_allowed); "
            f"got {got}"
        )
    return _addr(allowed)


def _row_mask_addr(allowed, n_vocab: int) -> int:
    """The address of a checked one-row mask, or 0 (NULL) for None."""
    if allowed is None:
        return 0
    w = mask_words(n_vocab)
    return _allowed_addr(allowed, ((w,),), f"[ceil(V/32)={w}]")


class NativeSampler:
    """Warping, sampling and draft verification for one decoding stream.

    Owns its RNG state (seeded from ``seed``; two samplers never share state) and one preallocated
    workspace, so the per-token calls allocate nothing (except ``warp``, which returns a new array).
    Not thread-safe: use one sampler per stream.

    Args:
        n_vocab: V, the verifier's vocabulary size (>= 1).
        sampling: the warps applied to both the draft and the verifier logits.
        acceptance: the acceptance rule used by ``verify``.
        seed: integer in [0, 2**64).
    Raises:
        ValueError: on an invalid argument.
    """

    __slots__ = (
        "_n_vocab", "_sampling", "_acceptance", "_rng", "_rng_p", "_sp", "_sp_p", "_ap", "_ap_p",
        "_work", "_work_p", "_probs", "_probs_p", "_tok", "_tok_p", "_res", "_res_p",
    )

    def __init__(
        self, n_vocab: int, sampling: SamplingParams, acceptance: AcceptanceParams, seed: int
    ) -> None:
        if not _is_int(n_vocab) or not 1 <= n_vocab < 2**31:
            raise ValueError(f"n_vocab must be an integer in [1, 2**31), got {n_vocab!r}")
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        if not isinstance(acceptance, AcceptanceParams):
            raise ValueError(f"acceptance must be an AcceptanceParams, got {type(acceptance).__name__}")
        self._n_vocab = int(n_vocab)
        self._sampling = sampling
        self._acceptance = acceptance
        self._rng = Rng(seed)
        self._rng_p = ctypes.addressof(self._rng._c)
        self._sp = c_params(_SamplerParamsC, sampling)  # built once: every call passes its address
        self._sp_p = ctypes.addressof(self._sp)
        if acceptance.end_mask is not None and acceptance.end_mask.shape != (mask_words(n_vocab),):
            raise ValueError(f"end_mask must have ceil(V / 32) = {mask_words(n_vocab)} words, got "
                             f"{acceptance.end_mask.shape}")
        self._ap = c_params(_AcceptParamsC, acceptance)
        self._ap_p = ctypes.addressof(self._ap)
        self._work = np.empty(_workspace_size(self._n_vocab), dtype=np.float32)
        self._work_p = _addr(self._work)
        self._probs = np.empty(self._n_vocab, dtype=np.float32)
        self._probs_p = _addr(self._probs)
        self._tok = ctypes.c_int32(0)
        self._tok_p = ctypes.addressof(self._tok)
        self._res = _StepResultC()
        self._res_p = ctypes.addressof(self._res)

    @property
    def n_vocab(self) -> int:
        """V, the vocabulary size every probability row has."""
        return self._n_vocab

    @property
    def sampling(self) -> SamplingParams:
        """The warps (fixed for the sampler's life)."""
        return self._sampling

    @property
    def acceptance(self) -> AcceptanceParams:
        """The acceptance rule (fixed for the sampler's life)."""
        return self._acceptance

    # -- warping and sampling ---------------------------------------------------------------

    def warp(self, logits: np.ndarray, *, allowed: np.ndarray | None = None) -> np.ndarray:
        """Warped distribution of one logits row.

        Args:
            logits: float32 [n], 1 <= n <= V, C-contiguous; entries [n, V) get probability 0.
            allowed: None (every token allowed) or a uint32 bitmask [ceil(V/32)], C-contiguous
                (``pack_allowed``); a disallowed token is treated exactly like a -inf logit.
        Returns:
            float32 [V], sums to 1, zeros outside the kept set (a new array).
        Raises:
            ValueError: bad dtype/shape. NonFiniteLogitsError: NaN/+inf anywhere, or all -inf.
            EmptyMaskError: no allowed token has a finite logit.
        """
        out = np.empty(self._n_vocab, dtype=np.float32)
        self.warp_into(logits, out, allowed=allowed)
        return out

    def warp_into(self, logits: np.ndarray, out: np.ndarray, *,
                  allowed: np.ndarray | None = None) -> None:
        """Like ``warp``, writing into ``out``: float32 [V], writable, C-contiguous."""
        _check_logits_row(logits, self._n_vocab)
        _check_probs_out(out, logits, self._n_vocab, "out")
        mask = _row_mask_addr(allowed, self._n_vocab)
        st = _warp(_addr(logits), logits.shape[0], self._n_vocab, mask, self._sp_p, _addr(out),
                   self._work_p)
        if st != CG_OK:
            raise_status(st, "cg_warp")

    def sample(self, logits: np.ndarray, *, allowed: np.ndarray | None = None) -> int:
        """Warp then draw one token (the verifier-alone baseline). One uniform per call.

        Args:
            logits: float32 [n], 1 <= n <= V, C-contiguous.
            allowed: None or a uint32 bitmask [ceil(V/32)] (see ``warp``); the token is then allowed.
        Returns:
            token id in [0, n).
        Raises:
            ValueError: bad dtype/shape. NonFiniteLogitsError: NaN/+inf anywhere, or all -inf.
            EmptyMaskError: no allowed token has a finite logit.
        """
        _check_logits_row(logits, self._n_vocab)
        mask = _row_mask_addr(allowed, self._n_vocab)
        st = _warp_sample(
            _addr(logits), logits.shape[0], self._n_vocab, mask, self._sp_p, self._rng_p,
            self._probs_p, self._work_p, self._tok_p,
        )
        if st != CG_OK:
            raise_status(st, "cg_warp_sample")
        return self._tok.value

    def draft(self, logits: np.ndarray, probs_out: np.ndarray, *,
              allowed: np.ndarray | None = None) -> int:
        """The draft's per-token call: warp into ``probs_out`` and draw from it. One uniform per call.

        Args:
            logits: float32 [n], 1 <= n <= V, C-contiguous (the draft's vocabulary may be a prefix).
            probs_out: float32 [V], writable, C-contiguous, e.g. row i of the draft_probs [k, V] buffer
                later passed to ``verify``.
            allowed: None or a uint32 bitmask [ceil(V/32)] (see ``warp``). Under a grammar, pass the
                mask of this position, and the same masks to ``verify``, so p and q share the legal set.
        Returns:
            the drafted token id.
        Raises:
            ValueError: bad dtype/shape. NonFiniteLogitsError: NaN/+inf anywhere, or all -inf.
            EmptyMaskError: no allowed token has a finite logit.
        """
        _check_logits_row(logits, self._n_vocab)
        _check_probs_out(probs_out, logits, self._n_vocab, "probs_out")
        mask = _row_mask_addr(allowed, self._n_vocab)
        st = _warp_sample(
            _addr(logits), logits.shape[0], self._n_vocab, mask, self._sp_p, self._rng_p,
            _addr(probs_out), self._work_p, self._tok_p,
        )
        if st != CG_OK:
            raise_status(st, "cg_warp_sample")
        return self._tok.value

    # -- verification -------------------------------------------------------------------------

    def verify(
        self,
        draft_probs: np.ndarray | None,
        draft_tokens: np.ndarray,
        verifier_logits: np.ndarray,
        *,
        allowed: np.ndarray | None = None,
    ) -> StepResult:
        """One draft-verify step with the configured acceptance rule.

        Args:
            draft_probs: float32 [k, V] warped draft distributions p (C-contiguous), or None for a
                deterministic drafter (p one-hot at each drafted token).
            draft_tokens: int32 [k] drafted token ids in [0, V), C-contiguous.
            verifier_logits: float32 [k+1, V] raw verifier logits, C-contiguous (read in place, e.g.
                a zero-copy view on llama.cpp's logits; a flat [(k+1)*V] array is accepted too).
                Row i scores draft position i, row k the bonus position.
            allowed: None (no mask) or a uint32 bitmask [k+1, ceil(V/32)] (or flat), C-contiguous
                (``pack_allowed``): row i masks verifier row i. Mask the draft's rows with the same
                masks (``draft(..., allowed=allowed[i])``) so p and q are over the same legal set.
        Returns:
            StepResult (AL, the residual or bonus token, positions evaluated, KL(h||q) in nats).
        Raises:
            ValueError: bad dtype/shape/contiguity. NativeArgumentError (a ValueError): a token id
            outside [0, V). NonFiniteLogitsError: a NaN/+inf or all -inf verifier row that was
            needed. BadDistributionError: a draft_probs row with a negative/NaN/inf entry or zero sum.
            EmptyMaskError: a needed verifier row whose mask allows no finite logit.
        """
        n_vocab = self._n_vocab
        if (
            type(draft_tokens) is not np.ndarray
            or draft_tokens.dtype != _I32
            or draft_tokens.ndim != 1
            or not draft_tokens.flags.c_contiguous
        ):
            raise ValueError("draft_tokens must be a C-contiguous int32 array [k]")
        k = draft_tokens.shape[0]
        vl_shape = verifier_logits.shape if type(verifier_logits) is np.ndarray else None
        if (
            (vl_shape != (k + 1, n_vocab) and vl_shape != ((k + 1) * n_vocab,))
            or verifier_logits.dtype != _F32
            or not verifier_logits.flags.c_contiguous
        ):
            raise ValueError(
                f"verifier_logits must be a C-contiguous float32 array [k+1={k + 1}, V={n_vocab}]"
            )
        if draft_probs is None:
            dp = 0
        else:
            if (
                type(draft_probs) is not np.ndarray
                or draft_probs.dtype != _F32
                or draft_probs.shape != (k, n_vocab)
                or not draft_probs.flags.c_contiguous
            ):
                raise ValueError(
                    f"draft_probs must be None or a C-contiguous float32 array [k={k}, V={n_vocab}]"
                )
            dp = _addr(draft_probs)
        if allowed is None:
            mask = 0
        else:
            w = mask_words(n_vocab)
            mask = _allowed_addr(allowed, ((k + 1, w), ((k + 1) * w,)),
                                 f"[k+1={k + 1}, ceil(V/32)={w}]")
        st = _verify(
            dp, _addr(draft_tokens), _addr(verifier_logits), mask, k, n_vocab,
            self._sp_p, self._ap_p, self._rng_p, self._work_p, self._res_p,
        )
        if st != CG_OK:
            raise_status(st, "cg_verify")
        r = self._res
        return StepResult(r.n_accepted, r.next_token, r.n_evaluated, r.kl_sum, r.kl_max,
                          r.output_kl_sum, r.output_kl_max, r.delta_sum)

    def emitted_law(self, draft_probs: np.ndarray | None, verifier_probs: np.ndarray, *,
                    token: int | None = None) -> Law:
        """The exact law of the token a drafted position emits under the configured rule.

        Args:
            draft_probs: float32 [V] the warped draft distribution p, or None for a deterministic
                drafter, with ``token`` the drafted token (p one-hot there).
            verifier_probs: float32 [V] the warped verifier distribution q (``warp`` output).
        Returns:
            Law (P float64 [V], KL(P || q), acceptance, delta used). Exact, O(V log V) at most
            (native/law.c); the output budget repeats it ~20 times.
        Raises:
            ValueError: bad dtype / shape, or ``token`` missing or outside [0, V) with p None.
            BadDistributionError: p or q negative / NaN / inf somewhere or summing to 0.
        """
        n_vocab = self._n_vocab
        rows = [verifier_probs] + ([] if draft_probs is None else [draft_probs])
        for a in rows:
            if (type(a) is not np.ndarray or a.dtype != _F32 or a.shape != (n_vocab,)
                    or not a.flags.c_contiguous):
                raise ValueError(f"draft_probs / verifier_probs must be C-contiguous float32 [V={n_vocab}]")
        if draft_probs is None and not (_is_int(token) and 0 <= token < n_vocab):
            raise ValueError(f"token must be a drafted id in [0, {n_vocab}) when draft_probs is None, "
                             f"got {token!r}")
        probs = np.empty(n_vocab, np.float64)
        law = _LawC()
        st = _emitted_law(0 if draft_probs is None else _addr(draft_probs),
                          0 if token is None else int(token), _addr(verifier_probs), n_vocab,
                          self._ap_p, self._work_p, _addr(probs), ctypes.addressof(law))
        if st != CG_OK:
            raise_status(st, "cg_emitted_law")
        return Law(probs, law.kl, law.acceptance, law.delta)

    # -- randomness ---------------------------------------------------------------------------

    def peek_uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` uniforms this sampler would draw, without advancing it: float64 [n].

        Every call draws in a documented order (see ``native/cactus_native.h``), so a reference
        implementation fed these values reproduces the sampler's decisions.
        """
        return self._rng.copy().uniforms(n)


# ---------------------------------------------------------------------------------------------
# Scalar helpers
# ---------------------------------------------------------------------------------------------


def cactus_gamma(q_n: float, delta: float, solver: str = "taylor") -> float:
    """Cactus target mass on the drafted token, gamma(q[n], delta) (Hao & Mou 2026).

    Taylor: ``min(1, q_n + sqrt(2 delta q_n (1 - q_n)))``. Exact: the root in [q_n, 1] of
    ``binary_kl(gamma, q_n) = delta``, or 1 when ``-log q_n <= delta``. q_n = 0 -> 0; q_n = 1 -> 1;
    delta = 0 -> q_n exactly.

    Args:
        q_n: verifier probability of the drafted token, in [0, 1].
        delta: KL budget in nats, >= 0.
        solver: ``"taylor"`` or ``"exact"``.
    Raises:
        ValueError: an argument out of range.
    """
    if not _is_real(q_n) or not 0.0 <= q_n <= 1.0:
        raise ValueError(f"q_n must be in [0, 1], got {q_n!r}")
    if not _is_real(delta) or not delta >= 0.0:
        raise ValueError(f"delta must be >= 0 nats, got {delta!r}")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}; got {solver!r}")
    return _cactus_gamma(float(q_n), float(delta), SOLVER_VALUES[solver])


def binary_kl(gamma: float, q: float) -> float:
    """KL(Bern(gamma) || Bern(q)) in nats, with 0 log 0 = 0 (+inf when q = 0 < gamma or gamma < 1 = q).

    For the Cactus target h (h[n] = gamma, the rest q rescaled) this is exactly KL(h || q).
    Raises ValueError unless both are in [0, 1].
    """
    if not _is_real(gamma) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if not _is_real(q) or not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q!r}")

    def term(a: float, b: float) -> float:
        if a == 0.0:
            return 0.0
        if b == 0.0:
            return math.inf
        return a * math.log(a / b)

    return term(gamma, q) + term(1.0 - gamma, 1.0 - q)
