"""Forward-cost probe: what one draft / verifier ``llama_decode`` costs on this machine (the
function lives with the auto draft policy that also uses it: spec/costs.py)."""
from __future__ import annotations

from ..spec.costs import measure_forward_costs

__all__ = ["measure_forward_costs"]
