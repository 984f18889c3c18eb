"""Native sampling helper: a thin ctypes facade over the C library of native/ (its contract:
native/cactus_native.h; the maths: docs/maths.md).

Dimension letters: ``V`` = vocabulary size, ``k`` = draft length (tokens proposed per step).

Glossary (the same as in ``native/cactus_native.h``):

- ``p``: the draft distribution at a position, after the draft's warps (the request's, at
  ``draft_temp`` when one is given); ``q``: the verifier's, after the request's warps.
- drafted: the token ``n`` the draft sampled from ``p``; accepted: a drafted token kept by the test.
- residual: on the first rejection, a token drawn from ``norm(max(0, h - p))``.
- bonus: when all ``k`` drafts are accepted, a token drawn from ``q`` at position ``k + 1``.
- acceptance length (AL): accepted drafts in one step, ``0..k``.
- ``h``: the target the acceptance test uses (``q`` for SpS, the Cactus target for Cactus).

Rules: Y. Hao, L. Mou, "Cactus: Accelerating Auto-Regressive Decoding with Constrained Acceptance
Speculative Sampling", ICLR 2026, arXiv:2604.04987; SpS: Leviathan et al. 2023, Chen et al. 2023.

Everything per token (warp, sample, verify) runs in C on caller-visible buffers; this module checks
dtypes and shapes, passes pointers, and maps each C status code to its own exception.

Logit bias (optional, a request's ``logit_bias``): a float32 [V] row added to every logits row
before the warps, in every call that takes full rows (``warp``, ``sample``, ``draft``,
``verify``): q and p are then the laws of the biased logits, so every acceptance rule keeps its
exact law relative to the biased target (docs/maths.md "Logit bias"). A -inf entry bans the
token. The compact (device) calls refuse a biased sampler: the device's top-K never saw the bias.

Allowed-token masks (optional, for grammar-constrained decoding): ``allowed`` is a uint32 bitmask of
``W = ceil(V / 32)`` words per row, bit ``i % 32`` of word ``i // 32`` set = token ``i`` allowed
(``pack_allowed`` builds it from a boolean array). A disallowed token is treated exactly like a
``-inf`` logit, so every warped row is a distribution over the allowed tokens only.

Layout: this module holds ``NativeSampler``; the argument checks are in ``_checks``, the masks in
``masks``, the C generator in ``rng``, the records that cross the boundary (``c_params``,
``StepResult``, ``Law``) in ``records``, the Cactus scalars in ``gamma``, the ctypes bindings in
``_clib``. Every public name is importable from here as before.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from ._checks import (F32, I32, addr, check_draft_tokens, check_law_rows, check_logits_row,
                      check_probs_out, check_verifier_logits, draft_probs_addr, is_int)
from ._clib import (_AcceptParamsC, _LawC, _RowReaderC, _SamplerParamsC, _StepResultC,
                    _compact_union, _emitted_law, _read_rows, _verify, _warp, _warp_sample,
                    _workspace_size)
from .errors import (CG_OK, BadDistributionError, EmptyMaskError, NativeArgumentError,
                     NativeError, NonFiniteLogitsError, raise_status)
from .gamma import binary_kl, cactus_gamma
from .masks import mask_words, pack_allowed, row_mask_addr, step_mask_addr
from .params import AcceptanceParams, SamplingParams, draft_sampling
from .records import Law, StepResult, c_params
from .rng import Rng, check_seed

# The raw bindings, reachable through this module as before (tests call C directly with them).
from ._clib import METHOD_VALUES, _cactus_gamma, _RngC, _rng_seed  # noqa: F401

# the drafts' generator under the greedy rule: the seed XOR this odd constant (2^64 / golden
# ratio), a stream apart from the verifier's (splitmix64 spreads neighbouring seeds)
DRAFT_STREAM = 0x9E3779B97F4A7C15

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
    "read_rows",
]


def read_rows(reader: tuple[int, int, int, int, int], n_rows: int, width: int, n_vocab: int
              ) -> tuple[np.ndarray, np.ndarray] | int:
    """llama.cpp's backend-sampled last ``n_rows`` output rows of ``width`` = K + 1 candidates,
    read in one C call (native/cactus_native.h, ``cg_read_rows``): (ids int32 [n_rows, width]
    ascending, logits float32 [n_rows, width]) when every row is exact, else the index of the
    first row that is not (a tie at its K-th logit, a short row). ``reader``: the context's
    address and its four accessors' (``Context.row_reader``). Raises NativeError."""
    ids = np.empty((n_rows, width), np.int32)
    logits = np.empty((n_rows, width), np.float32)
    bad = ctypes.c_int32(-1)
    st = _read_rows(ctypes.addressof(_reader(reader)), n_rows, width, n_vocab, addr(ids),
                    addr(logits), ctypes.addressof(bad))
    if st != CG_OK:
        raise_status(st, "cg_read_rows")
    return (ids, logits) if bad.value < 0 else bad.value


@functools.lru_cache(maxsize=64)
def _reader(reader: tuple[int, int, int, int, int]) -> _RowReaderC:
    """The C struct of a reader tuple (the same tuple, the same struct: a context's address is
    its own while it lives, and the accessors' never change)."""
    return _RowReaderC(*reader)


class NativeSampler:
    """Warping, sampling and draft verification for one decoding stream.

    Owns its RNG state (seeded from ``seed``; two samplers never share state) and one preallocated
    workspace, so the per-token calls allocate nothing (except ``warp``, which returns a new array).
    Not thread-safe: use one sampler per stream.

    Args:
        n_vocab: V, the verifier's vocabulary size (>= 1).
        sampling: the request's warps: the verifier's q (``warp``, ``sample``, ``verify``,
            ``emitted_law``) and, unless ``draft_temp`` is given, the draft's p (``draft``).
        acceptance: the acceptance rule used by ``verify``.
        seed: integer in [0, 2**64).
        draft_temp: the draft's own temperature (``draft`` only: ``sampling`` with this
            temperature, top-k / top-p / min-p unchanged; 0 = greedy, a one-hot proposal at the
            draft's lowest-id argmax), a finite number >= 0; None = the request's temperature.
            SpS emits q for any proposal law, so this changes acceptance, never what SpS emits.
        logit_bias: float32 [V] added to every full logits row before the warps (the verifier's
            and the draft's: a -inf entry bans that token), or None (nothing added).
    Raises:
        ValueError: on an invalid argument.
    """

    __slots__ = (
        "_n_vocab", "_sampling", "_draft_sampling", "_acceptance", "_rng", "_rng_p",
        "_draft_rng", "_draft_rng_p", "_drafts_rng_p", "_sp",
        "_sp_p", "_dsp", "_dsp_p", "_ap", "_ap_p", "_work", "_work_p", "_probs", "_probs_p",
        "_tok", "_tok_p", "_res", "_res_p", "_compact", "_bias", "_bias_buf",
    )

    def __init__(
        self, n_vocab: int, sampling: SamplingParams, acceptance: AcceptanceParams, seed: int,
        *, draft_temp: float | None = None, logit_bias: np.ndarray | None = None,
    ) -> None:
        if not is_int(n_vocab) or not 1 <= n_vocab < 2**31:
            raise ValueError(f"n_vocab must be an integer in [1, 2**31), got {n_vocab!r}")
        if not isinstance(sampling, SamplingParams):
            raise ValueError(f"sampling must be a SamplingParams, got {type(sampling).__name__}")
        if not isinstance(acceptance, AcceptanceParams):
            raise ValueError(f"acceptance must be an AcceptanceParams, got {type(acceptance).__name__}")
        self._n_vocab = int(n_vocab)
        self._sampling = sampling
        self._rng = Rng(seed)
        self._rng_p = ctypes.addressof(self._rng._c)
        # the draft's own stream, used under the greedy rule (use_acceptance): the verifier's
        # stream then holds one uniform per emitted token, as without a draft
        self._draft_rng = Rng(check_seed(seed) ^ DRAFT_STREAM)
        self._draft_rng_p = ctypes.addressof(self._draft_rng._c)
        self._drafts_rng_p = self._rng_p
        self._sp = c_params(_SamplerParamsC, sampling)  # built once: every call passes its address
        self._sp_p = ctypes.addressof(self._sp)
        # the draft's warps: a second struct of the same type, so draft() passes another address
        self._draft_sampling = draft_sampling(sampling, draft_temp)
        self._dsp = c_params(_SamplerParamsC, self._draft_sampling)
        self._dsp_p = ctypes.addressof(self._dsp)
        self._acceptance = None
        self.use_acceptance(acceptance)
        self._work = np.empty(_workspace_size(self._n_vocab), dtype=np.float32)
        self._work_p = addr(self._work)
        self._probs = np.empty(self._n_vocab, dtype=np.float32)
        self._probs_p = addr(self._probs)
        self._tok = ctypes.c_int32(0)
        self._tok_p = ctypes.addressof(self._tok)
        self._res = _StepResultC()
        self._res_p = ctypes.addressof(self._res)
        self._compact: _CompactBuffers | None = None  # verify_compact's, on its first call
        if logit_bias is not None and (type(logit_bias) is not np.ndarray
                                       or logit_bias.dtype != F32
                                       or logit_bias.shape != (self._n_vocab,)
                                       or np.isnan(logit_bias).any()
                                       or np.isposinf(logit_bias).any()):
            raise ValueError(f"logit_bias must be None or a float32 [V={self._n_vocab}] array "
                             "of finite numbers or -inf")
        self._bias = logit_bias
        # the biased rows' buffer (k + 1 rows at most: grown by verify), only with a bias
        self._bias_buf = None if logit_bias is None else np.empty(self._n_vocab, F32)

    @property
    def n_vocab(self) -> int:
        """V, the vocabulary size every probability row has."""
        return self._n_vocab

    @property
    def sampling(self) -> SamplingParams:
        """The request's warps, the verifier's q (fixed for the sampler's life)."""
        return self._sampling

    @property
    def draft_sampling(self) -> SamplingParams:
        """The draft's warps (``sampling`` at the draft's temperature), used by ``draft`` only."""
        return self._draft_sampling

    @property
    def logit_bias(self) -> np.ndarray | None:
        """The float32 [V] row added to every full logits row, or None."""
        return self._bias

    def _biased(self, logits: np.ndarray) -> np.ndarray:
        """``logits`` (checked: float32 [n] with n <= V, or [k+1, V] / flat [(k+1)*V]) plus the
        bias, in the sampler's buffer (valid until the next call); ``logits`` itself without a
        bias. -inf + a finite logit is -inf: a banned token has probability 0 after any warp."""
        bias = self._bias
        if bias is None:
            return logits
        n = logits.size
        if self._bias_buf.size < n:
            self._bias_buf = np.empty(n, F32)
        out = self._bias_buf[:n].reshape(logits.shape)
        if logits.ndim == 1 and n <= self._n_vocab:  # one row (a draft's may be a prefix)
            np.add(logits, bias[:n], out=out)
        else:  # k + 1 full rows
            np.add(logits.reshape(-1, self._n_vocab), bias, out=out.reshape(-1, self._n_vocab))
        return out

    def _unbiased(self, what: str) -> None:
        """Raise ValueError when a compact call meets a biased sampler (speculative/device.py
        reads full rows for a biased request)."""
        if self._bias is not None:
            raise ValueError(f"{what}: a sampler with a logit bias takes full rows only")

    @property
    def acceptance(self) -> AcceptanceParams:
        """The acceptance rule ``verify`` applies (the constructor's until ``use_acceptance``)."""
        return self._acceptance

    def use_acceptance(self, acceptance: AcceptanceParams) -> None:
        """Apply ``acceptance`` from the next ``verify`` on (the same object again: nothing to
        do). Its ``end_mask`` must have the constructor's shape. Raises ValueError otherwise."""
        if acceptance is self._acceptance:
            return
        if not isinstance(acceptance, AcceptanceParams):
            raise ValueError(f"acceptance must be an AcceptanceParams, got {type(acceptance).__name__}")
        m = acceptance.end_mask
        if m is not None and m.shape != (mask_words(self._n_vocab),):
            raise ValueError(f"end_mask must have ceil(V / 32) = {mask_words(self._n_vocab)} "
                             f"words, got {m.shape}")
        self._acceptance = acceptance
        self._ap = c_params(_AcceptParamsC, acceptance)
        self._ap_p = ctypes.addressof(self._ap)
        # greedy (llama-server's rule: accept while the verifier's own sample equals the draft)
        # draws each emitted token with one uniform of the verifier's stream, so with the drafts
        # drawn from their own stream a seed gives the verifier alone's tokens, draft or not
        self._drafts_rng_p = self._draft_rng_p if acceptance.method == "greedy" else self._rng_p

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
        check_logits_row(logits, self._n_vocab)
        check_probs_out(out, logits, self._n_vocab, "out")
        mask = row_mask_addr(allowed, self._n_vocab)
        logits = self._biased(logits)
        st = _warp(addr(logits), logits.shape[0], self._n_vocab, mask, self._sp_p, addr(out),
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
        check_logits_row(logits, self._n_vocab)
        return self._warp_sample(self._biased(logits), self._probs_p, allowed, self._sp_p,
                                 self._rng_p)

    def draft(self, logits: np.ndarray, probs_out: np.ndarray, *,
              allowed: np.ndarray | None = None) -> int:
        """The draft's per-token call: warp with the draft's warps (``draft_sampling``) into
        ``probs_out`` and draw from it. One uniform per call (also at draft temperature 0).

        ``probs_out`` is exactly the law the token was drawn from (one-hot at the drafted token at
        draft temperature 0): pass it to ``verify`` as that position's p, so every acceptance rule
        sees the real proposal (SpS then emits q whatever the draft's temperature).

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
        check_logits_row(logits, self._n_vocab)
        check_probs_out(probs_out, logits, self._n_vocab, "probs_out")
        return self._warp_sample(self._biased(logits), addr(probs_out), allowed, self._dsp_p,
                                 self._drafts_rng_p)

    def _warp_sample(self, logits: np.ndarray, probs_p: int, allowed: np.ndarray | None,
                     sp_p: int, rng_p: int) -> int:
        """Warp checked ``logits`` with the warps at address ``sp_p`` (the request's or the
        draft's) into the float32 [V] row at address ``probs_p``, then draw one token from it (one
        uniform of the generator at ``rng_p``: the verifier's, or the drafts'); the token id."""
        mask = row_mask_addr(allowed, self._n_vocab)
        st = _warp_sample(
            addr(logits), logits.shape[0], self._n_vocab, mask, sp_p, rng_p,
            probs_p, self._work_p, self._tok_p,
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
        k = check_draft_tokens(draft_tokens)
        check_verifier_logits(verifier_logits, k, n_vocab)
        dp = draft_probs_addr(draft_probs, k, n_vocab)
        mask = step_mask_addr(allowed, k, n_vocab)
        verifier_logits = self._biased(verifier_logits)
        st = _verify(
            dp, addr(draft_tokens), addr(verifier_logits), mask, k, n_vocab,
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
        check_law_rows(draft_probs, verifier_probs, token, n_vocab)
        probs = np.empty(n_vocab, np.float64)
        law = _LawC()
        st = _emitted_law(0 if draft_probs is None else addr(draft_probs),
                          0 if token is None else int(token), addr(verifier_probs), n_vocab,
                          self._ap_p, self._work_p, addr(probs), ctypes.addressof(law))
        if st != CG_OK:
            raise_status(st, "cg_emitted_law")
        return Law(probs, law.kl, law.acceptance, law.delta)

    # -- compact rows -------------------------------------------------------------------------
    # A compact row covers n ids of the vocabulary in ascending id order (the caller maps an index
    # back to its id), -inf at an id outside the row's own candidates. The warps select by (logit
    # descending, id ascending) and every draw walks the kept ids in id order skipping zeros, so a
    # compact row that holds every id the warps can keep (each id whose logit reaches the row's
    # top_k-th largest, top_k > 0) and the same float32 logits gives exactly the full row's
    # probabilities and draws, with the same uniforms (speculative/device.py).

    def _compact_sample(self, logits: np.ndarray, probs_out: np.ndarray, sp_p: int,
                        rng_p: int) -> int:
        self._unbiased("draft_compact / sample_compact")
        n = logits.shape[0] if isinstance(logits, np.ndarray) and logits.ndim == 1 else 0
        check_logits_row(logits, max(n, 1))
        check_probs_out(probs_out, logits, n, "probs_out")
        st = _warp_sample(addr(logits), n, n, 0, sp_p, rng_p, addr(probs_out),
                          self._work_p, self._tok_p)
        if st != CG_OK:
            raise_status(st, "cg_warp_sample")
        return self._tok.value

    def draft_compact(self, logits: np.ndarray, probs_out: np.ndarray) -> int:
        """``draft`` on a compact row (no mask): ``logits`` float32 [n] (n <= V), ``probs_out``
        float32 [n]; the index drawn. One uniform."""
        return self._compact_sample(logits, probs_out, self._dsp_p, self._drafts_rng_p)

    def sample_compact(self, logits: np.ndarray) -> int:
        """``sample`` on a compact row (no mask): the index drawn. One uniform."""
        n = logits.shape[0] if isinstance(logits, np.ndarray) and logits.ndim == 1 else 0
        return self._compact_sample(logits, self._probs[:n], self._sp_p, self._rng_p)

    def warp_compact_into(self, logits: np.ndarray, out: np.ndarray) -> None:
        """``warp_into`` (the request's warps) on a compact row: ``out`` float32 [n]."""
        self._unbiased("warp_compact_into")
        n = logits.shape[0] if isinstance(logits, np.ndarray) and logits.ndim == 1 else 0
        check_logits_row(logits, max(n, 1))
        check_probs_out(out, logits, n, "out")
        st = _warp(addr(logits), n, n, 0, self._sp_p, addr(out), self._work_p)
        if st != CG_OK:
            raise_status(st, "cg_warp")

    def verify_compact(self, ver_ids: np.ndarray, ver_logits: np.ndarray,
                       draft_ids: np.ndarray | None, draft_probs: np.ndarray | None,
                       draft_tokens: np.ndarray) -> StepResult:
        """``verify`` (no mask) on a step's compact rows, over the union U of their ids
        (native/cactus_native.h, "Compact rows"; one C call builds U and gathers every row into
        it, one more verifies): ``ver_ids`` int32 / ``ver_logits`` float32 [k+1, W] the verifier's
        exact rows, ids ascending (``read_rows``); ``draft_ids`` int32 / ``draft_probs`` float32
        [k, W'] the draft's p over its rows' ids (ascending, -1 for padding), or both None for a
        deterministic proposal; ``draft_tokens`` int32 [k]. The same result, and the same
        uniforms, as ``verify`` of the full rows; ``next_token`` is the token id. The
        acceptance's end set is gathered into U too. Raises ValueError / NativeError."""
        k = check_draft_tokens(draft_tokens)
        for a, dt in ((ver_ids, I32), (ver_logits, F32)):
            if type(a) is not np.ndarray or a.dtype != dt or a.ndim != 2 \
                    or a.shape[0] != k + 1 or not a.flags.c_contiguous:
                raise ValueError(f"ver_ids / ver_logits must be C-contiguous int32 / float32 "
                                 f"[k+1 = {k + 1}, W]")
        if ver_ids.shape != ver_logits.shape:
            raise ValueError("ver_ids and ver_logits must have the same shape")
        width = ver_ids.shape[1]
        w = self._compact_ws(k, width, draft_ids, draft_probs)
        return self._verify_union(w, addr(ver_ids), addr(ver_logits), width, draft_ids,
                                  draft_probs, draft_tokens)

    def verify_device(self, reader: tuple[int, int, int, int, int], width: int,
                      draft_ids: np.ndarray | None, draft_probs: np.ndarray | None,
                      draft_tokens: np.ndarray) -> StepResult | None:
        """``verify_compact`` of the verifier's last k + 1 output rows read straight from
        llama.cpp's backend sampler (``read_rows``: ``reader`` and ``width`` = K + 1 as there):
        one Python call and three C calls per step, on buffers kept between steps. None, with no
        uniform drawn, when a row is not exact (the step then runs on full rows)."""
        k = check_draft_tokens(draft_tokens)
        w = self._compact_ws(k, width, draft_ids, draft_probs)
        st = _read_rows(ctypes.addressof(_reader(reader)), k + 1, width, self._n_vocab, w.vi,
                        w.vl, w.bad_p)
        if st != CG_OK:
            raise_status(st, "cg_read_rows")
        if w.bad.value >= 0:
            return None
        return self._verify_union(w, w.vi, w.vl, width, draft_ids, draft_probs, draft_tokens)

    def _compact_ws(self, k: int, width: int, draft_ids, draft_probs) -> "_CompactBuffers":
        """The compact step's buffers for k + 1 verifier rows of ``width`` and the draft's rows
        (checked here: int32 / float32 [k, W'] of one shape, or both None), grown on demand and
        kept between steps, with the acceptance's struct pointing at their end set."""
        d_width = 0
        if draft_ids is not None:
            if (type(draft_ids) is not np.ndarray or type(draft_probs) is not np.ndarray
                    or draft_ids.dtype != I32 or draft_probs.dtype != F32
                    or draft_ids.ndim != 2 or draft_ids.shape != draft_probs.shape
                    or draft_ids.shape[0] != k or not draft_ids.flags.c_contiguous
                    or not draft_probs.flags.c_contiguous):
                raise ValueError(f"draft_ids / draft_probs must be C-contiguous int32 / float32 "
                                 f"[k = {k}, W'] of one shape")
            d_width = draft_ids.shape[1]
        elif draft_probs is not None:
            raise ValueError("draft_probs without draft_ids")
        self._unbiased("verify_compact / verify_device")
        cap = (k + 1) * width + k * d_width + k
        w = self._compact
        if w is None or w.cap < cap or w.n_rows < k + 1 or w.width < width:
            w = self._compact = _CompactBuffers(max(cap, 2 * (w.cap if w else 0)),
                                                max(k + 1, w.n_rows if w else 0),
                                                max(width, w.width if w else 0))
        if w.acceptance is not self._acceptance:
            w.point(self._ap)
            w.acceptance = self._acceptance
        return w

    def _verify_union(self, w: "_CompactBuffers", ver_ids: int, ver_logits: int, width: int,
                      draft_ids, draft_probs, draft_tokens: np.ndarray) -> StepResult:
        """cg_compact_union then cg_verify on ``w`` (``ver_ids`` / ``ver_logits``: addresses)."""
        k = draft_tokens.shape[0]
        n_draft = 0 if draft_ids is None else k
        end = self._acceptance.end_mask
        st = _compact_union(ver_ids, ver_logits, k + 1, width,
                            None if draft_ids is None else addr(draft_ids),
                            None if draft_ids is None else addr(draft_probs), n_draft,
                            0 if draft_ids is None else draft_ids.shape[1], addr(draft_tokens), k,
                            None if end is None else addr(end), self._n_vocab, w.cap, w.scratch,
                            w.ids, w.logits, w.probs, w.index, w.end, w.n_p)
        if st != CG_OK:
            raise_status(st, "cg_compact_union")
        st = _verify(w.probs if n_draft else None, w.index, w.logits, None, k, w.n.value,
                     self._sp_p, self._ap_p if end is None else w.ap_p, self._rng_p, self._work_p,
                     self._res_p)
        if st != CG_OK:
            raise_status(st, "cg_verify")
        r = self._res
        return StepResult(r.n_accepted, int(w.id_array[r.next_token]), r.n_evaluated, r.kl_sum,
                          r.kl_max, r.output_kl_sum, r.output_kl_max, r.delta_sum)

    # -- randomness ---------------------------------------------------------------------------

    def peek_uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` uniforms this sampler would draw, without advancing it: float64 [n].

        Every call draws in a documented order (see ``native/cactus_native.h``), so a reference
        implementation fed these values reproduces the sampler's decisions.
        """
        return self._rng.copy().uniforms(n)


class _CompactBuffers:
    """The compact step's buffers, for up to ``cap`` ids in U and ``n_rows`` verifier rows of up
    to ``width`` candidates: the rows read from llama.cpp (``vi``, ``vl``), the outputs of
    ``cg_compact_union`` and the acceptance struct whose end set is the gathered one; the
    addresses computed once (a step passes them, allocating nothing)."""

    def __init__(self, cap: int, n_rows: int, width: int) -> None:
        self.cap, self.n_rows, self.width, self.acceptance = cap, n_rows, width, None
        self.id_array = np.empty(cap, np.int32)
        self._arrays = (np.empty(cap, np.int32), np.empty(n_rows * cap, np.float32),
                        np.empty(n_rows * cap, np.float32), np.empty(n_rows, np.int32),
                        np.zeros(mask_words(cap), np.uint32), np.empty(n_rows * width, np.int32),
                        np.empty(n_rows * width, np.float32))
        self.ids = addr(self.id_array)
        (self.scratch, self.logits, self.probs, self.index, self.end, self.vi,
         self.vl) = map(addr, self._arrays)
        self.n, self.bad = ctypes.c_int32(0), ctypes.c_int32(-1)
        self.n_p, self.bad_p = ctypes.addressof(self.n), ctypes.addressof(self.bad)
        self.ap = _AcceptParamsC()
        self.ap_p = ctypes.addressof(self.ap)

    def point(self, ap: _AcceptParamsC) -> None:
        """This step's acceptance: ``ap`` with the end set gathered into U."""
        ctypes.memmove(self.ap_p, ctypes.addressof(ap), ctypes.sizeof(ap))
        self.ap.end_mask = self.end
