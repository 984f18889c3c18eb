"""Log-probabilities of the emitted tokens, read from the verifier's rows (a request's ``n_probs``).

Dimension letters: ``V`` = vocabulary size, ``k`` = draft length.

A step verifies its drafts with the verifier's logits, float32 ``[k+1, V]``: row ``i`` is the
verifier's next-token row after the committed tokens and the drafts ``d_1 .. d_i``. The step emits
the accepted drafts ``d_1 .. d_AL`` and one more token (residual, bonus, or the verifier's own), the
``i``-th emitted token at row ``i``. So every emitted token, an accepted draft too, has its
verifier row at hand, and its log-probability is read there, after acceptance and before the next
decode overwrites the rows; only when the request asks (``n_probs`` not None: nothing is computed
otherwise).

What the numbers are, under any acceptance rule:

- ``post_sampling_probs`` (default): ``log q_i[x]``, ``q_i`` the verifier's law at row ``i`` after the
  request's warps (top-k, top-p, min-p, temperature) and its grammar's mask: the law the verifier
  samples from, ``native.warp_into``. Every emitted token has ``q_i[x] > 0`` whatever the rule
  (docs/behaviour.md "Sampling math"), so its log-probability is finite; the alternatives are the
  most likely tokens of ``q_i`` with ``q_i > 0``: fewer than asked when the warps keep fewer.
- otherwise: the raw log-softmax of row ``i`` (no warp, no grammar), llama-server's default; its
  alternatives are the highest logits (a ``-inf`` logit is never one).

Under Cactus, typical, top-k or EARS acceptance the tokens are *not* drawn from ``q_i``: the emitted
law is the mixture ``P`` of docs/maths.md "The emitted law". ``q_i`` is the verifier's own law,
the reference Cactus's δ is measured against: ``log q_i[x]`` says how likely the verifier found the
token, not how likely this decoder was to emit it (``P`` depends on the draft's ``p`` and is not
computed per token). Under SpS, the greedy rule and the verifier alone ``P = q`` and the two agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["Alternative", "TokenLogprob", "LogprobReader", "top_ids"]


@dataclass(frozen=True)
class Alternative:
    """One of the most likely tokens at a position: its id, its bytes (the piece it adds to the
    text: may be part of a UTF-8 character) and its log-probability (nats)."""

    token: int
    piece: bytes
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """An emitted token (id, bytes), its log-probability at its position (nats, finite) and the
    ``n_probs`` most likely tokens there, most likely first (ties: the lower id first)."""

    token: int
    piece: bytes
    logprob: float
    top: tuple[Alternative, ...]


def top_ids(values: np.ndarray, n: int, floor: float) -> np.ndarray:
    """The ids of the ``n`` largest entries of ``values`` (a float [V] row) above ``floor``, largest
    first, ties in ascending id; fewer when fewer entries exceed ``floor``. int64 [<= n]."""
    n = min(n, int(np.count_nonzero(values > floor)))
    if n <= 0:
        return np.empty(0, dtype=np.int64)
    kth = np.partition(values, values.shape[0] - n)[values.shape[0] - n]  # the n-th largest
    ids = np.flatnonzero(values >= kth)  # ascending ids; more than n when kth is tied
    order = np.argsort(-values[ids], kind="stable")[:n]  # stable: a tie keeps the lower id first
    return ids[order]


class LogprobReader:
    """Reads the log-probabilities of one generation's emitted tokens from verifier rows.

    Args:
        sampler: the generation's NativeSampler (its warps give q; ``warp_into`` only: no
            randomness is drawn, so the output is the same with and without log-probabilities).
        n_probs: alternatives per token (>= 0).
        warped: True: log q, the warped law (``post_sampling_probs``); False: the raw log-softmax.
        piece: token id -> its bytes in the text (the model's ``token_to_piece``).
    """

    def __init__(self, sampler, n_probs: int, warped: bool, piece: Callable[[int], bytes]) -> None:
        self.sampler, self.n_probs, self.warped, self.piece = sampler, n_probs, warped, piece
        self._q = np.empty(sampler.n_vocab, dtype=np.float32) if warped else None  # q: float32 [V]

    def read(self, row: np.ndarray, token: int, allowed: np.ndarray | None) -> TokenLogprob:
        """The log-probabilities at one position.

        Args:
            row: float32 [V] verifier logits of the position (a row of the step's [k+1, V], read in
                place, C-contiguous).
            token: the token emitted there.
            allowed: the grammar's uint32 mask of that row (``pack_allowed`` layout) or None.
        """
        if self.warped:
            q = self._q
            self.sampler.warp_into(row, q, allowed=allowed)
            ids = top_ids(q, self.n_probs, 0.0)  # only tokens q keeps (q > 0)
            # q[token] > 0 for every emitted token (docs/behaviour.md "Sampling math"); log(0) =
            # -inf would mean a bug, and the server writes it as llama-server writes a zero
            # probability
            with np.errstate(divide="ignore"):
                logp = np.log(q[np.append(ids, token)].astype(np.float64))
        else:
            # log-softmax in float64 with the max subtracted first (exp never overflows); a -inf
            # logit is probability 0 and never an alternative
            x = row.astype(np.float64)
            m = x.max()
            lse = m + np.log(np.exp(x - m).sum())
            ids = top_ids(x, self.n_probs, -np.inf)
            logp = x[np.append(ids, token)] - lse
        top = tuple(Alternative(int(t), self.piece(int(t)), float(lp))
                    for t, lp in zip(ids, logp[:-1]))
        return TokenLogprob(int(token), self.piece(int(token)), float(logp[-1]), top)
