"""cactus-gguf: Cactus speculative decoding (Hao & Mou, ICLR 2026, arXiv:2604.04987) over llama.cpp.

    from cactus_gguf import Engine, LoadOptions
    with Engine("verifier.gguf", "draft.gguf", LoadOptions(n_ctx=4096)) as engine:
        print(engine.generate("def add(a, b):", n_predict=64, seed=1).text)

The public names are imported on first use (PEP 562), so that ``import cactus_gguf.cli`` stays
light: the CLI starts fast and a Ctrl-C during start-up is handled by the CLI, not by an import.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "Engine": "speculative", "Stream": "speculative", "VocabMismatchError": "speculative",
    "Request": "options", "LoadOptions": "options", "ContextOptions": "llama",
    "GenerationResult": "stats", "GenerationStats": "stats",
    "CactusError": "errors", "InputError": "errors", "CapacityError": "errors",
    "ContextLengthError": "errors", "EngineBusyError": "errors", "EngineError": "errors",
    "AcceptanceParams": "sampling", "SamplingParams": "sampling",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
