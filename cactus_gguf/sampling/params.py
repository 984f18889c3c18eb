"""The two parameter sets the native helper takes, built from a :class:`~cactus_gguf.options.Request`.

Their fields are options of the table (cactus_gguf/options), declared with ``opt(name)`` (defaults,
allowed values
and messages come from the table) and filled from the Request's fields of the same names; these
frozen records are what crosses into C (``native.c_params``, by field name), so a per-token call
never re-validates anything.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from ..errors import InputError
from ..options import BUDGETS, METHODS, SOLVERS, check_fields, check_value, opt, option_of

__all__ = ["SamplingParams", "AcceptanceParams", "METHODS", "SOLVERS", "BUDGETS", "sampling_params",
           "draft_sampling", "draft_sampling_params", "acceptance_params"]


@dataclass(frozen=True)
class SamplingParams:
    """Sampling warps, applied in llama.cpp's default order: top-k, top-p, min-p, temperature.

    - ``temperature``: > 0 scales the logits; <= 0 means greedy (one-hot at the argmax, ties ->
      lowest id).
    - ``top_k``: keep the ``top_k`` largest logits (ties -> lowest id); 0 = off.
    - ``top_p``: keep the smallest descending prefix with cumulative prob >= top_p, in (0, 1];
      1 = off.
    - ``min_p``: keep prob >= min_p * max prob, in [0, 1]; 0 = off.

    top-p and min-p use softmax at temperature 1 over the tokens still kept. Values cross into C as
    float32 (temperature, top_p, min_p). Defaults: ``cactus_gguf/options/``.
    Raises InputError (a ValueError) on an out-of-range value.
    """

    temperature: float = opt("temperature")
    top_k: int = opt("top_k")
    top_p: float = opt("top_p")
    min_p: float = opt("min_p")

    __post_init__ = check_fields


@dataclass(frozen=True)
class AcceptanceParams:
    """How the verifier accepts drafted tokens (the math: native/cactus_native.h; Hao & Mou,
    ICLR 2026, arXiv:2604.04987).

    - ``method``: ``"sps"`` (h = q, exact), ``"cactus"`` (max acceptance s.t. KL(h||q) <= delta),
      ``"typical"`` (q[n] > min(eps, alpha exp(-H(q))), else argmax q), ``"topk"`` (n in the
      verifier's top ``accept_top_k``), ``"greedy"`` (x ~ q; accept while x == n).
    - ``delta``: Cactus KL budget in nats, >= 0 (0 is exactly SpS).
    - ``solver``: Cactus gamma, ``"taylor"`` (the paper's closed form) or ``"exact"`` (binary-KL root).
    - ``budget``: what Cactus delta bounds: ``"target"`` (KL(h_n || q) <= delta per drafted token,
      the paper's) or ``"output"`` (KL(P || q) <= delta for the law P of each emitted token).
    - ``output_kl``: measure KL(P || q) at every evaluated position (StepResult.output_kl_*).
    - ``typical_epsilon``, ``typical_alpha``: >= 0 (vLLM defaults 0.09, 0.3).
    - ``accept_top_k``: >= 1 (the authors' default 5).
    - ``ears_alpha``: EARS's tolerance weight alpha, >= 0 (0 is SpS).
    - ``top_gap``: Cactus relaxes only drafts with q[n] >= max(q) exp(-top_gap), nats >= 0; inf =
      every draft (the paper's, this record's default; a Request's is the product's rule, 0.5).
    - ``end_tau`` and ``end_mask``: protected ends (Cactus): ``end_mask`` uint32
      [ceil(V / 32)] (``native.pack_allowed`` of a bool [V] end set: end-of-generation tokens and
      tokens that start a stop string) or None; at a position with q(E) >= end_tau the emitted law
      keeps P(E) >= q(E) (SpS there when Cactus would lower it). end_tau > 1: never.

    Every field is validated whatever the method. Raises InputError (a ValueError) on an
    out-of-range value.
    """

    method: str = opt("method")
    delta: float = opt("delta")
    solver: str = opt("solver")
    typical_epsilon: float = opt("typical_epsilon")
    typical_alpha: float = opt("typical_alpha")
    accept_top_k: int = opt("accept_top_k")
    budget: str = opt("budget")
    output_kl: bool = opt("output_kl")
    ears_alpha: float = opt("ears_alpha")
    top_gap: float = opt("top_gap", math.inf)  # the paper's: a Request's default is the product's
    end_tau: float = 2.0  # > 1: no position is protected
    end_mask: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        check_fields(self)  # the option fields; end_tau and end_mask are not options: checked here
        if not self.end_tau >= 0.0:
            raise InputError(f"end_tau must be a number >= 0, got {self.end_tau!r}")
        m = self.end_mask
        if m is not None and not (isinstance(m, np.ndarray) and m.dtype == np.uint32
                                  and m.ndim == 1 and m.flags.c_contiguous):
            raise InputError("end_mask must be a C-contiguous uint32 [ceil(V / 32)] array "
                             "(native.pack_allowed of a bool [V] end set) or None")
        if self.method not in METHODS:  # "none" is a Request's method, not an acceptance rule
            check_value("method", self.method)
            raise InputError(f"{{method}} must be one of {', '.join(METHODS)}; got "
                             f"{self.method!r}", param="method")


def _from_request(record_type: type, request) -> dict[str, Any]:
    """The Request's values of ``record_type``'s option fields, by name."""
    return {f.name: getattr(request, f.name) for f in fields(record_type)
            if option_of(f) is not None}


def sampling_params(request) -> SamplingParams:
    """The warps of a Request (the verifier's q; the draft's p too unless ``draft_temp`` is set)."""
    return SamplingParams(**_from_request(SamplingParams, request))


def draft_sampling(sampling: SamplingParams, draft_temp: float | None) -> SamplingParams:
    """The draft's own warps: ``sampling`` with its temperature replaced by ``draft_temp`` (top-k,
    top-p and min-p unchanged; 0 = greedy, a one-hot proposal); ``sampling`` itself when
    ``draft_temp`` is None (the draft samples at the request's temperature). Raises InputError (a
    ValueError) for a draft_temp that is not a finite number >= 0."""
    if draft_temp is None:
        return sampling
    return replace(sampling, temperature=check_value("draft_temp", draft_temp))


def draft_sampling_params(request) -> SamplingParams:
    """The warps a Request's draft samples its proposals from (``draft_sampling``)."""
    return draft_sampling(sampling_params(request), request.draft_temp)


def acceptance_params(request, end_mask: np.ndarray | None = None) -> AcceptanceParams | None:
    """The acceptance rule of a Request; None when it does not speculate (method "none" or k = 0:
    the verifier alone). ``end_mask``: the packed end set (AcceptanceParams) for
    ``protect_ends``; None: unprotected."""
    if not request.speculates:
        return None
    protected = request.protect_ends != "off" and end_mask is not None
    return AcceptanceParams(**_from_request(AcceptanceParams, request),
                            **({"end_tau": request.protect_ends, "end_mask": end_mask}
                               if protected else {}))
