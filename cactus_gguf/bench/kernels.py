"""Native-kernel micro-benchmark: one verification step of the C helper against the NumPy
reference (cactus_gguf.sampling.reference), on synthetic logits."""
from __future__ import annotations

import statistics
import sys
import time
from typing import Iterable

import numpy as np

from ..llama.hw import machine_facts
from ..sampling import AcceptanceParams, NativeSampler, SamplingParams
from ..prompting.text import columns
from .report import fmt

__all__ = ["kernel_benchmark", "format_kernel_table"]


def kernel_benchmark(ks: Iterable[int] = (4, 8, 16), vocab_sizes: Iterable[int] = (32_000, 151_936),
                     *, repeats: int = 30, numpy_repeats: int = 5, logit_scale: float = 3.0,
                     draft_noise: float = 0.0, method: str = "cactus", delta: float = 1.0,
                     seed: int = 0,
                     progress: bool = False) -> dict:
    """Time one verification step (``NativeSampler.verify``) per (V, warps, k), median of repeats.

    Inputs: verifier logits float32 [k+1, V] ~ logit_scale * N(0, 1); draft logits = the first k
    rows plus draft_noise * logit_scale * N(0, 1), warped by the same sampler into p float32
    [k, V]; drafted tokens sampled from p. The default draft_noise 0 makes p = q, so every
    draft is accepted and each step warps all k + 1 verifier rows: the most work a step can do.
    Warps: temperature 0.6, top-p 0.95, min-p 0, with
    top-k 20 and with top-k off. One sampler serves every repeat (after one untimed call, as in
    a decoder past its first step); before each of the first ``numpy_repeats`` calls the NumPy
    reference gets the uniforms the C will draw, so both make the same decisions: ``agree`` says
    whether they returned the same AL and token every time. ``ratio`` = median NumPy time / median
    C time. ``rows`` is the mean number of verifier rows warped (evaluated positions, plus the
    bonus row when all k pass). With top-k, ``compact_ms`` times the same step on the rows' top
    K + 1 as ``--backend-sampling`` runs it (``verify_compact``: the union and gather in C, then
    the step on |U| ids; reading the rows from llama.cpp, one more C call, is in the run stats'
    ``host_ms_per_step``), ``compact_agree`` whether it gave the full step's result every time.
    """
    from tqdm import tqdm

    acc = AcceptanceParams(method=method, delta=delta)
    warps = {"top-k 20": SamplingParams(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0),
             "no top-k": SamplingParams(temperature=0.6, top_k=0, top_p=0.95, min_p=0.0)}
    cells = [(V, wname, k) for V in vocab_sizes for wname in warps for k in ks]
    rows = []
    for V, wname, k in tqdm(cells, desc="kernels", unit="cell", file=sys.stderr, disable=not progress):
        sp = warps[wname]
        vl, probs, tokens = _synthetic_step(V, k, sp, acc, seed, logit_scale, draft_noise)
        s = NativeSampler(V, sp, acc, seed)
        s.verify(probs, tokens, vl)  # untimed: first touch of the workspace, as a decoder's 2nd step
        row = {"V": V, "warps": wname, "k": k,
               **_time_cell(s, sp, vl, probs, tokens, method=method, delta=delta,
                            repeats=repeats, numpy_repeats=numpy_repeats)}
        if sp.top_k > 0:
            row.update(_time_compact(V, sp, acc, seed, vl, probs, tokens, repeats))
        rows.append(row)
    return {"schema": "cactus-gguf-kernels/1", "method": method, "delta": delta,
            "temperature": 0.6, "top_p": 0.95, "logit_scale": logit_scale,
            "draft_noise": draft_noise, "repeats": repeats, "numpy_repeats": numpy_repeats,
            "reference": "cactus_gguf.sampling.reference",
            "machine": machine_facts(), "results": rows}


def _synthetic_step(V: int, k: int, sp: SamplingParams, acc: AcceptanceParams, seed: int,
                    logit_scale: float, draft_noise: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One cell's inputs (see :func:`kernel_benchmark`): verifier logits float32 [k+1, V], the
    draft's probabilities float32 [k, V] (its logits warped by ``sp``), and the drafted tokens
    int32 [k] sampled from them."""
    rng = np.random.default_rng(seed + 7919 * k + V)
    vl = (logit_scale * rng.standard_normal((k + 1, V))).astype(np.float32)
    dl = (vl[:k] + draft_noise * logit_scale * rng.standard_normal((k, V))).astype(np.float32)
    prep = NativeSampler(V, sp, acc, seed)
    probs = np.zeros((k, V), dtype=np.float32)
    tokens = np.zeros(k, dtype=np.int32)
    for i in range(k):
        tokens[i] = prep.draft(np.ascontiguousarray(dl[i]), probs[i])
    return vl, probs, tokens


def _time_cell(s: NativeSampler, sp: SamplingParams, vl: np.ndarray, probs: np.ndarray,
               tokens: np.ndarray, *, method: str, delta: float, repeats: int,
               numpy_repeats: int) -> dict:
    """``repeats`` timed ``s.verify`` calls on one cell's inputs, the NumPy reference beside the
    first ``numpy_repeats`` (fed the uniforms the C will draw): the medians in ms per step (C per
    warped row too), the mean rows warped, the NumPy / C ratio and whether both agreed."""
    from ..sampling import reference as ref

    k = len(tokens)
    c_ms, np_ms, n_rows, agree = [], [], [], True
    for r in range(repeats):
        uniforms = s.peek_uniforms(2 * k + 2) if r < numpy_repeats else None
        t0 = time.perf_counter()
        res = s.verify(probs, tokens, vl)
        c_ms.append((time.perf_counter() - t0) * 1e3)
        n_rows.append(res.n_evaluated + (1 if res.n_accepted == k else 0))
        if uniforms is not None:
            t0 = time.perf_counter()
            want = ref.verify(probs, tokens, vl, dict(temperature=sp.temperature, top_k=sp.top_k,
                                                      top_p=sp.top_p, min_p=sp.min_p),
                              method, delta=delta, uniforms=iter(uniforms))
            np_ms.append((time.perf_counter() - t0) * 1e3)
            agree &= (want.n_accepted, want.next_token) == (res.n_accepted, res.next_token)
    c_med = float(statistics.median(c_ms))
    np_med = float(statistics.median(np_ms)) if np_ms else None
    return {"c_ms": c_med,
            "c_ms_per_row": float(statistics.median([t / max(1, n) for t, n in zip(c_ms, n_rows)])),
            "rows": float(np.mean(n_rows)), "numpy_ms": np_med,
            "ratio": np_med / c_med if np_med is not None else None,
            "agree": agree if np_ms else None}


def _compact_rows(rows: np.ndarray, width: int, *, probs: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``width`` largest entries (ties to the lower id) as (ids int32 [n, width]
    ascending, their values [n, width]): what the device's top-K hands the host. ``probs``:
    probability rows, whose zero entries become padding (id -1)."""
    order = np.lexsort((np.broadcast_to(np.arange(rows.shape[1]), rows.shape), -rows), axis=1)
    ids = np.sort(order[:, :width], axis=1).astype(np.int32)
    vals = np.take_along_axis(rows, ids, 1)
    if probs:
        ids = np.where(vals > 0, ids, -1).astype(np.int32)
    return np.ascontiguousarray(ids), np.ascontiguousarray(vals)


def _time_compact(V: int, sp: SamplingParams, acc: AcceptanceParams, seed: int, vl: np.ndarray,
                  probs: np.ndarray, tokens: np.ndarray, repeats: int) -> dict:
    """The same step on compact rows (``NativeSampler.verify_compact``: the verifier rows' top
    K + 1 and the draft's p over its own ids, their union built and gathered in C), as
    ``--backend-sampling`` runs it after llama.cpp's top-K: the median ms per step, and whether
    it returned the full step's result every time (two samplers of one seed, call for call)."""
    v_ids, v_logits = _compact_rows(vl, sp.top_k + 1)
    d_ids, d_probs = _compact_rows(probs, sp.top_k + 1, probs=True)
    full, compact = NativeSampler(V, sp, acc, seed), NativeSampler(V, sp, acc, seed)
    ms, agree = [], True
    for _ in range(repeats):
        want = full.verify(probs, tokens, vl)
        t0 = time.perf_counter()
        got = compact.verify_compact(v_ids, v_logits, d_ids, d_probs, tokens)
        ms.append((time.perf_counter() - t0) * 1e3)
        agree &= got == want
    return {"compact_ms": float(statistics.median(ms)), "compact_agree": agree}


def format_kernel_table(result: dict) -> list[str]:
    """The kernel benchmark as aligned text lines."""
    def yes(v):
        return "-" if v is None else ("yes" if v else "NO")

    head = ["V", "warps", "k", "rows", "C ms/step", "C ms/row", "NumPy ms/step", "NumPy / C",
            "agree", "compact ms/step", "same"]
    rows = [head] + [[str(r["V"]), r["warps"], str(r["k"]), f"{r['rows']:.1f}", f"{r['c_ms']:.3f}",
                      f"{r['c_ms_per_row']:.3f}", fmt(r["numpy_ms"], ".1f"), fmt(r["ratio"], ".0f"),
                      yes(r["agree"]), fmt(r.get("compact_ms"), ".3f"), yes(r.get("compact_agree"))]
                     for r in result["results"]]
    return columns(rows, right=True)
