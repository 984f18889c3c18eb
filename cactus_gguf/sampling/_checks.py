"""Checks of the arrays and scalars the native helper's facade hands to C (dtype, shape,
contiguity), and their addresses. Every check raises ValueError naming the argument and the
shape it must have.

Dimension letters: ``V`` = vocabulary size, ``k`` = draft length.
"""
from __future__ import annotations

import numpy as np

F32 = np.dtype(np.float32)
I32 = np.dtype(np.int32)
U32 = np.dtype(np.uint32)


def addr(a: np.ndarray) -> int:
    """The address of ``a``'s first element (C reads the array in place)."""
    return a.__array_interface__["data"][0]


def is_int(x) -> bool:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A real number (Python or NumPy int / float), not a bool."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def check_logits_row(logits, n_vocab: int, name: str = "logits") -> None:
    """``logits``: float32 [n], 1 <= n <= V, C-contiguous."""
    if (
        type(logits) is not np.ndarray
        or logits.dtype != F32
        or logits.ndim != 1
        or not 1 <= logits.shape[0] <= n_vocab
        or not logits.flags.c_contiguous
    ):
        raise ValueError(f"{name} must be a C-contiguous float32 array [n], 1 <= n <= V={n_vocab}")


def check_probs_out(out, logits: np.ndarray, n_vocab: int, name: str) -> None:
    """``out``: float32 [V], writable, C-contiguous, not overlapping ``logits``."""
    if (
        type(out) is not np.ndarray
        or out.dtype != F32
        or out.shape != (n_vocab,)
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        raise ValueError(f"{name} must be a writable C-contiguous float32 array [V={n_vocab}]")
    if np.may_share_memory(out, logits):
        raise ValueError(f"{name} must not overlap logits (the warp uses it as scratch)")


def check_draft_tokens(draft_tokens) -> int:
    """``draft_tokens``: int32 [k], C-contiguous; returns k."""
    if (
        type(draft_tokens) is not np.ndarray
        or draft_tokens.dtype != I32
        or draft_tokens.ndim != 1
        or not draft_tokens.flags.c_contiguous
    ):
        raise ValueError("draft_tokens must be a C-contiguous int32 array [k]")
    return draft_tokens.shape[0]


def check_verifier_logits(verifier_logits, k: int, n_vocab: int) -> None:
    """``verifier_logits``: float32 [k+1, V] or flat [(k+1)*V], C-contiguous."""
    shape = verifier_logits.shape if type(verifier_logits) is np.ndarray else None
    if (
        (shape != (k + 1, n_vocab) and shape != ((k + 1) * n_vocab,))
        or verifier_logits.dtype != F32
        or not verifier_logits.flags.c_contiguous
    ):
        raise ValueError(
            f"verifier_logits must be a C-contiguous float32 array [k+1={k + 1}, V={n_vocab}]"
        )


def draft_probs_addr(draft_probs, k: int, n_vocab: int) -> int:
    """The address of ``draft_probs`` (float32 [k, V], C-contiguous), or 0 (NULL) for None."""
    if draft_probs is None:
        return 0
    if (
        type(draft_probs) is not np.ndarray
        or draft_probs.dtype != F32
        or draft_probs.shape != (k, n_vocab)
        or not draft_probs.flags.c_contiguous
    ):
        raise ValueError(
            f"draft_probs must be None or a C-contiguous float32 array [k={k}, V={n_vocab}]"
        )
    return addr(draft_probs)


def check_law_rows(draft_probs, verifier_probs, token, n_vocab: int) -> None:
    """The arguments of ``emitted_law``: q (and p unless None) float32 [V], C-contiguous; with p
    None, ``token`` a drafted id in [0, V)."""
    rows = [verifier_probs] + ([] if draft_probs is None else [draft_probs])
    for a in rows:
        if (type(a) is not np.ndarray or a.dtype != F32 or a.shape != (n_vocab,)
                or not a.flags.c_contiguous):
            raise ValueError(f"draft_probs / verifier_probs must be C-contiguous float32 [V={n_vocab}]")
    if draft_probs is None and not (is_int(token) and 0 <= token < n_vocab):
        raise ValueError(f"token must be a drafted id in [0, {n_vocab}) when draft_probs is None, "
                         f"got {token!r}")
