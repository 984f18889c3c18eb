"""How many tokens to draft: the draft-length policy of a generation.

A policy answers three questions for the engine's step (engine.py):
- ``draft_length(limit)``: how many tokens to draft this step, at most ``limit`` (the room left
  in both contexts, in one llama_decode batch, and before n_predict);
- ``too_unsure(probs)``: after the draft sampled a token from its warped distribution ``probs``
  (float32 [V]), whether to drop that token and stop drafting (llama.cpp ``--draft-p-min``);
- ``keep(n_drafted)``: how many of the drafted tokens to verify (0 drops a draft shorter than
  llama.cpp's ``--draft-min``: that step is verifier-only);
and is told each step's outcome through ``observe`` (adaptive policies learn from it).
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["DraftPolicy", "FixedDraftLength"]


class DraftPolicy(Protocol):
    def draft_length(self, limit: int) -> int: ...

    def too_unsure(self, probs: np.ndarray) -> bool: ...

    def keep(self, n_drafted: int) -> int: ...

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float,
                verify_seconds: float) -> None: ...


class FixedDraftLength:
    """Draft ``k`` tokens every step (fewer only when ``limit`` says so), as llama.cpp's
    ``--draft-max``; ``draft_p_min`` / ``draft_min`` as llama.cpp's options of those names."""

    def __init__(self, k: int, draft_min: int = 0, draft_p_min: float = 0.0) -> None:
        self.k, self.draft_min, self.draft_p_min = k, draft_min, draft_p_min

    def draft_length(self, limit: int) -> int:
        return min(self.k, limit)

    def too_unsure(self, probs: np.ndarray) -> bool:
        # compared in float32, as the row (NumPy's rule for a Python float against float32)
        return self.draft_p_min > 0.0 and bool(probs.max() < self.draft_p_min)

    def keep(self, n_drafted: int) -> int:
        return n_drafted if n_drafted >= self.draft_min else 0

    def observe(self, n_drafted: int, n_accepted: int, draft_seconds: float,
                verify_seconds: float) -> None:
        pass

    @classmethod
    def from_request(cls, request) -> "FixedDraftLength":
        return cls(request.k, request.draft_min, request.draft_p_min)
