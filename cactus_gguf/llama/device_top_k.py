"""llama.cpp's backend top-K on a context (``--backend-sampling``): a sampler chain attached to
the context's sequence keeps each output row's K largest logits inside the decode graph, and the
host reads only those (speculative/device.py decides when that is exact). Also the decode errors
every context raises (re-exported by context.py)."""
from __future__ import annotations

import ctypes
import functools

import numpy as np

import llama_cpp

from ..errors import EngineError

__all__ = ["DecodeError", "DecodeCancelled", "DeviceTopK", "vulkan_build"]


class DecodeError(EngineError):
    """``llama_decode`` returned a non-zero status, or a KV-cache edit failed."""


class DecodeCancelled(DecodeError):
    """A decode of several ``n_batch`` chunks was stopped between two of them (see
    :meth:`Context.interruptible`); the KV cache holds the chunks decoded before."""


@functools.cache
def vulkan_build() -> bool:
    """Whether this llama.cpp has a Vulkan device. Its backend sampler aborts the process there:
    the first decode with a top-k chain attached fails ggml-vulkan's buffer-offset assertion
    (``GGML_ASSERT(allow_misalign || misalign_bytes == 0)``, llama-cpp-python 0.3.36 on Mesa's
    lavapipe, every top-k tried from 4 to 64), so a Vulkan build keeps the full rows."""
    from .devices import list_devices

    return any(name.startswith("Vulkan") for name, _ in list_devices())


@functools.cache
def _accessors() -> tuple[int, int, int, int]:
    """The addresses of llama.cpp's backend-sampling row accessors in the loaded library."""
    return tuple(ctypes.cast(f, ctypes.c_void_p).value for f in (
        llama_cpp.llama_get_sampled_candidates_ith,
        llama_cpp.llama_get_sampled_candidates_count_ith,
        llama_cpp.llama_get_sampled_logits_ith,
        llama_cpp.llama_get_sampled_logits_count_ith))


class DeviceTopK:
    """The backend top-K part of :class:`~cactus_gguf.llama.context.Context`, which it is mixed
    into: it reads the context's ``ptr``, ``recurrent``, ``_remote``, ``on_decode``, ``_chains``
    (the chains attached, freed at close), ``_last_decode`` (start, tokens, n_logits of the last
    decode), ``device_top_k``, ``n_past``, ``tokens``, ``forget`` and ``decode``."""

    @property
    def can_sample_on_device(self) -> bool:
        """Whether :meth:`set_device_top_k` may attach a sampler: the build has llama.cpp's backend
        sampling API and no Vulkan backend (see :func:`vulkan_build`), and the model keeps no
        recurrent state (the fallback of :meth:`decode_full_again` rolls a whole batch back), is
        not split over RPC, and holds one sequence (one sampler per context here)."""
        return (hasattr(llama_cpp, "llama_set_sampler") and not self.recurrent
                and self.n_seq == 1
                and not self._remote and self.on_decode is None and not vulkan_build())

    def set_device_top_k(self, k: int) -> bool:
        """Attach llama.cpp's backend sampler chain ``top_k(k)`` to this sequence (k > 0), or detach
        it (k = 0): with one attached, every decode's output rows hold only their k largest logits
        and their ids, on the device, inside the decode graph (:meth:`candidates`), and no full
        logits rows are copied out (what :meth:`decode` returns is then stale). A fresh chain per
        attach (llama.cpp initialises a chain once). Returns whether the context now does as asked
        (False: llama.cpp refused; nothing attached). A change re-reserves llama.cpp's graph."""
        if k == self.device_top_k:
            return True
        if k > 0 and not self.can_sample_on_device:
            return False
        chain = None
        if k > 0:
            chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(k))
            self._chains.append(chain)
        ok = bool(llama_cpp.llama_set_sampler(self.ptr, self.seq_id, chain))
        self.device_top_k = k if ok else 0
        self._last_decode = None
        if not ok and k > 0:
            llama_cpp.llama_set_sampler(self.ptr, self.seq_id, None)
        return ok

    @property
    def row_reader(self) -> tuple[int, int, int, int, int]:
        """The context's address and those of llama.cpp's four backend-sampling accessors
        (candidates, candidates count, logits, logits count of an output row): what the native
        helper reads a step's rows with in one call (``sampling.native.read_rows``)."""
        return (self.ptr, *_accessors())

    def candidates(self, n_rows: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The last decode's ``n_rows`` output rows under the attached top-K
        (:meth:`set_device_top_k`): per row (ids int32 [K], logits float32 [K]), copies, in
        llama.cpp's order (not sorted); the logits are the row's own float32 values."""
        out = []
        for i in range(-n_rows, 0):
            n = llama_cpp.llama_get_sampled_candidates_count_ith(self.ptr, i)
            m = llama_cpp.llama_get_sampled_logits_count_ith(self.ptr, i)
            ids_p = llama_cpp.llama_get_sampled_candidates_ith(self.ptr, i)
            lg_p = llama_cpp.llama_get_sampled_logits_ith(self.ptr, i)
            if n != m or n < 1 or not ids_p or not lg_p:
                raise DecodeError(f"llama.cpp returned no backend top-K row {i} "
                                  f"({n} candidates, {m} logits)")
            out.append((np.ctypeslib.as_array(ids_p, shape=(n,)).astype(np.int32),
                        np.ctypeslib.as_array(lg_p, shape=(n,)).copy()))
        return out

    def decode_full_again(self) -> np.ndarray:
        """The last decode again, with the backend sampler detached: roll its tokens back, decode
        them again, and return its full logits rows (float32 [n_logits, V], as :meth:`decode`).
        The sampler stays detached (attach it again with :meth:`set_device_top_k`). For a row
        whose top K llama.cpp cannot tell exactly (a tie at the K-th logit). Raises DecodeError."""
        if self._last_decode is None:
            raise DecodeError("no decode to repeat without the backend sampler")
        start, tokens, n_logits = self._last_decode
        if self.n_past != start + len(tokens) or self.tokens[start:] != tokens:
            raise DecodeError("the cache moved since the decode to repeat")
        self.set_device_top_k(0)
        self.forget(start)
        return self.decode(tokens, n_logits=n_logits)
