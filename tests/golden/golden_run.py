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
    keys = ("method", "delta", "solver", "top_gap", "protect_ends", "drafter", "k", "draft_min",
            "draft_p_min", "temperature", "top_k", "top_p", "min_p", "n_predict", "seed")
    return engine.generate(prompt, cache_prompt=False, **{key: c[key] for key in keys}).tokens


def native_steps(acc: dict, seed: int = 5) -> list[list[int]]:
    """[n_accepted, next_token] of each of NATIVE_STEPS native verification steps (rule ``acc``;
    draft and verifier logits float32 [k+1, V] from the helper's generator, seed ``seed``)."""
    import numpy as np

    from cactus_gguf.sampling import AcceptanceParams, NativeSampler, Rng, SamplingParams
    from cactus_gguf.sampling.native import pack_allowed
    from cases import NATIVE_END, NATIVE_K, NATIVE_SAMPLING, NATIVE_STEPS, NATIVE_V

    end = np.zeros(NATIVE_V, bool)
    end[list(NATIVE_END)] = True
    ap = AcceptanceParams(**acc, end_mask=pack_allowed(end))
    sp = SamplingParams(**NATIVE_SAMPLING)
    drafter, verifier = NativeSampler(NATIVE_V, sp, ap, seed), NativeSampler(NATIVE_V, sp, ap, seed + 1)
    rng = Rng(seed)
    k, V = NATIVE_K, NATIVE_V
    out = []
    for _ in range(NATIVE_STEPS):
        base = (6.0 * rng.uniforms((k + 1) * V) - 3.0).reshape(k + 1, V)
        vl = base.astype(np.float32)
        dl = (base[:k] + 4.0 * rng.uniforms(k * V).reshape(k, V) - 2.0).astype(np.float32)
        probs = np.zeros((k, V), np.float32)
        toks = np.array([drafter.draft(dl[i], probs[i]) for i in range(k)], np.int32)
        r = verifier.verify(probs, toks, vl)
        out.append([int(r.n_accepted), int(r.next_token)])
    return out
