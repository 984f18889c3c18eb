"""The hidden-state hand-off of next-n (MTP) drafting: what llama-cpp-python 0.3.36 does not bind.

A model with next-n layers (Qwen3.5 ``qwen35`` / ``qwen35moe``, GGUF ``{arch}.nextn_predict_layers``)
drafts for itself: an MTP context (``llama_context_params.ctx_type = LLAMA_CONTEXT_TYPE_MTP``) runs
the next-n layer on a token paired with the verifier's hidden state at the position before it. The
verifier's hidden rows (``h``: float32 [n_rows, n_embd], llama.cpp's "nextn embeddings") are read
with the three functions below. The vendored llama.cpp declares them in ``src/llama-ext.h``
without C linkage, so libllama exports them under their C++ (Itanium ABI) names, which llama-cpp-
python does not bind; they are bound here by those names from the library llama-cpp-python loaded.
Everything else MTP drafting uses is bound by llama-cpp-python: ``llama_model_params.load_mtp``,
``llama_model_n_layer_nextn``, ``llama_batch_ext_*`` (a token with a state row:
``llama_batch_ext_set_embd_token``) and ``llama_process``.

Raises NextnUnavailableError when the library lacks the symbols (another llama.cpp build).
"""
from __future__ import annotations

import ctypes

import numpy as np

import llama_cpp

from ..errors import EngineError

__all__ = ["NextnUnavailableError", "set_embeddings_nextn", "embeddings_nextn",
           "embeddings_nextn_ith"]


class NextnUnavailableError(EngineError):
    """This llama.cpp library does not export the next-n hand-off functions."""


# name -> (Itanium mangled name, result type, argument types); llama-ext.h of llama.cpp as
# vendored by llama-cpp-python 0.3.36
_SIGNATURES = {
    # void llama_set_embeddings_nextn(llama_context *, bool value, bool masked)
    "set": ("_Z26llama_set_embeddings_nextnP13llama_contextbb", None,
            [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool]),
    # float * llama_get_embeddings_nextn(llama_context *)
    "get": ("_Z26llama_get_embeddings_nextnP13llama_context", ctypes.POINTER(ctypes.c_float),
            [ctypes.c_void_p]),
    # float * llama_get_embeddings_nextn_ith(llama_context *, int32_t i)
    "get_ith": ("_Z30llama_get_embeddings_nextn_ithP13llama_contexti",
                ctypes.POINTER(ctypes.c_float), [ctypes.c_void_p, ctypes.c_int32]),
}
_bound: dict[str, object] = {}


def _fn(name: str):
    if name not in _bound:
        symbol, restype, argtypes = _SIGNATURES[name]
        try:
            f = getattr(llama_cpp.llama_cpp._lib, symbol)
        except AttributeError:
            raise NextnUnavailableError(
                f"this llama.cpp library does not export {symbol} (llama_*_embeddings_nextn): "
                "MTP drafting needs the llama.cpp that llama-cpp-python 0.3.36 vendors") from None
        f.restype, f.argtypes = restype, argtypes
        _bound[name] = f
    return _bound[name]


def set_embeddings_nextn(ctx_ptr, value: bool, masked: bool) -> None:
    """Make the context output its hidden rows for next-n drafting: for every token of each batch
    (``masked`` False: a verifier, whose rows the MTP context pairs with the next tokens), or only
    for the rows whose logits are requested (``masked`` True: the MTP context itself)."""
    _fn("set")(ctx_ptr, value, masked)


def embeddings_nextn(ctx_ptr, n_rows: int, n_embd: int) -> np.ndarray:
    """The last decode's hidden rows, in batch order: float32 [n_rows, n_embd], a zero-copy view
    valid until the next decode. Raises EngineError when llama.cpp has none."""
    ptr = _fn("get")(ctx_ptr)
    if not ptr:
        raise EngineError("llama_get_embeddings_nextn returned NULL")
    return np.ctypeslib.as_array(ptr, shape=(n_rows, n_embd))


def embeddings_nextn_ith(ctx_ptr, i: int, n_embd: int) -> np.ndarray:
    """The hidden row of the last decode's output ``i`` (negative: from the end): float32
    [n_embd], a zero-copy view. Raises EngineError when llama.cpp has none."""
    ptr = _fn("get_ith")(ctx_ptr, i)
    if not ptr:
        raise EngineError(f"llama_get_embeddings_nextn_ith({i}) returned NULL")
    return np.ctypeslib.as_array(ptr, shape=(n_embd,))
