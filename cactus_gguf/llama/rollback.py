"""Rollback of a context's cache (truncate, forget, checkpoints, clear), its state files, the
context shift and prefix reuse (``sync``): the :class:`Rollback` part of
:class:`~cactus_gguf.llama.context.Context`, which it is mixed into.

Rollback (:meth:`Context.truncate`, :meth:`Context.forget`) is exact for every model. A KV-only model
cuts its cache (``llama_memory_seq_rm``). A model with a recurrent state (pure or hybrid: Mamba-2,
gated delta-net, short convolutions beside attention) cannot cut that state at an arbitrary
position; the context keeps it exact with the two means llama.cpp offers (docs/models.md
"Hybrid models"; measured by benchmarks/recurrent_rollback.py):

- **the snapshot window**: with ``n_rs_seq`` = R, a decode keeps the recurrent state after each
  of the last R tokens of its batch, and ``llama_memory_seq_rm`` dropping d of them
  (1 <= d <= min(R, m - 1) for a batch of m tokens) restores the right one, once before the next
  decode. Outside that window llama.cpp may return true and leave a wrong state, so the context
  never asks it there;
- **checkpoints**: the recurrent state saved at a position (``llama_state_seq_get_data_ext`` with
  ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``) and restored with the attention cache cut to it (as
  llama-server's context checkpoints). A caller declares how far back it may roll a decode
  (``decode(..., may_drop=)``) and the context saves one first when the window will not cover it;
  a prompt (``sync``) ends with one, for the next request's prefix reuse. Past every checkpoint the
  tokens are decoded again from the start.
"""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from typing import Sequence

import llama_cpp

from ..errors import InputError
from . import devices
from .device_top_k import DecodeError

__all__ = ["Checkpoint", "MAX_CHECKPOINTS", "Rollback"]

log_ = logging.getLogger("cactus_gguf.llama.context")

#: checkpoints a context keeps: the oldest (usually the prompt's end) and the newest others
MAX_CHECKPOINTS = 4
_PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


class Rollback:
    """The rollback part of :class:`~cactus_gguf.llama.context.Context`, which it is mixed into:
    it reads and edits the context's ``tokens``, ``_checkpoints`` (ascending :class:`Checkpoint`
    objects), ``_window`` (the tokens a ``llama_memory_seq_rm`` can drop exactly now) and
    ``_fresh`` (the tokens a context shift left reusable), and reads ``ptr``, ``memory``,
    ``seq_id``, ``n_seq``, ``n_ctx``, ``n_past``, ``recurrent``, ``_remote``, ``model`` and
    ``decode``."""

    def truncate(self, n_keep: int) -> None:
        """Roll the cache back so that it holds exactly positions ``0 .. n_keep-1``, decoding
        again the tokens past the checkpoint it restores when the model's recurrent state cannot
        be cut there (module docstring).

        Raises DecodeError when llama.cpp cannot remove the tail or a decode fails.
        """
        held = self.tokens[:n_keep]
        if self.forget(n_keep) < n_keep:
            log_.debug("%s: decoding %d tokens again after a checkpoint at %d",
                       self.model.path.name, n_keep - self.n_past, self.n_past)
            self.decode(held[self.n_past:], n_logits=0)

    def forget(self, n_keep: int, upto: int | None = None) -> int:
        """Roll the cache back to hold positions ``0 .. n_keep-1``, decoding nothing: exactly
        that for a KV-only model or inside the snapshot window; else, when the caller accepts
        holding up to ``upto`` tokens (>= n_keep: they are still its own) and the window reaches
        that far, the fewest the window leaves; else the newest checkpoint at or before
        ``n_keep`` (else nothing). Returns ``n_past`` after it: for a caller that decodes the rest
        anyway (a drafter's next catch-up, the next verification batch).

        Raises InputError (``n_keep`` out of range), DecodeError (llama.cpp refused).
        """
        if not 0 <= n_keep <= self.n_past:
            raise InputError(f"n_keep must be in [0, {self.n_past}], got {n_keep}")
        if n_keep == self.n_past:
            return n_keep
        reach = self.n_past - self._window  # the fewest tokens a cut in the window leaves
        if n_keep == 0:
            self.clear()
        elif not self.recurrent or n_keep >= reach:
            self._cut(n_keep)
        elif upto is not None and reach <= upto:
            if reach < self.n_past:
                self._cut(reach)
        else:
            point = next((c for c in reversed(self._checkpoints) if c.n_tokens <= n_keep), None)
            if point is None:
                log_.debug("%s: no checkpoint at or before %d of %d tokens: cleared",
                           self.model.path.name, n_keep, self.n_past)
                self.clear()
            else:
                self._restore(point)
        return self.n_past

    def _cut(self, n_keep: int) -> None:
        """``llama_memory_seq_rm`` of positions >= ``n_keep`` (a KV-only cache, or inside the
        recurrent state's window)."""
        if not llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, n_keep, -1):
            raise DecodeError(f"llama_memory_seq_rm could not remove positions >= {n_keep}")
        self._window = 0  # llama.cpp's snapshot is single-use
        self._drop(n_keep)

    def _drop(self, n_keep: int) -> None:
        """Forget the tokens past ``n_keep`` and the checkpoints that held any of them."""
        del self.tokens[n_keep:]
        if self._fresh is not None and self._fresh >= n_keep:
            self._fresh = None
        while self._checkpoints and self._checkpoints[-1].n_tokens > n_keep:
            self._checkpoints.pop()

    def checkpoint(self) -> None:
        """Save the recurrent state at ``n_past`` (no-op for a KV-only model, an empty cache, or
        when one is saved there already). Keeps the oldest and the newest ``MAX_CHECKPOINTS`` - 1.
        Raises DecodeError when llama.cpp cannot copy the state."""
        if not self.recurrent or not self.tokens or (
                self._checkpoints and self._checkpoints[-1].n_tokens == self.n_past):
            return
        size = devices.call(self._remote, llama_cpp.llama_state_seq_get_size_ext,
                            self.ptr, self.seq_id, _PARTIAL)
        data = (ctypes.c_uint8 * size)()
        got = devices.call(self._remote, llama_cpp.llama_state_seq_get_data_ext,
                           self.ptr, data, size, self.seq_id, _PARTIAL)
        if got != size:
            raise DecodeError(f"llama_state_seq_get_data_ext copied {got} of {size} bytes of "
                              f"the recurrent state of {self.model.path.name}")
        if len(self._checkpoints) >= MAX_CHECKPOINTS:
            del self._checkpoints[1]
        self._checkpoints.append(Checkpoint(self.n_past, data))

    def _restore(self, point: "Checkpoint") -> None:
        """Put the recurrent state back to ``point`` and cut the attention cache there."""
        got = devices.call(self._remote, llama_cpp.llama_state_seq_set_data_ext,
                           self.ptr, point.data, len(point.data), self.seq_id, _PARTIAL)
        if got != len(point.data):
            self.clear()  # llama.cpp cleared the sequence's state on failure
            raise DecodeError(f"llama_state_seq_set_data_ext restored {got} of "
                              f"{len(point.data)} bytes of the recurrent state of "
                              f"{self.model.path.name}")
        log_.debug("%s: restored the checkpoint at %d of %d tokens", self.model.path.name,
                   point.n_tokens, self.n_past)
        # the recurrent state now ends at n_tokens - 1: this cuts the attention cache alone
        if not llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, point.n_tokens, -1):
            self.clear()
            raise DecodeError(f"llama_memory_seq_rm could not remove positions >= "
                              f"{point.n_tokens} after restoring a checkpoint")
        self._window = 0
        self._drop(point.n_tokens)

    def clear(self) -> None:
        """Empty the sequence's KV cache (and its recurrent state, and its checkpoints)."""
        if self.n_seq == 1:
            devices.call(self._remote, llama_cpp.llama_memory_clear, self.memory, True)
        else:
            devices.call(self._remote, llama_cpp.llama_memory_seq_rm, self.memory, self.seq_id,
                         -1, -1)
        self.tokens.clear()
        self._checkpoints.clear()
        self._window = 0
        self._fresh = None

    def save_file(self, path: str | os.PathLike[str]) -> int:
        """Write the cache (sequence 0: its KV cache and any recurrent state) and its tokens to
        ``path`` (llama.cpp's state file). Returns the bytes written. Raises DecodeError when
        llama.cpp writes nothing."""
        ids = (llama_cpp.llama_token * max(len(self.tokens), 1))(*self.tokens)
        n = devices.call(self._remote, llama_cpp.llama_state_seq_save_file, self.ptr,
                         os.fsencode(path), self.seq_id, ids, len(self.tokens))
        if n == 0:
            raise DecodeError(f"llama_state_seq_save_file wrote nothing to {path}")
        return int(n)

    def load_file(self, path: str | os.PathLike[str]) -> int:
        """Replace the cache by the one :meth:`save_file` wrote to ``path`` (the same model's);
        ``tokens`` becomes the tokens saved with it. Returns the bytes read. Raises DecodeError
        when llama.cpp cannot read it (another model's file, a file cut short, more tokens than
        n_ctx): the cache is then empty."""
        self.clear()
        ids = (llama_cpp.llama_token * self.n_ctx)()
        count = ctypes.c_size_t(0)
        n = devices.call(self._remote, llama_cpp.llama_state_seq_load_file, self.ptr,
                         os.fsencode(path), self.seq_id, ids, self.n_ctx, ctypes.byref(count))
        if n == 0:
            self.clear()
            raise DecodeError(f"llama_state_seq_load_file could not read {path}: not a state "
                              f"file of {self.model.path.name} with this n_ctx")
        self.tokens[:] = ids[:count.value]
        self.checkpoint()  # a recurrent state: the next request's prefix reuse restores it
        return int(n)

    @property
    def can_shift(self) -> bool:
        """Whether :meth:`shift` is exact here: a KV cache llama.cpp can shift
        (``llama_memory_can_shift``), no recurrent state."""
        return not self.recurrent and bool(llama_cpp.llama_memory_can_shift(self.memory))

    def shift(self, n_keep: int, n_discard: int) -> None:
        """llama-server's context shift: drop positions ``n_keep .. n_keep + n_discard - 1`` and
        move the later ones down by ``n_discard`` (``llama_memory_seq_rm`` then
        ``llama_memory_seq_add``: RoPE re-rotates their keys), so ``tokens`` loses those ids and
        decoding goes on at ``n_past``. The moved entries were computed beside the dropped
        tokens, so another generation reuses at most the first ``n_keep`` (``shared_prefix``).
        Raises InputError (out of range, or a cache that cannot shift: ``can_shift``),
        DecodeError (llama.cpp refused the removal)."""
        if not (0 <= n_keep and 0 < n_discard and n_keep + n_discard <= self.n_past):
            raise InputError(f"shift needs 0 <= n_keep and 0 < n_discard with n_keep + n_discard "
                             f"<= {self.n_past}, got {n_keep} and {n_discard}")
        if not self.can_shift:
            raise InputError(f"the KV cache of {self.model.path.name} cannot shift")
        end = n_keep + n_discard
        if not llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, n_keep, end):
            raise DecodeError(f"llama_memory_seq_rm could not remove positions {n_keep} .. "
                              f"{end - 1}")
        llama_cpp.llama_memory_seq_add(self.memory, self.seq_id, end, self.n_past, -n_discard)
        del self.tokens[n_keep:end]
        self._window = 0
        self._fresh = n_keep if self._fresh is None else min(self._fresh, n_keep)

    def shared_prefix(self, target: Sequence[int]) -> int:
        """How many leading tokens of ``target`` the cache already holds (as a prefill of them
        would: never past a context shift's kept tokens)."""
        held, n = self.tokens, 0
        limit = min(len(held), len(target), len(held) if self._fresh is None else self._fresh)
        while n < limit and held[n] == target[n]:
            n += 1
        return n

    def sync(self, target: Sequence[int], *, reuse: bool = True) -> int:
        """Make the cache hold exactly ``target``, reusing the longest common prefix of what it
        holds (``reuse``; else from empty) that it can roll back to without decoding, and
        decoding only the rest, without logits. A model with a recurrent state then saves a
        checkpoint (the next request's prefix reuse restores it).

        Returns the number of tokens reused (not decoded again). Raises DecodeError as decode.
        """
        n = self.shared_prefix(target) if reuse else 0
        try:
            n = self.forget(n)
        except DecodeError:  # a cache that cannot drop a tail (llama.cpp refused): start over
            self.clear()
            n = 0
        if len(target) > n:
            self.decode(target[n:], n_logits=0)
        self.checkpoint()
        return n

    def kv_pos_max(self) -> int:
        """Largest position stored in the KV cache for this sequence (-1 when empty)."""
        return llama_cpp.llama_memory_seq_pos_max(self.memory, self.seq_id)


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """The recurrent state after the first ``n_tokens`` tokens of the cache: ``data``, llama.cpp's
    serialised partial state of sequence 0 (uint8 [size]; LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY: the
    recurrent part without the attention KV)."""

    n_tokens: int
    data: ctypes.Array
