"""How a golden case is decoded with the current API (the only file to adapt when the API moves)."""
from __future__ import annotations

import hashlib
from contextlib import contextmanager


def signature(engine) -> str:
    """What the float results depend on: llama.cpp's CPU feature line and weight repacking."""
    from cactus_gguf.llama import ModelOptions
    from cactus_gguf.llama.hw import system_info

    return hashlib.sha256(f"{system_info()}|repack={ModelOptions().resolved_repack()}".encode()
                          ).hexdigest()[:16]


@contextmanager
def load_pair(verifier, draft, n_ctx: int):
    from cactus_gguf.options import LoadOptions
    from cactus_gguf.speculative import Engine

    with Engine(verifier, draft, LoadOptions(n_ctx=n_ctx)) as engine:
        yield engine


def generate_ids(engine, prompt: str, c: dict) -> list[int]:
    """The case's ids from a cold start (cache_prompt off: nothing reused from the last case)."""
    keys = ("method", "delta", "solver", "drafter", "k", "draft_min", "draft_p_min", "temperature",
            "top_k", "top_p", "min_p", "n_predict", "seed")
    return engine.generate(prompt, cache_prompt=False, **{key: c[key] for key in keys}).tokens
