"""One llama.cpp context over a loaded model: the KV cache, batched decoding, logits, rollback.

Dimension letters: V = vocabulary size (rows of the output layer), n = rows in one batch.

The context remembers the token ids its KV cache holds (``tokens``: positions 0 .. n_past-1 of
its sequence), so a caller can reuse the longest common prefix with what it wants the cache to hold
(:meth:`Context.sync`: llama-server's ``cache_prompt``) instead of decoding everything again.
Every ``llama_decode`` / ``llama_memory_seq_rm`` result is checked; a failed decode rolls the cache
back to (a prefix of) its state before the call.

Sequences (llama-server's slots): a context made with ``n_parallel`` = N > 1 holds N independent
sequences, each with its own KV cache of ``n_ctx`` / N positions (llama.cpp's non-unified cache:
``n_ctx_seq``; with ``kv_unified`` they share one pool of ``n_ctx`` cells, each sequence up to
all of them) and its own recurrent state. The Context object is sequence 0;
:meth:`Context.sequence` gives the others, each a Context of its own (tokens, checkpoints,
rollback) over the same llama.cpp context, model and threads. A decode of one sequence holds only
its tokens; another sequence's decode in between ends the snapshot window (rollback.py), so a
rollback then goes through a checkpoint.

Rollback (:meth:`Context.truncate`, :meth:`Context.forget`) is exact for every model, a model with
a recurrent state included: by llama.cpp's snapshot window or a checkpoint (rollback.py explains
both; checkpoints, state files, the context shift and ``sync`` live there too).

On Mesa's lavapipe (the software Vulkan device the GPU tests run on), when asked for with
``CACTUS_GGUF_LAVAPIPE_WARMUP=1`` (the Vulkan tests and benchmarks/gpu_check.sh set it), a
context's first decodes are a warm-up that makes ggml-vulkan's flash-attention scratch as large as
it will ever need, so it never grows later: lavapipe crashes when it does (lavapipe.py). Without
the variable no context warms up, lavapipe or not; with it, another llama.cpp than the one the
warm-up mirrors is refused, and a warm-up decode that fails closes the context and raises. Flash
attention stays on: without it lavapipe's one-row and multi-row kernels round differently, and
greedy speculation would not give the verifier's tokens.
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import logging
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

import llama_cpp
from llama_cpp import _internals

from ..errors import InputError
from ..options import check_fields, default, opt
from . import devices, log
from .hw import default_threads
from .model import ModelLoadError, Model, ModelOptions
from .lavapipe import WarmupFailedError, WarmupPlan, warmup_plan, warmup_wanted
from .device_top_k import DecodeCancelled, DecodeError, DeviceTopK
from .placement import KvCacheTooLargeError, check_kv_cache_fits
from .rollback import Checkpoint, Rollback

__all__ = ["ContextOptions", "Context", "DecodeError", "DecodeCancelled", "KvCacheTooLargeError",
           "RS_SNAPSHOTS"]

log_ = logging.getLogger(__name__)

#: recurrent-state snapshots per decode a verifier keeps by default (llama.cpp ``n_rs_seq``): the
#: longest draft ``-k auto`` may choose by default (``--k-max``), so that its rollbacks stay in the
#: snapshot window; longer drafts roll back through a checkpoint (exact, one state copy per step)
RS_SNAPSHOTS: int = default("k_max")


@dataclass(frozen=True)
class ContextOptions:
    """A llama.cpp context.

    n_ctx: KV-cache size in tokens (llama.cpp ``-c``); 0 = the model's training context.
    n_batch: most tokens submitted to one ``llama_decode`` (prompt processing is chunked by it).
    n_threads: CPU threads for generation and batch processing (``-t``); None = all usable cores.
    flash_attn: "auto", "on" or "off" (llama.cpp ``-fa``).
    The allowed values are those of the options of the same names (cactus_gguf/options/).
    n_rs_seq: for a model with a recurrent state, the snapshots per decode that make a rollback of
    up to that many tokens of the last batch exact in place (llama.cpp ``n_rs_seq``; capped at
    n_batch - 2, llama.cpp's limit); each costs one more copy of the recurrent state in memory.
    0 for a draft model, whose rollbacks span one-token decodes that snapshots never cover (as
    llama-server's draft contexts). Ignored for KV-only models.
    mtp: the context runs the model's next-n (MTP) layer alone (llama.cpp
    ``LLAMA_CONTEXT_TYPE_MTP``; the model loaded with ``load_mtp``), decoded with
    :meth:`Context.decode_states`: a plain attention KV cache, whatever the trunk's memory.
    """

    n_ctx: int = opt("n_ctx")
    n_batch: int = opt("n_batch")
    n_threads: int | None = opt("n_threads")
    flash_attn: str = opt("flash_attn")
    n_rs_seq: int = RS_SNAPSHOTS
    mtp: bool = False
    #: sequences (slots) in the context, each with n_ctx / n_parallel positions (module
    #: docstring), unless ``kv_unified``: they share one pool of n_ctx cells
    n_parallel: int = opt("n_parallel")
    kv_unified: bool = opt("kv_unified")

    __post_init__ = check_fields


_FLASH_ATTN = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
               "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


class Context(Rollback, DeviceTopK):
    """One sequence of a llama.cpp context over ``model`` (sequence 0; :meth:`sequence` gives the
    others of a context made with ``n_parallel`` > 1: ``n_seq``).

    ``tokens``: the ids at positions 0 .. n_past-1 of the sequence's KV cache (read-only for
    callers; every edit goes through decode / truncate / clear / sync). ``n_ctx``: the
    sequence's positions (the context's n_ctx / n_seq). ``model``: the Model; when the context
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
        n_ctx = options.n_ctx or model.n_ctx_train
        check_kv_cache_fits(n_ctx, model.kv_cache_bytes(n_ctx), model.placement, model.path.name)
        self.n_threads = options.n_threads or default_threads()
        self.seq_id = 0
        self.n_seq, self.kv_unified = options.n_parallel, options.kv_unified
        self._owns_ctx = True  # sequence 0 frees the llama.cpp context; the others, their batch
        self._sequences: list[Context] = []  # sequences 1 .. n_seq - 1 handed out (sequence())
        #: the sequence whose decode ran last on the llama.cpp context (ends the others' windows)
        self._last = [self]
        self._together: dict = {}  # what the sequences' batched decodes share (batch.py)
        self._create(options)
        self.n_ctx: int = llama_cpp.llama_n_ctx_seq(self.ptr)
        self.n_batch: int = llama_cpp.llama_n_batch(self.ptr)
        self.tokens: list[int] = []
        self._should_stop = None  # interruptible(): asked between the n_batch chunks of a decode
        self._progress = None  # interruptible(): told before each n_batch chunk of a decode
        #: called after each llama_decode with (its first position, its token count): the MTP
        #: drafter reads the verifier's hidden rows there (speculative/mtp.py)
        self.on_decode = None
        self._batch_ext = None  # decode_states' batch (an MTP context)
        #: the model keeps a recurrent state (rollback.py: rollback by window or checkpoint)
        self.recurrent: bool = model.recurrent and not options.mtp
        #: snapshots llama.cpp keeps per decode (it sets 0 for an architecture without them)
        self.n_rs_seq: int = llama_cpp.llama_n_rs_seq(self.ptr) if self.recurrent else 0
        self._window = 0  # tokens at the end that seq_rm can drop exactly now (recurrent)
        self._checkpoints: list[Checkpoint] = []  # ascending n_tokens, each a prefix of tokens
        #: tokens past this many were computed beside tokens a context shift discarded (shift):
        #: not what a prefill of ``tokens`` would hold, so never reused by another generation
        self._fresh: int | None = None
        #: the K of the backend top-K sampler attached (set_device_top_k; 0: none, every decode
        #: returns full logits rows)
        self.device_top_k = 0
        self._chains: list = []  # every sampler chain ever attached: freed after the context
        self._last_decode: tuple[int, list[int], int] | None = None  # (start, tokens, n_logits)
        self._make_batch()
        #: the lavapipe warm-up this context made (module docstring; None when not asked for or
        #: not on lavapipe)
        self.warmup: WarmupPlan | None = None
        if options.flash_attn != "off" and not options.mtp:
            try:
                if warmup_wanted(model.placement):
                    self._warm_up()
            except BaseException:
                self.close()  # the caller never gets this context (load then frees the model)
                raise

    def _warm_up(self) -> None:
        """Asked for and on lavapipe (lavapipe.warmup_wanted): decode the prompt chunks and then
        the batch of :func:`lavapipe.warmup_plan`, then clear the cache. Raises
        WarmupFailedError when one of its decodes fails."""
        plan = warmup_plan(self.model.attention_shape, self.n_ctx, self.n_batch)
        token = max(0, self.model.bos)
        try:
            for rows in plan.chunks:
                self.decode([token] * rows, n_logits=0)
            if plan.rows:
                self.decode([token] * plan.rows, n_logits=plan.rows)
            self.clear()
        except DecodeError as e:
            raise WarmupFailedError(
                f"the lavapipe warm-up of {self.model.path.name} ({plan.prompt} prompt tokens, "
                f"then {plan.rows} rows) failed: {e}") from e
        log_.debug("lavapipe warm-up of %s: %d prompt tokens in %d chunks, then %d rows "
                   "(%d bytes of split-k scratch%s)", self.model.path.name, plan.prompt,
                   len(plan.chunks), plan.rows, plan.scratch,
                   "" if plan.complete else ", the most an empty cache asks for")
        self.warmup = plan

    def _create(self, options: ContextOptions) -> None:
        """Create the llama.cpp context (``self._ctx``, its ``ptr`` and ``memory``), allocating
        the KV cache on the model's devices. Raises ModelLoadError when llama.cpp cannot."""
        model = self.model
        if options.mtp and (not model.mtp_loaded or model.n_layer_nextn < 1):
            # llama.cpp aborts the process on an MTP context without next-n layers loaded
            raise ModelLoadError(
                f"{model.path.name} has no next-n (MTP) layers: {{drafter}} mtp needs a model "
                "that has them (Qwen3.5), loaded with them" if model.n_layer_nextn < 1 else
                f"{model.path.name} was loaded without its next-n (MTP) layers (load_mtp)",
                param="drafter")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = options.n_ctx
        cparams.n_batch = options.n_batch
        cparams.n_ubatch = options.n_batch
        cparams.n_seq_max = options.n_parallel
        # unified: the sequences share one pool of n_ctx cells (each may use all of them);
        # else each sequence its own n_ctx / n_seq positions
        cparams.kv_unified = options.kv_unified
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.flash_attn_type = _FLASH_ATTN[options.flash_attn]
        cparams.no_perf = True
        if hasattr(cparams, "n_outputs_max_per_seq"):  # backend sampling of every output row
            cparams.n_outputs_max_per_seq = 0  # (set_device_top_k): 0 = n_outputs_max = n_batch
        if options.mtp:
            cparams.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        elif model.recurrent:  # llama.cpp aborts unless n_ubatch > n_rs_seq + 1
            cparams.n_rs_seq = max(0, min(options.n_rs_seq, options.n_batch - 2))
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
        arrays (int32 / int32 / int8 [n_batch]); seq_id / n_seq_id never change (this sequence)."""
        with log.critical():
            self._batch = _internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1)
        b = self._batch.batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = self.seq_id

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

    def sequence(self, seq_id: int) -> "Context":
        """Sequence ``seq_id`` (1 .. n_seq - 1) of this llama.cpp context: a Context of its own
        (empty at first; tokens, checkpoints, rollback, backend sampler) sharing the model, the
        llama.cpp context and its threads. The same object for the same id; freed with sequence
        0's ``close()``. Raises InputError for an id out of range."""
        if self.seq_id != 0 or not 0 < seq_id < self.n_seq:
            raise InputError(f"sequence {seq_id} of a context of {self.n_seq} (ask sequence 0)")
        for view in self._sequences:
            if view.seq_id == seq_id:
                return view
        view = copy.copy(self)  # shares ptr, memory, model, the chains list, _last
        view.seq_id, view.owns_model, view._owns_ctx, view._sequences = seq_id, False, False, []
        view.tokens, view._checkpoints, view._window, view._fresh = [], [], 0, None
        view.device_top_k, view._last_decode, view.on_decode = 0, None, None
        view._batch_ext = view._should_stop = view._progress = view.warmup = None
        view._make_batch()
        self._sequences.append(view)
        return view

    # -- lifetime ----------------------------------------------------------------------------------

    def _abandon(self) -> None:
        """After a lost RPC server: never free the context (llama.cpp would wait for the server)."""
        if self._ctx is not None:
            self._ctx._exit_stack = contextlib.ExitStack()

    def close(self) -> None:
        """Free the batch and the context (sequence 0: every sequence's first), then the model
        if this context owns it. Idempotent."""
        for view in self._sequences:
            view.close()
        self._sequences = []
        if self._batch_ext is not None:
            llama_cpp.llama_batch_ext_free(self._batch_ext)
            self._batch_ext = None
        for attr in ("_batch", "_ctx") if self._owns_ctx else ("_batch",):
            obj = getattr(self, attr, None)
            if obj is not None:
                devices.free(self._remote, obj.close)
                setattr(self, attr, None)
        if not self._owns_ctx:
            self._ctx = None  # (closed: this sequence is not usable any more)
            return
        for batch, _ in self._together.values():
            batch.close()
        self._together.clear()
        for chain in self._chains:  # after the context that referenced them
            llama_cpp.llama_sampler_free(chain)
        self._chains.clear()
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
    def interruptible(self, should_stop, progress=None):
        """Within the block, a decode of more than ``n_batch`` tokens (a prompt) calls
        ``should_stop()`` before each chunk after the first and, when it is true, stops there with
        DecodeCancelled (the chunks decoded so far stay in the cache, ``tokens`` says which).
        ``progress(done, n)``, when given, is called before each chunk that is decoded (after
        the stop check): ``done`` of the decode's ``n`` tokens are in the cache (0 before the
        first chunk)."""
        previous = self._should_stop, self._progress
        self._should_stop, self._progress = should_stop, progress
        try:
            yield self
        finally:
            self._should_stop, self._progress = previous

    def decode(self, tokens: Sequence[int], n_logits: int = 1, *, may_drop: int = 0
               ) -> np.ndarray:
        """Append ``tokens`` at positions ``n_past ..`` and run the model.

        Logits are requested only for the last ``n_logits`` rows (0 = none).
        ``may_drop``: how many tokens off the end of the cache the caller may roll back after this
        decode, before the next one (the rejected drafts of a verification, every token drafted so
        far for a draft model); a model with a recurrent state saves a checkpoint first when the
        snapshot window will not cover them (rollback.py). 0 for tokens that stay.
        Returns: float32 [n_logits, V], a zero-copy view on llama.cpp's output buffer, valid until
        the next decode on this context. Tokens longer than ``n_batch`` are decoded in chunks.

        Raises DecodeError when the context is full or ``llama_decode`` fails; the KV cache then
        holds a prefix of what it held before the call (``tokens`` says which). Raises
        DecodeCancelled when the :meth:`interruptible` check said stop between two chunks.
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
        # A rollback the last chunk's snapshots will not cover needs a checkpoint at or before
        # the shortest prefix kept, start + n - may_drop: saved here when that is not before
        # start (a longer rollback relies on the one an earlier decode saved there)
        window_after = min(self.n_rs_seq, min(n, self.n_batch) - 1)
        if self.recurrent and window_after < may_drop <= n:
            self.checkpoint()
        if self._last[0] is not self:  # another sequence decoded since: its snapshots are gone
            self._last[0]._window = 0
            self._last[0] = self
        bounds = [0, *range(first_chunk, n + 1, self.n_batch)]
        for c0, c1 in zip(bounds, bounds[1:]):
            if c0 > 0 and self._should_stop is not None and self._should_stop():
                raise DecodeCancelled(f"decode stopped after {c0} of {n} tokens")
            if self._progress is not None:
                self._progress(c0, n)
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
            # what the recurrent state can drop in place now: the snapshots of this batch
            self._window = min(self.n_rs_seq, m - 1) if rc == 0 else 0
            if rc != 0:
                # let forget() drop whatever the failed call may have stored
                self.tokens.extend(int(t) for t in chunk)
                self.forget(start)
                what = {1: "no KV-cache slot for the batch: the context size has been exceeded",
                        2: "aborted"}.get(rc, "error")
                raise DecodeError(f"llama_decode returned {rc}: {what}")
            self.tokens.extend(int(t) for t in chunk)
            if self.on_decode is not None:
                self.on_decode(self.n_past - m, m)
        if self.device_top_k:  # what decode_full_again decodes again
            self._last_decode = (start, list(tokens), n_logits)
        return self.logits(n_logits) if n_logits else np.empty((0, self.n_vocab), np.float32)

    def decode_states(self, tokens: Sequence[int], states: np.ndarray) -> np.ndarray:
        """An MTP context's decode (ContextOptions.mtp): append ``tokens`` (int [n], n <=
        n_batch) at positions ``n_past ..``, each paired with its state row (``states``: float32
        [n, E], E = the model's ``n_embd_out``: the verifier's hidden row at the position before
        it). Returns the last row's logits, float32 [V] (a view valid until the next decode).
        Raises DecodeError (full, or llama_process failed; nothing is appended then)."""
        n = len(tokens)
        if not 0 < n <= self.n_batch or states.shape != (n, self.model.n_embd_out):
            raise InputError(f"decode_states needs 1..{self.n_batch} tokens and a state row "
                             f"each, got {n} and {states.shape}")
        if self.n_past + n > self.n_ctx:
            raise DecodeError(f"context full: {self.n_past} + {n} tokens > n_ctx={self.n_ctx}")
        if self._batch_ext is None:
            self._batch_ext = llama_cpp.llama_batch_ext_init(self.ptr)
        b = self._batch_ext
        llama_cpp.llama_batch_ext_clear(b)
        rows = np.ascontiguousarray(states, dtype=np.float32)  # alive until llama_process returns
        row_bytes = rows.strides[0]
        pos = (ctypes.c_int32 * 4)()
        for i, t in enumerate(tokens):
            idx = llama_cpp.llama_batch_ext_add_token(b, self.seq_id, int(t))
            pos[0] = self.n_past + i
            embd = llama_cpp.llama_embd(
                ctypes.cast(rows.ctypes.data + i * row_bytes, ctypes.POINTER(ctypes.c_float)),
                1, rows.shape[1])
            if idx < 0 or not llama_cpp.llama_batch_ext_set_pos(b, idx, pos) \
                    or not llama_cpp.llama_batch_ext_set_embd_token(b, idx, embd):
                raise DecodeError(f"llama_batch_ext refused token {i} of {n} ({idx})")
        llama_cpp.llama_batch_ext_set_output_logits(b, n - 1, True)
        rc = devices.call(self._remote, llama_cpp.llama_process, self.ptr,
                          llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:  # drop whatever the failed call may have stored past what we hold
            llama_cpp.llama_memory_seq_rm(self.memory, self.seq_id, self.n_past, -1)
            raise DecodeError(f"llama_process returned {rc}")
        self.tokens.extend(int(t) for t in tokens)
        ptr = llama_cpp.llama_get_logits_ith(self.ptr, -1)
        if not ptr:
            raise DecodeError("llama_get_logits_ith returned NULL")
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def logits(self, n_rows: int) -> np.ndarray:
        """The last decode's output logits: float32 [n_rows, V], a zero-copy view."""
        # synchronises with the device's copy of the logits (over RPC: waits for the server)
        ptr = devices.call(self._remote, llama_cpp.llama_get_logits, self.ptr)
        if not ptr:
            raise DecodeError("llama_get_logits returned NULL")
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))
