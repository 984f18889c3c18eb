"""llama.cpp backend: one GGUF model and its context, over llama-cpp-python's low-level API.

This layer owns the llama.cpp lifetimes (the context is freed before its model), decodes batches
with logits requested only for the rows the caller names, exposes those logits as a zero-copy
NumPy view, rolls the KV cache back, and converts between text and token ids.

Dimension letters: V = vocabulary size (rows of the output layer), n = rows in one batch.

Model and context lifetimes come from ``llama_cpp._internals`` (``LlamaModel`` / ``LlamaContext``),
the owning wrappers llama-cpp-python builds its ``Llama`` class on; everything on the per-token path
(batch filling, logits, KV-cache edits) calls the C functions directly.
"""
from __future__ import annotations

import _thread
import collections
import ctypes
import logging
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

import llama_cpp
from llama_cpp import _internals

log = logging.getLogger(__name__)

__all__ = [
    "BackendError",
    "ModelLoadError",
    "DecodeError",
    "ModelOptions",
    "ContextOptions",
    "LlamaModelContext",
    "cpu_has_amx",
]


class BackendError(RuntimeError):
    """A llama.cpp call failed."""


class ModelLoadError(BackendError):
    """A GGUF file could not be loaded (missing, not GGUF, truncated, unsupported architecture)."""


class DecodeError(BackendError):
    """``llama_decode`` returned a non-zero status, or a KV-cache edit failed."""


# --------------------------------------------------------------------------------------------------
# llama.cpp log capture: keep its chatter off the terminal, keep its last errors for our messages.
# --------------------------------------------------------------------------------------------------

# ggml.h enum ggml_log_level: NONE=0, DEBUG=1, INFO=2, WARN=3, ERROR=4, CONT=5 (continues a line).
_LOG_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING,
               4: logging.ERROR}
_recent_errors: collections.deque[str] = collections.deque(maxlen=8)
_llama_log = logging.getLogger("cactus_gguf.llama_cpp")
_llama_log.addHandler(logging.NullHandler())  # silent unless the application configures logging


def _log_message(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    message = text.decode("utf-8", errors="replace").rstrip()
    if not message:
        return
    py_level = _LOG_LEVELS.get(level, logging.DEBUG)
    if py_level >= logging.ERROR:
        _recent_errors.append(message)
    _llama_log.log(py_level, "%s", message)


_log_callback = llama_cpp.llama_log_callback(_log_message)


def _sigint_handler(signum: int, frame) -> None:
    """Python's default SIGINT behaviour (raise KeyboardInterrupt), except inside the llama.cpp log
    callback: an exception raised there cannot cross llama.cpp's C frames (ctypes prints "Exception
    ignored" and drops it, so the Ctrl-C would be lost and the model load or generation would go
    on). There the interrupt is posted again 10 ms later, from a timer thread (posting it from here
    would re-enter this handler at once); it fires once control is back in Python code."""
    f = frame
    while f is not None:
        if f.f_code is _log_message.__code__:
            again = threading.Timer(0.01, _thread.interrupt_main)
            again.daemon = True
            again.start()
            return
        f = f.f_back
    raise KeyboardInterrupt


_backend_ready = False


def _init_backend() -> None:
    global _backend_ready
    if not _backend_ready:
        # only where nobody chose another SIGINT handler (signal.signal works in the main thread)
        if (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler):
            signal.signal(signal.SIGINT, _sigint_handler)
        llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _backend_ready = True


def _last_llama_error() -> str:
    """The most specific error llama.cpp logged since the last clear (its first one, unprefixed)."""
    for message in _recent_errors:
        if "error loading model:" in message:
            reason = message.split("error loading model:", 1)[1].strip().splitlines()[0]
            # the loader's generic line; gguf's own line says what was wrong (header, key-value
            # pairs, tensor infos: a truncated or corrupt file)
            gguf_reason = next((m for m in _recent_errors if m.startswith("gguf_")), None)
            if "failed to load model from" in reason and gguf_reason:
                reason = (f"{gguf_reason.split(': ', 1)[-1].splitlines()[0]} "
                          "(truncated or corrupt GGUF file)")
            return reason
    if _recent_errors:
        return _recent_errors[0].splitlines()[0]
    return "llama.cpp gave no reason (run with --verbose to see its log)"


# --------------------------------------------------------------------------------------------------
# AMX guard (llama.cpp issue #20824): weight repacking into AMX buffers segfaults on Q4_K models.
# --------------------------------------------------------------------------------------------------

def cpu_has_amx() -> bool:
    """True when this CPU reports AMX_INT8 (Linux ``/proc/cpuinfo`` flag ``amx_int8``)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "amx_int8" in line.split()
    except OSError:
        pass
    return False


def build_has_amx() -> bool:
    """True when the loaded llama.cpp build was compiled with AMX kernels (``AMX_INT8 = 1``)."""
    info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")
    return "AMX_INT8 = 1" in info


def default_threads() -> int:
    """Threads used when none are given: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS / Windows
        return max(1, os.cpu_count() or 1)


def _physical_memory() -> int | None:
    """Bytes of physical memory, or None when the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _kv_cache_bytes(model: llama_cpp.llama_model_p, n_ctx: int) -> int:
    """Estimated size of an f16 KV cache: n_ctx x layers x (K + V) x head size x KV heads x 2 bytes."""
    head = llama_cpp.llama_model_n_embd(model) // max(1, llama_cpp.llama_model_n_head(model))
    return (n_ctx * llama_cpp.llama_model_n_layer(model) * 2 * head
            * llama_cpp.llama_model_n_head_kv(model) * 2)


# --------------------------------------------------------------------------------------------------
# Options
# --------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelOptions:
    """How to load a GGUF file.

    n_gpu_layers: layers to offload to the GPU (llama.cpp ``-ngl``); -1 = all, 0 = CPU only.
        Ignored by CPU-only builds of llama.cpp.
    use_mmap: memory-map the file instead of reading it into memory.
    repack: allow llama.cpp's extra buffer types (weight repacking for faster CPU kernels).
        None = automatic: on, except when both the CPU and the llama.cpp build have AMX, where
        repacking Q4_K weights into AMX buffers segfaults (llama.cpp issue #20824).
    """

    n_gpu_layers: int = -1
    use_mmap: bool = True
    repack: bool | None = None

    def __post_init__(self) -> None:
        if self.n_gpu_layers < -1:
            raise ValueError(f"n_gpu_layers must be -1 (all) or >= 0, got {self.n_gpu_layers}")

    def resolved_repack(self) -> bool:
        if self.repack is not None:
            return self.repack
        return not (cpu_has_amx() and build_has_amx())


@dataclass(frozen=True)
class ContextOptions:
    """A llama.cpp context.

    n_ctx: KV-cache size in tokens (llama.cpp ``-c``); 0 = the model's training context.
    n_batch: most tokens submitted to one ``llama_decode`` (prompt processing is chunked by it).
    n_threads: CPU threads for generation and batch processing (``-t``); None = all usable cores.
    flash_attn: "auto", "on" or "off" (llama.cpp ``-fa``).
    """

    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None
    flash_attn: str = "auto"

    def __post_init__(self) -> None:
        if self.n_ctx != 0 and self.n_ctx < 16:
            raise ValueError(f"n_ctx must be 0 (model default) or >= 16 tokens, got {self.n_ctx}")
        if self.n_batch < 1:
            raise ValueError(f"n_batch must be >= 1, got {self.n_batch}")
        if self.n_threads is not None and not 1 <= self.n_threads <= 512:
            # 512 = GGML_MAX_N_THREADS, ggml's own limit
            raise ValueError(f"n_threads must be in [1, 512], got {self.n_threads}")
        if self.flash_attn not in ("auto", "on", "off"):
            raise ValueError(f"flash_attn must be auto, on or off, got {self.flash_attn!r}")


_FLASH_ATTN = {"auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
               "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
               "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED}


def check_gguf_path(path: str | os.PathLike[str]) -> Path:
    """Check that ``path`` names a readable GGUF file before llama.cpp sees it.

    Raises ModelLoadError (one line) for a missing path, a directory or a file without the GGUF magic.
    """
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelLoadError(f"{p} is a directory: give the path of a .gguf file")
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read {p}: {e.strerror}") from None
    if magic != b"GGUF":
        raise ModelLoadError(f"{p} is not a GGUF file (no GGUF magic): convert it with llama.cpp's "
                             "convert_hf_to_gguf.py or download a .gguf")
    return p


# --------------------------------------------------------------------------------------------------
# One model + one context
# --------------------------------------------------------------------------------------------------

class LlamaModelContext:
    """A loaded GGUF model with one single-sequence llama.cpp context.

    Tracks ``n_past``, the number of tokens whose keys/values are in the KV cache (positions
    ``0 .. n_past-1`` of sequence 0). Use as a context manager, or call :meth:`close`.

    Raises ModelLoadError when the file cannot be loaded or the context cannot be created.
    """

    def __init__(self, path: str | os.PathLike[str], model_options: ModelOptions = ModelOptions(),
                 context_options: ContextOptions = ContextOptions()) -> None:
        _init_backend()
        self.path = check_gguf_path(path)
        self._model: _internals.LlamaModel | None = None
        self._ctx: _internals.LlamaContext | None = None
        self._batch: _internals.LlamaBatch | None = None

        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = model_options.n_gpu_layers if model_options.n_gpu_layers >= 0 else 999
        mparams.load_mode = (llama_cpp.LLAMA_LOAD_MODE_MMAP if model_options.use_mmap
                             else llama_cpp.LLAMA_LOAD_MODE_NONE)
        mparams.use_extra_bufts = model_options.resolved_repack()
        _recent_errors.clear()
        try:
            self._model = _internals.LlamaModel(path_model=str(self.path), params=mparams,
                                                verbose=True)
        except ValueError:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {_last_llama_error()}") from None

        # A KV cache larger than the machine's memory is not an error in llama.cpp: it allocates
        # (or spends minutes trying) until the OOM killer ends the process. Refuse it up front.
        n_ctx_eff = context_options.n_ctx or llama_cpp.llama_model_n_ctx_train(self._model.model)
        kv_bytes, ram = _kv_cache_bytes(self._model.model, n_ctx_eff), _physical_memory()
        if ram and kv_bytes > ram:
            self.close()
            raise ModelLoadError(
                f"n_ctx={n_ctx_eff} needs about {kv_bytes / 2**30:.1f} GiB of KV cache for "
                f"{self.path.name}, more than this machine's {ram / 2**30:.1f} GiB of memory: "
                "lower -c/--ctx-size")

        cparams = llama_cpp.llama_context_default_params()
        n_threads = context_options.n_threads or default_threads()
        cparams.n_ctx = context_options.n_ctx
        cparams.n_batch = context_options.n_batch
        cparams.n_ubatch = context_options.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.flash_attn_type = _FLASH_ATTN[context_options.flash_attn]
        cparams.no_perf = True
        try:
            self._ctx = _internals.LlamaContext(model=self._model, params=cparams, verbose=True)
        except ValueError:
            self.close()
            raise ModelLoadError(f"llama.cpp could not create a context for {self.path} "
                                 f"(n_ctx={context_options.n_ctx}): {_last_llama_error()}") from None

        self.model_ptr = self._model.model
        self.vocab = self._model.vocab
        self.ctx_ptr = self._ctx.ctx
        self.memory = self._ctx.memory
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_ctx: int = llama_cpp.llama_n_ctx(self.ctx_ptr)
        self.n_batch: int = llama_cpp.llama_n_batch(self.ctx_ptr)
        self.n_threads = n_threads
        self.n_past = 0

        # One reusable batch of n_batch rows; seq_id / n_seq_id never change (one sequence).
        self._batch = _internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1)
        b = self._batch.batch
        self._b_token = np.ctypeslib.as_array(b.token, shape=(self.n_batch,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(self.n_batch,))
        self._b_logits = np.ctypeslib.as_array(b.logits, shape=(self.n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
        self._n_outputs = 0
        self._piece_buf = ctypes.create_string_buffer(256)

    # -- lifetime ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Free the batch, the context, then the model. Idempotent."""
        for attr in ("_batch", "_ctx", "_model"):
            obj = getattr(self, attr, None)
            if obj is not None:
                obj.close()
                setattr(self, attr, None)

    def __enter__(self) -> "LlamaModelContext":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- model facts -------------------------------------------------------------------------------

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as a string, or None when the key is absent."""
        buf = ctypes.create_string_buffer(1 << 16)
        n = llama_cpp.llama_model_meta_val_str(self.model_ptr, key.encode(), buf, len(buf))
        if n < 0:
            return None
        if n >= len(buf):
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self.model_ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        """The GGUF's default Jinja chat template (``tokenizer.chat_template``), or None."""
        ptr = llama_cpp.llama_model_chat_template(self.model_ptr, None)
        return ptr.decode("utf-8") if ptr else None

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self.model_ptr, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    @property
    def bos(self) -> int:
        return llama_cpp.llama_vocab_bos(self.vocab)

    @property
    def eos(self) -> int:
        return llama_cpp.llama_vocab_eos(self.vocab)

    @property
    def eot(self) -> int:
        return llama_cpp.llama_vocab_eot(self.vocab)

    @property
    def add_bos(self) -> bool:
        return bool(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    @property
    def vocab_type(self) -> int:
        return llama_cpp.llama_vocab_type(self.vocab)

    def is_eog(self, token: int) -> bool:
        """True for end-of-generation tokens (EOS, EOT, and the model's other EOG ids)."""
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def token_text(self, token: int) -> bytes:
        """The vocabulary entry of ``token`` as stored in the GGUF (not detokenized)."""
        return llama_cpp.llama_vocab_get_text(self.vocab, token) or b""

    def token_attr(self, token: int) -> int:
        return llama_cpp.llama_vocab_get_attr(self.vocab, token)

    # -- text <-> tokens ---------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids for ``text``; ``add_special`` adds BOS where the model wants it."""
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            n_max = -n
            buf = (llama_cpp.llama_token * n_max)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special,
                                         parse_special)
            if n < 0:
                raise BackendError(f"llama_tokenize failed ({n}) for a {len(data)}-byte text")
        return list(buf[:n])

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes ``token`` contributes to the text (may be part of a UTF-8 character)."""
        buf = self._piece_buf
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:  # piece longer than the buffer: -n bytes are needed
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_to_piece(t, special=special) for t in tokens).decode(
            "utf-8", errors="replace")

    # -- decoding ----------------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int], n_logits: int = 1) -> np.ndarray:
        """Append ``tokens`` at positions ``n_past ..`` and run the model.

        Logits are requested only for the last ``n_logits`` rows (0 = none).
        Returns: float32 [n_logits, V], a zero-copy view on llama.cpp's output buffer, valid until
        the next decode on this context. Tokens longer than ``n_batch`` are decoded in chunks.

        Raises DecodeError when the context is full or ``llama_decode`` fails; the KV cache is
        then rolled back to its state before the call.
        """
        n = len(tokens)
        if n == 0:
            raise ValueError("decode needs at least one token")
        if not 0 <= n_logits <= min(n, self.n_batch):
            raise ValueError(f"n_logits must be in [0, {min(n, self.n_batch)}], got {n_logits}")
        if self.n_past + n > self.n_ctx:
            raise DecodeError(f"context full: {self.n_past} + {n} tokens > n_ctx={self.n_ctx}")
        start = self.n_past
        # Chunks of n_batch with the short one first: the last chunk holds the last
        # min(n, n_batch) >= n_logits rows, so every requested row is in the last decode's output
        # (llama_get_logits only holds the last call's rows).
        first_chunk = n - (n - 1) // self.n_batch * self.n_batch  # in [1, n_batch]
        bounds = [0, *range(first_chunk, n + 1, self.n_batch)]
        for c0, c1 in zip(bounds, bounds[1:]):
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
            rc = llama_cpp.llama_decode(self.ctx_ptr, self._batch.batch)
            if rc != 0:
                self.n_past += m  # let truncate() drop whatever the failed call may have stored
                self.truncate(start)
                what = {1: "no KV-cache slot for the batch (context full)",
                        2: "aborted"}.get(rc, "error")
                raise DecodeError(f"llama_decode returned {rc}: {what}")
            self.n_past += m
            self._n_outputs = m - first_out if first_out < m else 0
        return self.logits(n_logits) if n_logits else np.empty((0, self.n_vocab), np.float32)

    def logits(self, n_rows: int) -> np.ndarray:
        """The last decode's output logits: float32 [n_rows, V], a zero-copy view."""
        ptr = llama_cpp.llama_get_logits(self.ctx_ptr)
        if not ptr:
            raise DecodeError("llama_get_logits returned NULL")
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab))

    def truncate(self, n_keep: int) -> None:
        """Roll the KV cache back so that it holds exactly positions ``0 .. n_keep-1``.

        Raises DecodeError when llama.cpp cannot remove the tail (``llama_memory_seq_rm`` false).
        """
        if not 0 <= n_keep <= self.n_past:
            raise ValueError(f"n_keep must be in [0, {self.n_past}], got {n_keep}")
        if n_keep == self.n_past:
            return
        if not llama_cpp.llama_memory_seq_rm(self.memory, 0, n_keep, -1):
            raise DecodeError(f"llama_memory_seq_rm could not remove positions >= {n_keep}")
        self.n_past = n_keep

    def clear(self) -> None:
        """Empty the KV cache."""
        llama_cpp.llama_memory_clear(self.memory, True)
        self.n_past = 0

    def kv_pos_max(self) -> int:
        """Largest position stored in the KV cache for sequence 0 (-1 when empty)."""
        return llama_cpp.llama_memory_seq_pos_max(self.memory, 0)
