"""The records that cross the C boundary: ``c_params`` fills a C parameter struct from a
SamplingParams / AcceptanceParams by field name; ``StepResult`` and ``Law`` hold what
``cg_verify`` and ``cg_emitted_law`` return."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

import numpy as np

from ._checks import addr
from ._clib import BUDGET_VALUES, METHOD_VALUES, SOLVER_VALUES

__all__ = ["Law", "StepResult", "c_params"]

# Fields whose C type is an enum: the record holds the option's name, C the library's value for it.
_ENUM_FIELDS = {"method": METHOD_VALUES, "solver": SOLVER_VALUES, "budget": BUDGET_VALUES}


def c_params(ctype: type[ctypes.Structure], record) -> ctypes.Structure:
    """The C struct ``ctype`` filled by field name from the same-named fields of ``record`` (a
    SamplingParams or AcceptanceParams): enum fields through the library's name -> value maps,
    booleans as 0 / 1, arrays as their address (the record keeps them alive). Every C field must
    have its record field and the other way round, so a
    field added on one side only fails here, not silently in C."""
    c_fields = [name for name, _ in ctype._fields_]
    r_fields = [f.name for f in dataclass_fields(record)]
    if sorted(c_fields) != sorted(r_fields):
        raise TypeError(f"{type(record).__name__} fields {r_fields} do not match "
                        f"{ctype.__name__} fields {c_fields}")
    values = {}
    for name in c_fields:
        value = getattr(record, name)
        values[name] = (_ENUM_FIELDS[name][value] if name in _ENUM_FIELDS
                        else int(value) if isinstance(value, bool)
                        else addr(value) if isinstance(value, np.ndarray)  # read in place by C
                        else value)
    return ctype(**values)


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outcome of one verification step.

    - ``n_accepted``: acceptance length AL, accepted drafts ``0..k``.
    - ``next_token``: the residual token (``n_accepted < k``) or the bonus token (``n_accepted == k``).
    - ``n_evaluated``: drafted positions that went through the test, ``min(AL + 1, k)``.
    - ``kl_sum``, ``kl_max``: sum and max over evaluated positions of KL(h || q), nats (max 0 if
      none): the divergence of each drafted token's *target*, what the paper's delta bounds.
    - ``output_kl_sum``, ``output_kl_max``: the same for KL(P || q), P the law of the token each
      evaluated position emits (``NativeSampler.emitted_law``): what the output actually diverges.
    - ``delta_sum``: Cactus, sum over evaluated positions of the per-draft budget used (delta for
      ``budget="target"``, the delta' <= delta searched for ``"output"``); else 0.
    """

    n_accepted: int
    next_token: int
    n_evaluated: int
    kl_sum: float
    kl_max: float
    output_kl_sum: float = 0.0
    output_kl_max: float = 0.0
    delta_sum: float = 0.0


@dataclass(frozen=True, slots=True)
class Law:
    """The law of the token one drafted position emits (accepted draft or residual).

    - ``probs``: float64 [V], P(x) = sum_n p[n] (1[x = n] a_n + (1 - a_n) r_n[x])
      (docs/maths.md, "The emitted law").
    - ``kl``: KL(P || q) in nats (0 for sps and greedy, where P = q).
    - ``acceptance``: the chance the drafted token is accepted, sum_n p[n] a_n.
    - ``delta``: Cactus, the per-draft budget the position used; else 0.
    """

    probs: np.ndarray
    kl: float
    acceptance: float
    delta: float
