"""The ``speculative`` object of a request body, generated from the options table.

One field per speculation setting (``options.rule.SPECULATION``: ``method``, ``delta``, ``k``,
``top_gap``, ``protect_ends``, ``ears_alpha``, ``draft_min``, ``typical_epsilon``, ...), each
optional (left out: the server's default, its ``serve`` option), so a request may set any of them,
exactly as ``cactus-gguf run`` takes them. Types are strict as OpenAI validates (``"k": "4"`` is a
400, an integer is a valid float); the allowed values are the options table's own check (the one
``Request`` runs), so a value out of range is refused with the table's words, the field named as
``speculative.<name>``. A float also takes the string ``"inf"`` (``"infinity"``, any case): answers
write an infinite value so (options/rule.py ``json_number``), and what an answer reports can be sent
back. The JSON schema (``/docs``, ``/openapi.json``) carries each option's help,
its allowed values and where it applies. An unknown field is refused.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BeforeValidator, ConfigDict, Field, create_model

from ..options import Option
from ..options.rule import SPECULATION

__all__ = ["Speculative", "SPECULATIVE_FIELDS", "field_schema"]

SPECULATIVE_FIELDS: tuple[str, ...] = tuple(o.name for o in SPECULATION)


# How an answer writes an infinite float (rule.json_number: JSON has no infinity), and the other
# spellings a client may send back for one (any case; JSON.stringify(Infinity) is null)
_INFINITE = {"inf": math.inf, "+inf": math.inf, "infinity": math.inf, "+infinity": math.inf,
             "-inf": -math.inf, "-infinity": -math.inf}


def _infinite(value: Any) -> Any:
    """A float field's value: "inf" / "infinity" (any case, with a sign or not) as the float it
    names, so what an answer reports (``"top_gap": "inf"``) is sendable back; anything else as it
    is (the strict type check then refuses any other string)."""
    if isinstance(value, str):
        return _INFINITE.get(value.lower(), value)
    return value


def _annotation(o: Option) -> Any:
    """The JSON type of option ``o``: its type (``int``, ``float``, ``str``, ``bool``), or one of
    the words it takes in place of a number (``k``: an integer or "auto"); None = left out. A
    float also takes the string "inf" (``_infinite``); the options table then checks the value."""
    kind: Any = Annotated[float, BeforeValidator(_infinite)] if o.type is float else o.type
    for word in o.words:
        kind = Union[kind, Literal[word]]
    return Optional[kind]


def _where(o: Option) -> str:
    """Where ``o`` applies, in words."""
    if not o.applies:
        return "whenever the request speculates"
    return "only with " + " and ".join(f"{name} " + " or ".join(map(str, values))
                                       for name, values in o.applies)


def field_schema(o: Option) -> dict[str, Any]:
    """The JSON-schema keywords of option ``o`` beyond its type: its allowed values (``enum``,
    ``minimum`` / ``maximum``) and a description (its help, where it applies, its flag)."""
    out: dict[str, Any] = {}
    if o.choices:
        out["enum"] = [*o.choices, None]  # None: left out
    r = o.range
    if r is not None and not r.also:  # "-1 or >= 1" is no interval: the description says it
        for bound, open_, key in ((r.lo, r.lo_open, "minimum"), (r.hi, r.hi_open, "maximum")):
            if bound is not None and math.isfinite(bound):
                out[("exclusiveM" + key[1:]) if open_ else key] = bound
    flag = next((f for f in o.flags if f.startswith("--")), None)
    out["description"] = (f"{o.help}"
                          + ('; the string "inf" (or "infinity", any case) is infinity, as '
                             'answers write it' if o.type is float else "")
                          + f". Applies {_where(o)}"
                          + (f"; `cactus-gguf run {flag}`" if flag else "") + ".")
    return out


Speculative = create_model(
    "Speculative",
    __config__=ConfigDict(extra="forbid", strict=True),
    __doc__="Speculation for one request: any request option of the speculation rule, each left "
            "out keeping the server's default (docs/server.md \"Requests\").",
    **{o.name: (_annotation(o), Field(default=None, json_schema_extra=field_schema(o)))
       for o in SPECULATION},
)
