"""How a golden case is decoded with the current API (the only file to adapt when the API moves)."""
from __future__ import annotations

import hashlib
from contextlib import contextmanager


def signature(engine) -> str:
    """What the float results depend on: llama.cpp's CPU feature line and weight repacking."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    from cactus_gguf.backend import ModelOptions

    repack = ModelOptions().resolved_repack()
    return hashlib.sha256(f"{info}|repack={repack}".encode()).hexdigest()[:16]


@contextmanager
def load_pair(verifier, draft, n_ctx: int):
    from cactus_gguf.backend import ContextOptions
    from cactus_gguf.decoding import DecoderConfig, SpeculativeDecoder

    with SpeculativeDecoder(verifier, draft, DecoderConfig(k=8, context=ContextOptions(n_ctx=n_ctx))) as dec:
        yield dec


def generate_ids(engine, prompt: str, c: dict) -> list[int]:
    import dataclasses

    from cactus_gguf.sampling import AcceptanceParams, SamplingParams

    acc = None if c["method"] == "none" else AcceptanceParams(
        method=c["method"], delta=c["delta"], solver=c["solver"])
    engine.config = dataclasses.replace(
        engine.config, k=c["k"], acceptance=acc, drafter=c["drafter"], draft_min=c["draft_min"],
        draft_p_min=c["draft_p_min"],
        sampling=SamplingParams(temperature=c["temperature"], top_k=c["top_k"], top_p=c["top_p"],
                                min_p=c["min_p"]))
    return engine.generate(prompt, n_predict=c["n_predict"], seed=c["seed"]).tokens
