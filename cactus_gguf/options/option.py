"""The option record: :class:`Option`, one user-visible option (its name, type, default, flags,
allowed values and where it applies), and :class:`Range`, a numeric option's allowed interval.

``Option.problem`` is the one check of a value against its option (table.py's ``check_value`` raises
on it); ``number_text`` writes a number as the messages and the flag tables of docs/options.md show
it. Imports nothing of the package.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["Range", "Option", "number_text"]


# ------------------------------------------------------------------------------------------------
# Allowed values
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Range:
    """A numeric interval, optionally with extra allowed values (``also``) and a note on special
    values (``note``, e.g. "0 = off"). ``problem(v)`` is None when v is allowed, else a phrase
    such as "must be in (0, 1] (1 = off), got 1.5"."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    also: tuple = ()
    note: str = ""

    def contains(self, v: float) -> bool:
        if v in self.also:
            return True
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return not (self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)))

    def describe(self) -> str:
        if self.lo is not None and self.hi is not None:
            text = (f"in {'(' if self.lo_open else '['}{number_text(self.lo)}, "
                    f"{number_text(self.hi)}{')' if self.hi_open else ']'}")
        elif self.lo is not None:
            text = f"{'>' if self.lo_open else '>='} {number_text(self.lo)}"
        elif self.hi is not None:
            text = f"{'<' if self.hi_open else '<='} {number_text(self.hi)}"
        else:
            text = "a number"
        if self.also:
            text = " or ".join(number_text(a) for a in self.also) + " or " + text
        return text + (f" ({self.note})" if self.note else "")


def number_text(x: Any) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        return str(int(x))
    if isinstance(x, int) and x >= 2**31:
        exp = x.bit_length() - 1
        return f"2**{exp}" if x == 2**exp else str(x)
    return str(x)


# ------------------------------------------------------------------------------------------------
# The option record
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Option:
    """One user-visible option.

    name: API / JSON name (also the keyword of :class:`Request` / :class:`LoadOptions`).
    type: int, float, str or bool; ``optional`` allows None (shown as ``shown_default``).
    default: the value when nobody sets it; ``command_defaults`` overrides it per command (e.g. the
        benchmark's fixed seed).
    flags: command-line flags, llama.cpp's where it has the option (empty: API / server only).
    scope: "load", "request" or a command name ("run", "bench").
    choices / range: the allowed values (None: any value of the type).
    recommend: a registry pair may recommend a value (applied when the user sets none).
    grid: ``bench`` sweeps it as a comma-separated list (``--k 4,8``).
    multiple: a tuple of values, the flag repeatable (``--stop``).
    file_or_text: on the command line the value may name a file holding it (read as UTF-8 before
        anything loads; api.read_file_options); the API and the server take the text itself.
    normalize: applied to a value before it is checked (e.g. a JSON Schema dict -> JSON text).
    words: names a numeric option also takes in place of a number (``-k auto``).
    count: an int option given by repeating its flag (``-vv`` = 2).
    applies: a setting of speculation (the server's ``speculative`` object takes exactly these,
        and results report each one: options/rule.py): ``()`` when it applies whenever the
        request speculates, else the conditions ``(option, values)`` under which it does, all
        holding (``(("method", ("cactus",)),)``: Cactus only); None: not a speculation setting
        (sampling, output, seed: every generation has them).
    """

    name: str
    type: type
    default: Any
    help: str
    flags: tuple[str, ...] = ()
    scope: str = "request"
    choices: tuple[str, ...] | None = None
    range: Range | None = None
    recommend: bool = False
    grid: bool = False
    multiple: bool = False
    optional: bool = False
    metavar: str | None = None
    shown_default: str | None = None
    commands: frozenset[str] = frozenset({"run", "bench", "serve"})
    command_defaults: Mapping[str, Any] = field(default_factory=dict)
    file_or_text: bool = False
    normalize: Callable[[Any], Any] | None = None
    words: tuple[str, ...] = ()
    applies: tuple[tuple[str, tuple[Any, ...]], ...] | None = None
    count: bool = False  # an int given by repeating the flag (-v, -vv)

    def default_for(self, command: str | None) -> Any:
        return self.command_defaults.get(command, self.default) if command else self.default

    def parse(self, text: str) -> Any:
        """A command-line word as a value of this option (one of ``words``, else the type's);
        raises ValueError."""
        return text if text in self.words else self.type(text)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not allowed (a phrase that follows the option's name), or None."""
        if (value is None and self.optional) or (self.words and value in self.words):
            return None
        if self.multiple:
            if not isinstance(value, (list, tuple)):
                return f"must be a string or a list of strings, got {type(value).__name__}"
            bad = next((v for v in value if not isinstance(v, str)), "")
            if bad != "":  # name the item, not the list (a None among strings, a number)
                return f"must be a string or a list of strings, got {bad!r} in the list"
            if "" in value:  # an empty stop string would match before the first token
                return "must not be an empty string"
            return None
        if self.type is bool:
            return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
        if self.type is str:
            if not isinstance(value, str):
                return f"must be a string, got {type(value).__name__}"
            if self.choices and value not in self.choices:
                return f"must be one of {', '.join(self.choices)}; got {value!r}"
            return None
        if isinstance(value, bool) or not _is_number(value, integral=self.type is int):
            kind = "an integer" if self.type is int else "a number"
            kind = " or ".join(self.words + (kind,))
            return f"must be {kind}, got {value!r}"
        if self.type is float and math.isnan(value):  # NaN fails every comparison: say so
            wanted = self.range.describe() if self.range else "a number"
            wanted = wanted if wanted.startswith("a number") else f"a number {wanted}"
            return f"must be {wanted}, got nan"
        if self.range is not None and not self.range.contains(value):
            return f"must be {self.range.describe()}, got {number_text(value)}"
        return None


def _is_number(x: Any, integral: bool) -> bool:
    import numbers

    if integral:
        return isinstance(x, numbers.Integral)
    return isinstance(x, numbers.Real)
