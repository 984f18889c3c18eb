"""The speculation rule a request runs, named from the options table.

``SPECULATION`` are the request options that set speculation (``Option.applies`` is not None: the
draft length, the acceptance rule and its parameters, the drafter and its settings). Everything
that says what rule ran is generated from them, so a new option of the table is reported, and
taken by the server, without another declaration:

- the server's ``speculative`` object (server/speculative.py) takes exactly these fields;
- the response's ``speculative`` block, ``run --json`` and the run summary report each one where it
  applies to the request (``rule_of``), null where it does not (``delta`` under SpS, ``k_max`` at a
  fixed k, ``ngram_min`` with a draft model, everything but ``method`` = "none" when the request
  does not speculate);
- the summary's rule (``rule_words``) names the acceptance rule's own parameters: the options that
  apply under one method only (``delta``, ``solver``, ``budget``, ``top_gap``, ``protect_ends`` for
  Cactus; ``ears_alpha`` for EARS; ...).
"""
from __future__ import annotations

import math
from typing import Any

from .option import Option
from .table import options_in

__all__ = ["SPECULATION", "applies", "rule_of", "rule_words", "json_number"]

SPECULATION: tuple[Option, ...] = tuple(o for o in options_in("request") if o.applies is not None)


def applies(option: Option, request) -> bool:
    """Whether ``option`` (one of SPECULATION) takes effect in ``request``: the request speculates
    and each of the option's conditions holds."""
    return request.speculates and all(getattr(request, name) in values
                                      for name, values in option.applies)


def json_number(value: Any) -> Any:
    """``value`` as JSON can carry it: an infinite float (``top_gap`` inf, the paper's rule) as the
    string ``"inf"`` / ``"-inf"`` (JSON has no infinity); anything else as it is."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def rule_of(request) -> dict[str, Any]:
    """Every speculation setting of ``request`` by name, in table order: its value where it applies,
    None where it does not. ``method`` is "none" when the request does not speculate (method none,
    or k = 0); ``draft_temp`` is the temperature the draft sampled at (``draft_temp``, else the
    request's temperature: Request.draft_temperature). JSON-ready (``json_number``)."""
    out = {o.name: json_number(getattr(request, o.name)) if applies(o, request) else None
           for o in SPECULATION}
    out["method"] = request.method if request.speculates else "none"
    out["draft_temp"] = request.draft_temperature
    return out


def rule_words(request) -> str:
    """The acceptance rule for a one-line summary: ``method cactus delta=1 solver=taylor
    budget=target top_gap=0.5 protect_ends=0.1``; ``method none`` when it does not speculate. The
    parameters are the options that apply under one method (their conditions name ``method``)."""
    if not request.speculates:
        return "method none"
    words = [f"method {request.method}"]
    for o in SPECULATION:
        if any(name == "method" for name, _ in o.applies) and applies(o, request):
            value = getattr(request, o.name)
            words.append(f"{o.name}={value:g}" if isinstance(value, float) else
                         f"{o.name}={value}")
    return " ".join(words)
