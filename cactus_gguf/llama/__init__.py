"""The llama.cpp layer, over llama-cpp-python's low-level API.

- ``model``: a GGUF model (load options, vocabulary, tokenizer, chat template);
- ``context``: a context over a model (KV cache and the token ids it holds, batched decode,
  zero-copy logits, rollback, prefix reuse);
- ``hw``: the machine and the build (AMX guard, threads, memory, benchmark facts);
- ``log``: llama.cpp's log, captured for one-line errors.
"""
from .context import Context, ContextOptions, DecodeError, KvCacheTooLargeError
from .hw import build_has_amx, cpu_has_amx, default_threads
from .model import Model, ModelLoadError, ModelOptions, check_gguf_path

__all__ = ["Model", "ModelOptions", "ModelLoadError", "Context", "ContextOptions", "DecodeError",
           "KvCacheTooLargeError", "check_gguf_path", "cpu_has_amx", "build_has_amx",
           "default_threads"]
