"""The verifier drafts for itself: its next-n (MTP) layer proposes the draft (``--drafter mtp``,
llama.cpp's ``--spec-type draft-mtp``), sampled from the head's warped distribution and checked by
any acceptance rule with the head's real probabilities.

Dimension letters: E = the model's ``n_embd_out`` (a hidden row), V = vocabulary size,
k = draft length, L = committed tokens.

The MTP layer reads a token paired with the verifier's hidden row ``h`` at the position before it
(llama.cpp's "nextn embeddings", cactus_gguf/llama/nextn.py) and predicts the token after it. Its
own context (the head, ``LLAMA_CONTEXT_TYPE_MTP``) keeps an attention KV cache of those pairs:
  - every verifier decode of tokens x_a .. x_b (prefill chunks, verification batches) is
    followed, through ``Context.on_decode``, by the head decoding the same tokens at the same
    positions paired with h_{a-1} .. h_{b-1} (:class:`MtpHead`), so the head holds exactly what
    the verifier holds (``follows``);
  - a step drafts from the last committed token t_{L-1} paired with h_{L-2}: d_1 from the head's
    logits, then each d_i paired with the head's own hidden row of the token before (one head
    chained, as llama.cpp does for qwen35), then drops those draft-phase entries: the verification
    batch's catch-up writes the true pairs;
  - a rollback of the verifier is mirrored, the hidden row at the new end taken from the last
    batch's rows; a head that can no longer follow (a rollback past them, an emptied verifier)
    is re-synchronised by decoding the verifier's tokens again (``resync``).
Source: llama.cpp's ``common_speculative_impl_draft_mtp`` (common/speculative.cpp, vendored in
llama-cpp-python 0.3.36), single-head mode.
"""
from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from ..llama import Context
from ..llama import nextn
from .draft import SamplingDrafter

__all__ = ["MtpHead", "MtpDrafter"]

log = logging.getLogger(__name__)


class MtpHead:
    """The MTP context kept in step with the verifier's (engine lifetime).

    ``ver``: the verifier's Context (its model loaded with ``load_mtp``); ``head``: the MTP
    Context over the same model (ContextOptions.mtp). Sets both contexts' hidden-row outputs and
    observes every verifier decode. ``h_last``: float32 [E], the verifier's hidden row at the
    head's last position (what pairs the next token), None when unknown.
    """

    def __init__(self, ver: Context, head: Context) -> None:
        self.ver, self.head = ver, head
        self.E = ver.model.n_embd_out
        nextn.set_embeddings_nextn(ver.ptr, True, False)  # h for every token of each batch
        nextn.set_embeddings_nextn(head.ptr, True, True)  # the head's own h for its outputs
        self.h_last: np.ndarray | None = None
        self._rows = np.zeros((0, self.E), np.float32)  # the last verifier decode's h rows ..
        self._rows_at = 0  # .. at positions _rows_at ..
        self.n_caught_up = 0  # tokens the head decoded after the verifier (the engine zeroes it
        # when a prompt's processing begins: what a drafter's reset reports as reused)
        ver.on_decode = self._observe

    def close(self) -> None:
        self.ver.on_decode = None

    @property
    def follows(self) -> bool:
        """The head holds exactly the verifier's tokens, and the hidden row that pairs the next."""
        return self.head.n_past == self.ver.n_past and (self.h_last is not None
                                                        or self.head.n_past == 0)

    def _state_before(self, n: int) -> np.ndarray | None:
        """h_{n-1} (zeros for n = 0, as llama.cpp starts), from the last batch's rows, or None."""
        if n == 0:
            return np.zeros(self.E, np.float32)
        i = n - 1 - self._rows_at
        return self._rows[i].copy() if 0 <= i < len(self._rows) else None

    def align(self) -> None:
        """Mirror a rollback of the verifier: cut the head to the verifier's length, the hidden
        row at the new end from the last batch (unknown past it: ``follows`` is then False)."""
        n = self.ver.n_past
        if self.head.n_past > n:
            self.head.forget(n)  # a plain KV cache: exact
        if self.head.n_past == n:
            self.h_last = self._state_before(n)
        else:
            self.h_last = None

    def _observe(self, start: int, m: int) -> None:
        """After the verifier decoded its tokens at ``start`` .. ``start + m - 1``: the head
        decodes them paired with h_{start-1} .. h_{start+m-2}."""
        rows = nextn.embeddings_nextn(self.ver.ptr, m, self.E)
        if self.head.n_past > start:
            self.head.forget(start)
            self.h_last = self._state_before(start)
        if self.head.n_past == start and (self.h_last is not None or start == 0):
            first = self.h_last if start > 0 else np.zeros(self.E, np.float32)
            states = np.vstack([first[None], rows[:-1]]) if m > 1 else first[None]
            self.head.decode_states(self.ver.tokens[start:start + m], states)
            self.n_caught_up += m
            self.h_last = rows[-1].copy()
        else:
            self.h_last = None  # a gap the head cannot fill: resync() decodes again
        self._rows, self._rows_at = np.array(rows), start

    def resync(self) -> int:
        """Make the head follow the verifier again, decoding the verifier's tokens from the start
        when it cannot (both contexts then hold what they held). The tokens decoded again."""
        if self.follows and self.head.tokens == self.ver.tokens:
            return 0
        held = list(self.ver.tokens)
        log.debug("MTP head re-synchronised: %d verifier tokens decoded again", len(held))
        self.head.clear()
        self.ver.clear()
        self.h_last = None
        if held:
            self.ver.decode(held, n_logits=0)
        return len(held)


class MtpDrafter(SamplingDrafter):
    """Drafts with the verifier's own MTP head (the Drafter protocol of drafters.py) through the
    one draft loop (draft.py): each token sampled from the head's warped distribution p (under the
    grammar's mask), so every acceptance rule sees the head's real probabilities."""

    vocab_method, shared_v = "same", None

    def __init__(self, mtp: MtpHead, n_vocab: int) -> None:
        self.mtp, self.ctx = mtp, mtp.head
        self.n_vocab = n_vocab
        self.n_logits = min(n_vocab, mtp.head.n_vocab)
        self._rows_d = np.zeros((0, n_vocab), dtype=np.float32)
        self._base = 0  # the head's tokens before a draft: what it keeps after

    def reset(self, prompt: Sequence[int], *, reuse: bool, lazy: bool = False) -> int | None:
        """After the verifier holds the prompt but its last token: the head follows it (the
        tokens it did not decode again are returned: those it held before this prompt was
        processed; ``n_caught_up`` counts the head's decodes since the engine's prefill began,
        engine.py)."""
        if len(prompt) + 1 > self.mtp.head.n_ctx:
            return None
        redone = self.mtp.resync()
        return max(0, len(prompt) - 1 - max(redone, self.mtp.n_caught_up))

    def resync(self, committed: Sequence[int]) -> bool:
        self.mtp.resync()
        return True

    def room(self, committed: Sequence[int]) -> int:
        # it decodes t_{L-1} and d_1 .. d_{k-1}
        return self.mtp.head.n_ctx - len(committed) + 1

    def why_no_room(self, committed: Sequence[int]) -> str:
        return "MTP context full"

    # -- the draft loop's model (SamplingDrafter) -------------------------------------------------

    def _start(self, committed: Sequence[int]) -> np.ndarray | None:
        mtp, head = self.mtp, self.mtp.head
        if not mtp.follows:  # a rollback past the last batch's rows (rare): decode again
            mtp.resync()
        # the head drafts from t_{L-1} paired with h_{L-2}: the verifier must hold exactly
        # committed[:-1] (after a rollback to a checkpoint it holds fewer: the verification
        # batch catches up, and this step is verifier-only)
        if mtp.ver.n_past != len(committed) - 1:
            return None
        self._base = head.n_past
        return head.decode_states(committed[-1:], mtp.h_last[None])

    def _advance(self, token: int, n: int) -> np.ndarray:
        # d_n paired with the head's own hidden row of the token before it
        h = nextn.embeddings_nextn_ith(self.ctx.ptr, -1, self.mtp.E)[None].copy()
        return self.ctx.decode_states([token], h)

    def _finish(self) -> None:
        self.ctx.forget(self._base)  # the verification batch writes the true pairs there

    def rollback(self, n_keep: int) -> None:
        """Mirror the verifier's rollback (the step made it first)."""
        self.mtp.align()
