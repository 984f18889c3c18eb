"""What a forward pass costs on this machine: the probe, and its cache for ``-k auto``.

``measure_forward_costs`` times single ``llama_decode`` calls (the benchmark reports them too);
``forward_costs`` gives the auto policy a ForwardCosts for an engine (without a draft model:
the verifier's only, for prompt lookup): from the cache file
``<cache_dir>/forward-costs.json`` when this machine has probed these models with this build,
thread count and context size before, else from a short probe that is then cached (each model
prefills a 16-token context once, then every batch size is decoded once on top of it: online
correction refines it).
"""
from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, Sequence

from ..llama.hw import system_info
from .policy import ForwardCosts

__all__ = ["measure_forward_costs", "forward_costs", "probe_sizes", "COSTS_FILE"]

COSTS_FILE = "forward-costs.json"


def measure_forward_costs(engine, context_tokens: Sequence[int],
                          ks: Sequence[int], repeats: int = 10, warm: bool = True) -> dict:
    """Median milliseconds of one ``llama_decode`` after ``context_tokens``: the verifier with 1 and
    with k+1 tokens (all rows' logits, as in verification), the draft with 1 token.

    The speculative step costs about ``drafted x draft(1) + verifier(k+1)`` and yields AL + 1
    tokens; the verifier alone yields 1 token per ``verifier(1)``. Both KV caches are cleared after.
    ``warm``: decode each batch shape once more first, untimed (llama.cpp sizes its buffers on the
    first decode of a shape; the prefill has already done so for the largest).
    Returns {"verifier": {"1": ms, "k+1": ms, ...}, "draft": {"1": ms} (empty without a draft
    model), "draft_over_verifier": draft(1) / verifier(1) or None, "repeats", "n_context"}.
    """
    ctx_tokens = list(context_tokens)

    def probe(model, sizes: list[int]) -> dict[str, float]:
        """Prefill the context once, then time each batch size on top of it."""
        model.clear()
        model.decode(ctx_tokens, n_logits=1)
        base = model.n_past
        out = {}
        for n in sizes:
            batch = (ctx_tokens * (n // len(ctx_tokens) + 1))[-n:]
            times = []
            for _ in range(repeats + warm):  # a warm-up call is discarded
                t0 = time.perf_counter()
                model.decode(batch, n_logits=n)
                times.append((time.perf_counter() - t0) * 1e3)
                model.truncate(base)
            out[str(n)] = float(statistics.median(times[1:] if warm else times))
        model.clear()
        return out

    sizes = sorted({1} | {k + 1 for k in ks})
    out: dict[str, Any] = {"repeats": repeats, "n_context": len(ctx_tokens),
                           "verifier": probe(engine.verifier, sizes),
                           "draft": {}, "draft_over_verifier": None}
    if engine.draft is not None:
        out["draft"] = probe(engine.draft, [1])
        out["draft_over_verifier"] = out["draft"]["1"] / out["verifier"]["1"]
    return out


def probe_sizes(k_max: int) -> list[int]:
    """Draft lengths whose verification batch (k + 1 tokens) the probe times: 1, k_max / 2 and
    k_max (the rest are interpolated, and every size the policy uses is corrected online), so the
    probe costs the prefill of its context plus verifier(1) + verifier(2) + verifier(k/2 + 1) +
    verifier(k + 1) + draft(1), each decoded once."""
    return sorted({k for k in (1, k_max // 2, k_max) if 1 <= k <= k_max})


def _file_key(path: str | os.PathLike[str]) -> str:
    st = os.stat(path)
    return f"{Path(path).name}:{st.st_size}:{int(st.st_mtime)}"


def _key(engine, k_max: int) -> str:
    lo = engine.load_options
    draft = _file_key(engine.draft.model.path) if engine.draft is not None else "no draft"
    parts = [_file_key(engine.verifier.model.path), draft,
             system_info(), str(engine.verifier.n_threads), str(engine.verifier.n_ctx),
             str(lo.n_gpu_layers), str(lo.n_gpu_layers_draft), str(k_max),
             # where the layers run: an RPC server's costs are its machine's and its network's
             str(lo.device), str(lo.rpc), str(lo.device_draft), str(lo.rpc_draft),
             str(lo.tensor_split)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def forward_costs(engine, k_max: int, cache_dir: Path | None) -> tuple[ForwardCosts, bool]:
    """This machine's ForwardCosts for ``engine``'s verifier and draft, and whether they came from
    the cache. A probe clears both KV caches (the next request prefills from scratch).
    ``cache_dir`` None: probe, cache nothing."""
    path = cache_dir / COSTS_FILE if cache_dir is not None else None
    key = _key(engine, k_max)
    table: dict = {}
    if path is not None and path.is_file():
        try:
            table = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            table = {}
        hit = table.get(key)
        if isinstance(hit, dict) and "verify" in hit and "draft" in hit:
            return ForwardCosts({int(b): s for b, s in hit["verify"].items()}, hit["draft"]), True
    room = min(c.n_ctx for c in (engine.verifier, engine.draft) if c is not None) - (k_max + 1)
    tokens = engine.tokenize("def probe(x):\n    return x * 2 + 1\n" * 4)[:max(1, min(16, room))]
    ms = measure_forward_costs(engine, tokens, probe_sizes(k_max), repeats=1, warm=False)
    costs = ForwardCosts({int(n): v / 1e3 for n, v in ms["verifier"].items()},
                         ms["draft"].get("1", 0.0) / 1e3)  # no draft model: lookup only
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            table[key] = costs.as_dict()
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs a probe next time
    return costs, False
