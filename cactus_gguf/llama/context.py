"""One llama.cpp context over a loaded model: the KV cache, batched decoding, logits, rollback.

Dimension letters: V = vocabulary size (rows of the output layer), n = rows in one batch.

The context remembers the token ids its KV cache holds (``tokens``: positions 0 .. n_past-1 of
sequence 0), so a caller can reuse the longest common prefix with what it wants the cache to hold
(:meth:`Context.sync`: llama-server's ``cache_prompt``) instead of decoding everything again.
Every ``llama_decode`` / ``llama_memory_seq_rm`` result is checked; a failed decode rolls the cache
back to its state before the call.

On Mesa's lavapipe (the software Vulkan device the GPU tests run on) a context's first decodes
are a warm-up that makes ggml-vulkan's flash-attention scratch as large as it will ever need, so it
never grows later: lavapipe crashes when it does (lavapipe.py). Flash attention stays on: without it
lavapipe's one-row and multi-row kernels round differently, and greedy speculation would not give
the verifier's tokens.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import llama_cpp
from llama_cpp import _internals

from ..errors import CapacityError, EngineError, InputError
from ..options import check_fields, opt
from . import devices, log
from .hw import default_threads, physical_memory
from .model import ModelLoadError, Model, ModelOptions
from .lavapipe import AttentionShape, WarmupPlan, warmup_plan
from .placement import kv_shares, on_lavapipe

__all__ = ["ContextOptions", "Context", "DecodeError", "DecodeCancelled", "KvCacheTooLargeError"]


class DecodeError(EngineError):
    """``llama_decode`` returned a non-zero status, or a KV-cache edit failed."""


class DecodeCancelled(DecodeError):
    """A decode of several ``n_batch`` chunks was stopped between two of them (see
    :meth:`Context.interruptible`); the KV cache holds the chunks decoded before."""


class KvCacheTooLargeError(CapacityError):
    """The KV cache of the requested n_ctx would not fit in the machine's memory."""

    exit_code = 2


@dataclass(frozen=True)
class ContextOptions:
    """A llama.cpp context.

    n_ctx: KV-cache size in tokens (llama.cpp ``-c``); 0 = the model's training context.
    n_batch: most tokens submitted to one ``llama_decode`` (prompt processing is chunked by it).
    n_threads: CPU threads for generation and batch processing (``-t``); None = all usable cores.
    flash_attn: "auto", "on" or "off" (llama.cpp ``-fa``).
    The allowed values are those of the options of the same names (options.py).
    """

    n_ctx: int = opt("n_ctx")
    n_batch: int = opt("n_batch")
    n_threads: int | None = opt("n_threads")
    flash_attn: str = opt("flash_attn")

    __post_init__ = check_fields


_FLASH_ATTN = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
               "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def _check_kv_cache_fits(model: Model, n_ctx: int) -> None:
    """Raise KvCacheTooLargeError when the KV cache of ``n_ctx`` tokens (``kv_cache_bytes``) is
    larger than the machine's memory, or a device's share of it than that device's free memory."""
    # A KV cache larger than the machine's memory is not an error in llama.cpp: it allocates
    # (or spends minutes trying) until the OOM killer ends the process. Refuse it up front.
    kv_bytes, ram = model.kv_cache_bytes(n_ctx), physical_memory()
    if ram and kv_bytes > ram:
        raise KvCacheTooLargeError(
            f"{{n_ctx}}={n_ctx} needs about {kv_bytes / 2**30:.1f} GiB of KV cache for "
            f"{model.path.name}, more than this machine's {ram / 2**30:.1f} GiB of memory: "
            "lower {n_ctx}", param="n_ctx")
    # ... and a device's share larger than its free memory (ggml's figure for it, after the
    # weights): llama.cpp would fail to allocate it (or, on a driver that oversubscribes,
    # page it to and fro); llama.cpp's own `--fit` would shrink the context instead
    for name, description, share, free in (kv_shares(model.placement, kv_bytes)
                                             if model.placement is not None else ()):
        if share > free:
            raise KvCacheTooLargeError(
                f"{{n_ctx}}={n_ctx} needs about {share / 2**30:.1f} GiB of KV cache on "
                f"{name} ({description}) for {model.path.name}, more than its "
                f"{free / 2**30:.1f} GiB free: lower {{n_ctx}} (or offload fewer layers)",
                param="n_ctx")


class Context:
    """A single-sequence llama.cpp context over ``model``.

    ``tokens``: the ids at positions 0 .. n_past-1 of the KV cache (read-only for callers; every
    edit goes through decode / truncate / clear / sync). ``model``: the Model; when the context
    was made by :meth:`load` it owns the model and frees it on ``close()`` (context first).

    Raises ModelLoadError when llama.cpp cannot create the context, KvCacheTooLargeError when the
    KV cache would not fit in memory.
    """

    def __init__(self, model: Model, options: ContextOptions = ContextOptions(), *,
                 owns_model: bool = False) -> None:
        self.model = model
        self.owns_model = owns_model
        # Layers on an RPC server: the calls that talk to it run on devices' worker thread, so a
        # server lost mid-call raises RpcServerLostError here instead of aborting the process.
        self._remote = model.remote
        self._ctx: _internals.LlamaContext | None = None
        self._batch: _internals.LlamaBatch | None = None
        _check_kv_cache_fits(model, options.n_ctx or model.n_ctx_train)
        self.n_threads = options.n_threads or default_threads()
        self._create(options)
        self.n_ctx: int = llama_cpp.llama_n_ctx(self.ptr)
        self.n_batch: int = llama_cpp.llama_n_batch(self.ptr)
        self.tokens: list[int] = []
        self._should_stop = None  # interruptible(): asked between the n_batch chunks of a decode
        self._make_batch()
        #: the warm-up this context made (module docstring; None off lavapipe)
        self.warmup: WarmupPlan | None = None
        if options.flash_attn != "off" and on_lavapipe(model.placement):
            self._warm_up()

    def _warm_up(self) -> None:
        """On lavapipe: decode the prompt chunks and then the batch of
        :func:`lavapipe.warmup_plan`, then clear the cache. A failed decode is left to the first
        real one to report."""
        plan = warmup_plan(self.model.attention_shape, self.n_ctx, self.n_batch)
        token = max(0, self.model.bos)
        try:
            for rows in plan.chunks:
                self.decode([token] * rows, n_logits=0)
            if plan.rows:
                self.decode([token] * plan.rows, n_logits=plan.rows)
        except DecodeError:
            return
        finally:
            self.clear()
        self.warmup = plan

    def _create(self, options: ContextOptions) -> None:
        """Create the llama.cpp context (``self._ctx``, its ``ptr`` and ``memory``), allocating
        the KV cache on the model's devices. Raises ModelLoadError when llama.cpp cannot."""
        model = self.model
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = options.n_ctx
        cparams.n_batch = options.n_batch
        cparams.n_ubatch = options.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.flash_attn_type = _FLASH_ATTN[options.flash_attn]
        cparams.no_perf = True
        log.clear_errors()
        try:
            with log.critical():  # allocates the KV cache on the model's devices
                self._ctx = devices.call(model.remote, lambda: _internals.LlamaContext(
                    model=model._model, params=cparams, verbose=True))
        except ValueError:
            raise ModelLoadError(f"llama.cpp could not create a context for {model.path} "
                                 f"(n_ctx={options.n_ctx}): {log.last_error()}") from None
        self.ptr = self._ctx.ctx
        self.memory = self._ctx.memory
        if model.remote:
            devices.abandon_on_loss(self._abandon)

    def _make_batch(self) -> None:
        """The one reusable batch of n_batch rows, with NumPy views on its token, pos and logits
        arrays (int32 / int32 / int8 [n_batch]); seq_id / n_seq_id never change (one sequence)."""
        with log.critical():
            self._batch = _internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1)
        b = self._batch.batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0

    @classmethod
    def load(cls, path: str | os.PathLike[str], model_options: ModelOptions = ModelOptions(),
             context_options: ContextOptions = ContextOptions()) -> "Context":
        """Load the GGUF at ``path`` and create a context that owns it. On any error nothing stays
        allocated. Raises ModelLoadError / KvCacheTooLargeError."""
        model = Model(path, model_options)
        try:
            return cls(model, context_options, owns_model=True)
        except BaseException:
            model.close()
            raise

    # -- lifetime ----------------------------------------------------------------------------------

    def _abandon(self) -> None:
        """After a lost RPC server: never free the context (llama.cpp would wait for the server)."""
        if self._ctx is not None:
            self._ctx._exit_stack = contextlib.ExitStack()

    def close(self) -> None:
        """Free the batch and the context, then the model if this context owns it. Idempotent."""
        for attr in ("_batch", "_ctx"):
            obj = getattr(self, attr, None)
            if obj is not None:
                devices.free(self._remote, obj.close)
                setattr(self, attr, None)
        if self.owns_model:
            self.model.close()

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- decoding ----------------------------------------------------------------------------------

    @property
    def n_past(self) -> int:
        """Tokens whose keys/values are in the KV cache."""
        return len(self.tokens)

    @property
    def n_vocab(self) -> int:
        return self.model.n_vocab

    @contextlib.contextmanager
    def interruptible(self, should_stop):
        """Within the block, a decode of more than ``n_batch`` tokens (a prompt) calls
        ``should_stop()`` before each chunk after the first and, when it is true, stops there with
        DecodeCancelled (the chunks decoded so far stay in the cache, ``tokens`` says which)."""
        previous, self._should_stop = self._should_stop, should_stop
        try:
            yield self
        finally:
            self._should_stop = previous

    def decode(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` at positions ``n_past ..`` and run the model.

        Logits are requested only for the last ``n_logits`` rows (0 = none).
        Returns: float32 [n_logits, V], a zero-copy view on llama.cpp's output buffer, valid until
        the next decode on this context. Tokens longer than ``n_batch`` are decoded in chunks.

        Raises DecodeError when the context is full or ``llama_decode`` fails; the KV cache is
        then rolled back to its state before the call. Raises DecodeCancelled when the
        :meth:`interruptible` check said stop between two chunks.
        """
        n = len(tokens)
        if n == 0:
            raise InputError("decode needs at least one token")
        if not 0 <= n_logits <= min(n, self.n_batch):
            raise InputError(f"n_logits must be in [0, {min(n, self.n_batch)}], got {n_logits}")
        if self.n_past + n > self.n_ctx:
            raise DecodeError(f"context full: {self.n_past} + {n} tokens > n_ctx={self.n_ctx}")
        start = self.n_past
        # Chunks of n_batch with the short one first: the last chunk holds the last
        # min(n, n_batch) >= n_logits rows, so every requested row is in the last decode's output
        # (llama_get_logits only holds the last call's rows).
        first_chunk = n - (n - 1) // self.n_batch * self.n_batch  # in [1, n_batch]
        bounds = [0, *range(first_chunk, n + 1, self.n_batch)]
        for c0, c1 in zip(bounds, bounds[1:]):
            if c0 > 0 and self._should_stop is not None and self._should_stop():
                raise DecodeCancelled(f"decode stopped after {c0} of {n} tokens")
            chunk = tokens[c0:c1]
            m = len(chunk)
            self._b_token[:m] = chunk
            self._b_pos[:m] = np.arange(self.n_past, self.n_past + m, dtype=np.int32)
            # logits wanted for global rows n - n_logits .. n - 1
            first_out = max(0, (n - n_logits) - c0)
            self._b_logits[:m] = 0
            if first_out < m:
                self._b_logits[first_out:m] = 1
            self._batch.batch.n_tokens = m
            rc = devices.call(self._remote, llama_cpp.llama_decode, self.ptr, self._batch.batch)
            if rc != 0:
                # let truncate() drop whatever the failed call may have stored
                self.tokens.extend(int(t) for t in chunk)
                self.truncate(start)
                what = {1: "no KV-cache slot for the batch (context full)",
                        2: "aborted"}.get(rc, "error")
                raise DecodeError(f"llama_decode returned {rc}: {what}")
            self.tokens.extend(int(t) for t in chunk)
        return self.logits(n_logits) if n_logits else np.empty((0, self.n_vocab), np.float32)

    def logits(self, n_rows: int) -> np.ndarray:
        """The last decode's output logits: float32 [n_rows, V], a zero-copy view."""
        # synchronises with the device's copy of the logits (over RPC: waits for the server)
        ptr = devices.call(self._remote, llama_cpp.llama_get_logits, self.ptr)
        if not ptr:
            raise DecodeError("llama_get_logits returned NULL")
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))

    def truncate(self, n_keep: int) -> None:
        """Roll the KV cache back so that it holds exactly positions ``0 .. n_keep-1``.

        Raises DecodeError when llama.cpp cannot remove the tail (``llama_memory_seq_rm`` false).
        """
        if not 0 <= n_keep <= self.n_past:
            raise InputError(f"n_keep must be in [0, {self.n_past}], got {n_keep}")
        if n_keep == self.n_past:
            return
        if not llama_cpp.llama_memory_seq_rm(self.memory, 0, n_keep, -1):
            raise DecodeError(f"llama_memory_seq_rm could not remove positions >= {n_keep}")
        del self.tokens[n_keep:]

    def clear(self) -> None:
        """Empty the KV cache."""
        devices.call(self._remote, llama_cpp.llama_memory_clear, self.memory, True)
        self.tokens.clear()

    def shared_prefix(self, target: Sequence[int]) -> int:
        """How many leading tokens of ``target`` the cache already holds."""
        held, n = self.tokens, 0
        limit = min(len(held), len(target))
        while n < limit and held[n] == target[n]:
            n += 1
        return n

    def sync(self, target: Sequence[int], *, reuse: bool = True) -> int:
        """Make the cache hold exactly ``target``, reusing the longest common prefix of what it
        holds (``reuse``; else from empty) and decoding only the rest, without logits.

        Returns the number of tokens reused (not decoded again). Raises DecodeError as decode.
        """
        n = self.shared_prefix(target) if reuse else 0
        if n == 0:
            self.clear()
        else:
            try:
                self.truncate(n)
            except DecodeError:  # a cache that cannot drop a tail (llama.cpp refused): start over
                self.clear()
                n = 0
        if len(target) > n:
            self.decode(target[n:], n_logits=0)
        return n

    def kv_pos_max(self) -> int:
        """Largest position stored in the KV cache for sequence 0 (-1 when empty)."""
        return llama_cpp.llama_memory_seq_pos_max(self.memory, 0)
