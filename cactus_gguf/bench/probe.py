"""Forward-cost probe: what one draft / verifier ``llama_decode`` costs on this machine."""
from __future__ import annotations

import statistics
import time
from typing import Any, Sequence

__all__ = ["measure_forward_costs"]


def measure_forward_costs(engine, context_tokens: Sequence[int],
                          ks: Sequence[int], repeats: int = 10) -> dict:
    """Median milliseconds of one ``llama_decode`` after ``context_tokens``: the verifier with 1 and
    with k+1 tokens (all rows' logits, as in verification), the draft with 1 token.

    The speculative step costs about ``drafted x draft(1) + verifier(k+1)`` and yields AL + 1
    tokens; the verifier alone yields 1 token per ``verifier(1)``. Both KV caches are cleared after.
    Returns {"verifier": {"1": ms, "k+1": ms, ...}, "draft": {"1": ms} (empty without a draft
    model), "draft_over_verifier": draft(1) / verifier(1) or None, "repeats", "n_context"}.
    """
    ctx_tokens = list(context_tokens)

    def probe(model, n: int) -> float:
        model.clear()
        model.decode(ctx_tokens, n_logits=1)
        base = model.n_past
        batch = (ctx_tokens * (n // len(ctx_tokens) + 1))[-n:]
        times = []
        for _ in range(repeats + 1):  # the first call warms this batch shape up: discarded
            t0 = time.perf_counter()
            model.decode(batch, n_logits=n)
            times.append((time.perf_counter() - t0) * 1e3)
            model.truncate(base)
        model.clear()
        return float(statistics.median(times[1:]))

    sizes = sorted({1} | {k + 1 for k in ks})
    out: dict[str, Any] = {"repeats": repeats, "n_context": len(ctx_tokens),
                           "verifier": {str(n): probe(engine.verifier, n) for n in sizes},
                           "draft": {}, "draft_over_verifier": None}
    if engine.draft is not None:
        out["draft"]["1"] = probe(engine.draft, 1)
        out["draft_over_verifier"] = out["draft"]["1"] / out["verifier"]["1"]
    return out


