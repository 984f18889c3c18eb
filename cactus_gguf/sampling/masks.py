"""Allowed-token masks (grammar-constrained decoding): a uint32 bitmask of ``W = ceil(V / 32)``
words per row, bit ``i % 32`` of word ``i // 32`` set = token ``i`` allowed. A disallowed token is
treated exactly like a ``-inf`` logit, so every warped row is a distribution over the allowed
tokens only.
"""
from __future__ import annotations

import numpy as np

from ._checks import U32, addr

__all__ = ["mask_words", "pack_allowed", "row_mask_addr", "step_mask_addr"]


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
    return np.ascontiguousarray(packed).view("<u4").astype(U32)


def _allowed_addr(allowed: np.ndarray, shapes: tuple, what: str) -> int:
    """The address of a checked (not None) mask: uint32, one of ``shapes``, C-contiguous."""
    if (
        type(allowed) is not np.ndarray
        or allowed.dtype != U32
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
    return addr(allowed)


def row_mask_addr(allowed, n_vocab: int) -> int:
    """The address of a checked one-row mask uint32 [W], or 0 (NULL) for None."""
    if allowed is None:
        return 0
    w = mask_words(n_vocab)
    return _allowed_addr(allowed, ((w,),), f"[ceil(V/32)={w}]")


def step_mask_addr(allowed, k: int, n_vocab: int) -> int:
    """The address of a checked verification-step mask uint32 [k+1, W] (or flat [(k+1)*W]), or 0
    (NULL) for None."""
    if allowed is None:
        return 0
    w = mask_words(n_vocab)
    return _allowed_addr(allowed, ((k + 1, w), ((k + 1) * w,)), f"[k+1={k + 1}, ceil(V/32)={w}]")
