"""click options made from the options table (cactus_gguf/options/): flags, types, defaults, help.

``schema_options(command)`` decorates a click command with every option of that command that has
flags; the command receives them under their option names. ``given(ctx)`` is what the user set
(an option left at its default is not "given", so a registry pair may recommend it).
"""
from __future__ import annotations

from typing import Any

import click

from ..options import BY_NAME, Option, options_in

__all__ = ["schema_options", "given", "flag_of"]


def flag_of(name: str) -> str:
    """How the command line spells option ``name`` (for error messages): ``-c/--ctx-size``."""
    o = BY_NAME.get(name)
    if o is None:
        return name
    flags = [f for f in o.flags if f.startswith("-")]
    return "/".join(flags) if flags else (o.flags[0] if o.flags else name)


def _list_of(o: Option):
    """click callback for a grid option: "0.5,1,2" -> (0.5, 1.0, 2.0)."""
    def parse(ctx, param, value):
        if value is None or isinstance(value, tuple):
            return value
        try:
            return tuple(o.parse(v.strip()) for v in str(value).split(",") if v.strip())
        except ValueError:
            kind = " or ".join(o.words + (f"{o.type.__name__}s",))
            raise click.BadParameter(f"expected a comma-separated list of {kind}, "
                                     f"got {value!r}") from None
    return parse


class _NumberOrWord(click.ParamType):
    """A number, or one of the option's ``words`` (``-k auto``)."""

    def __init__(self, o: Option) -> None:
        self.option = o
        self.name = "|".join(o.words + (o.type.__name__,))

    def convert(self, value, param, ctx):
        try:
            return self.option.parse(value) if isinstance(value, str) else value
        except ValueError:
            kind = {"int": "integer", "float": "number"}.get(self.option.type.__name__,
                                                             self.option.type.__name__)
            self.fail(f"{value!r} is not {' or '.join(self.option.words)} or a valid {kind}",
                      param, ctx)


def _help(o: Option, command: str) -> str:
    text = o.help.replace("`", "")
    if o.shown_default:
        text += f"  [default: {o.shown_default}]"
    return text


def _click_option(o: Option, command: str, grid: bool):
    flags = [f for f in o.flags if f.startswith("-")]
    default = o.default_for(command)
    kw: dict[str, Any] = {"help": _help(o, command), "show_default": o.shown_default is None}
    if o.count:  # -v, -vv
        return click.option(*flags, o.name, count=True, **kw)
    if o.type is bool:
        if o.optional:  # three states: on, off, or decided later (None)
            flags = [f"{f}/--no-{f[2:]}" for f in flags if f.startswith("--")]
            return click.option(*flags, o.name, default=default, **kw)
        off = [f for f in flags if f.startswith("--no-")]
        if off and len(off) < len(flags):  # a pair, e.g. --output-kl / --no-output-kl
            on = [f for f in flags if f not in off]
            return click.option(f"{'/'.join(on)}/{'/'.join(off)}", o.name, default=default, **kw)
        return click.option(*flags, o.name, is_flag=True, default=default, **kw)
    if grid:
        shown = ",".join(str(v) for v in default) if isinstance(default, tuple) else default
        return click.option(*flags, o.name, type=str, default=shown, callback=_list_of(o),
                            metavar="LIST", **kw)
    ctype: Any = (click.Choice(list(o.choices)) if o.choices else
                  _NumberOrWord(o) if o.words else o.type)
    return click.option(*flags, o.name, type=ctype, default=default, multiple=o.multiple,
                        metavar=o.metavar, **kw)


def schema_options(command: str, *, grid: bool = False, exclude: tuple[str, ...] = ()):
    """Decorator: the click options of ``command`` (grid options as comma-separated lists when
    ``grid``), in table order in ``--help``."""
    chosen = [o for o in options_in(command=command)
              if o.name not in exclude and any(f.startswith("-") for f in o.flags)]

    def decorate(f):
        for o in reversed(chosen):
            f = _click_option(o, command, grid and o.grid)(f)
        return f
    return decorate


def given(ctx: click.Context) -> dict[str, Any]:
    """The options the user set on the command line (name -> value); multiple-valued ones as
    tuples."""
    out = {}
    for name, value in ctx.params.items():
        if name in BY_NAME and ctx.get_parameter_source(name) != click.core.ParameterSource.DEFAULT:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out
