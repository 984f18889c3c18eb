"""How a golden case is decoded with the current API (the only file to adapt when the API moves)."""
from __future__ import annotations

from contextlib import contextmanager

# Threads the golden cases run with, whatever the machine's cores: every entry was recorded with 2
# (the default, the usable cores, on each machine they were recorded on), so a host with more cores
# still finds its entry.
THREADS = 2

# llama.cpp's CPU features that do not pick a kernel: OPENMP is the thread runtime; REPACK says the
# build can repack weights, and whether it does is the load's choice (the key's "repack").
_NOT_KERNELS = {"OPENMP", "REPACK"}


def kernel_key(system_info: str, repack: bool, n_threads: int) -> str:
    """The golden entry a machine compares against: what picks llama.cpp's CPU kernels, and so the
    float rounding the ids depend on. ``system_info``: llama.cpp's feature line
    (``llama_print_system_info``: "CPU : SSE3 = 1 | ... | AVX2 = 1 | ... |", the instruction-set
    extensions this build compiled and this CPU has: AVX2, AVX512, AVX512_BF16, AMX_INT8, ...;
    llamafile's sgemm); ``repack``: weights repacked at load (a REPACK build, and the AMX guard's
    choice); ``n_threads``: the contexts' threads. E.g. "sse3 ssse3 avx avx2 f16c fma bmi2
    llamafile | repack | 2 threads"."""
    cpu = system_info.split("CPU :", 1)[1] if "CPU :" in system_info else ""
    features = []
    for item in cpu.split("|"):
        if " : " in item:  # the next backend's section begins
            break
        name, _, value = (part.strip() for part in item.partition("="))
        if name and name not in _NOT_KERNELS:
            features.append(name.lower() if value == "1" else f"{name.lower()}={value}")
    built_to_repack = "REPACK = 1" in cpu
    return (f"{' '.join(features)} | {'repack' if repack and built_to_repack else 'no repack'} | "
            f"{n_threads} threads")


def engine_key(engine) -> str:
    """``kernel_key`` of this machine, this llama.cpp build and ``engine``'s load."""
    from cactus_gguf.llama import ModelOptions
    from cactus_gguf.llama.hw import system_info

    return kernel_key(system_info(), ModelOptions().resolved_repack(), engine.verifier.n_threads)


@contextmanager
def load_pair(verifier, draft, n_ctx: int):
    from cactus_gguf.options import LoadOptions
    from cactus_gguf.speculative import Engine

    with Engine(verifier, draft, LoadOptions(n_ctx=n_ctx, n_threads=THREADS)) as engine:
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
