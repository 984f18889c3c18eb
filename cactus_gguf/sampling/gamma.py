"""Scalar helpers of the Cactus rule (native/gamma.c): the target mass gamma(q[n], delta) and
the binary KL divergence it is solved against."""
from __future__ import annotations

import math

from ._checks import is_real
from ._clib import SOLVER_VALUES, _cactus_gamma
from .params import SOLVERS

__all__ = ["binary_kl", "cactus_gamma"]


def cactus_gamma(q_n: float, delta: float, solver: str = "taylor") -> float:
    """Cactus target mass on the drafted token, gamma(q[n], delta) (Hao & Mou 2026).

    Taylor: ``min(1, q_n + sqrt(2 delta q_n (1 - q_n)))``. Exact: the root in [q_n, 1] of
    ``binary_kl(gamma, q_n) = delta``, or 1 when ``-log q_n <= delta``. q_n = 0 -> 0; q_n = 1 -> 1;
    delta = 0 -> q_n exactly.

    Args:
        q_n: verifier probability of the drafted token, in [0, 1].
        delta: KL budget in nats, >= 0.
        solver: ``"taylor"`` or ``"exact"``.
    Raises:
        ValueError: an argument out of range.
    """
    if not is_real(q_n) or not 0.0 <= q_n <= 1.0:
        raise ValueError(f"q_n must be in [0, 1], got {q_n!r}")
    if not is_real(delta) or not delta >= 0.0:
        raise ValueError(f"delta must be >= 0 nats, got {delta!r}")
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {', '.join(SOLVERS)}; got {solver!r}")
    return _cactus_gamma(float(q_n), float(delta), SOLVER_VALUES[solver])


def binary_kl(gamma: float, q: float) -> float:
    """KL(Bern(gamma) || Bern(q)) in nats, with 0 log 0 = 0 (+inf when q = 0 < gamma or gamma < 1 = q).

    For the Cactus target h (h[n] = gamma, the rest q rescaled) this is exactly KL(h || q).
    Raises ValueError unless both are in [0, 1].
    """
    if not is_real(gamma) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if not is_real(q) or not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q!r}")

    def term(a: float, b: float) -> float:
        if a == 0.0:
            return 0.0
        if b == 0.0:
            return math.inf
        return a * math.log(a / b)

    return term(gamma, q) + term(1.0 - gamma, 1.0 - q)
