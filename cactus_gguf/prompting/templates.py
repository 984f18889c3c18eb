"""Chat templates, rendered: a Jinja template (the GGUF's, or ``--chat-template`` /
``--chat-template-file``'s text) or one of llama.cpp's built-in templates by name
(``--chat-template chatml``, ``llama3``, ``command-r``, ...: llama.cpp's own C++ formatters,
``llama_chat_apply_template``, as llama-server uses them without ``--jinja``); and the thinking
switch ``enable_thinking`` a template is given (``--reasoning``). A Jinja template is also given
today's date (``date_string``, ``datetime``), as llama-server gives it, and ``+`` reads a null or
undefined beside a string as the empty string, as llama.cpp's Jinja engine does (Firefunction
v2's template adds ``functions``, which nobody gives it).

``--reasoning`` (llama-server's ``-rea``): ``on`` renders every template with
``enable_thinking`` true, ``off`` with it false, ``auto`` with it true only where the template
has a thinking switch: where a one-message chat's prompt changes when ``enable_thinking`` flips
(llama.cpp decides so too, by comparing the two renderings). A built-in template has none.
"""
from __future__ import annotations

import ctypes
import datetime
import functools
from typing import Any, Sequence

from ..errors import InputError
from ..options.values import builtin_chat_templates

__all__ = ["REASONING", "builtin_templates", "is_builtin", "apply_template", "content_kinds",
           "has_thinking_switch", "enable_thinking"]

REASONING = ("on", "off", "auto")  # --reasoning's values


@functools.cache
def builtin_templates() -> tuple[str, ...]:
    """The names of llama.cpp's built-in chat templates."""
    return builtin_chat_templates()


def is_builtin(template: str | None) -> bool:
    """Whether ``template`` is the name of a built-in template (not Jinja text)."""
    return bool(template) and template in builtin_templates()


def apply_template(template: str, messages: Sequence[dict], *, bos: str, eos: str,
                   add_generation_prompt: bool = True, **variables: Any) -> str:
    """``messages`` rendered with ``template``: a built-in template's name (roles and text only;
    ``variables`` are not read) or Jinja text, given ``bos_token``, ``eos_token``,
    ``add_generation_prompt`` and ``variables`` (``tools``, ``enable_thinking``). Jinja's and the
    template's own errors propagate (the callers name the field at fault)."""
    if is_builtin(template):
        return _apply_builtin(template, messages, add_generation_prompt)
    formatter = _formatter(template, eos, bos, add_generation_prompt)
    return formatter(messages=list(messages), **{**today(), **variables}).prompt


@functools.lru_cache(maxsize=8)  # a server renders its one template, compiled once
def _formatter(template: str, eos: str, bos: str, add_generation_prompt: bool):
    """llama-cpp-python's Jinja2ChatFormatter (its sandbox, filters and extensions), its template
    compiled in an environment whose ``+`` joins a string and a null or undefined value as
    llama.cpp's Jinja engine does (the null taken as "", where Jinja2 raises)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    class Environment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+"})

        def call_binop(self, context, operator, left, right):
            if operator == "+" and isinstance(left, str) and _null(right):
                return left
            if operator == "+" and isinstance(right, str) and _null(left):
                return right
            return super().call_binop(context, operator, left, right)

    def _null(value) -> bool:
        return value is None or isinstance(value, jinja2.Undefined)

    class Formatter(Jinja2ChatFormatter):
        def __init__(self, template: str, **kw: Any) -> None:
            super().__init__(template, **kw)
            env = self._environment.environment  # the sandbox as llama-cpp-python set it up
            ours = Environment(loader=env.loader, trim_blocks=env.trim_blocks,
                               lstrip_blocks=env.lstrip_blocks,
                               extensions=[type(e) for e in env.extensions.values()])
            ours.filters.update(env.filters)
            self._environment = ours.from_string(template)

    return Formatter(template, eos_token=eos, bos_token=bos,
                     add_generation_prompt=add_generation_prompt)


def today() -> dict[str, str]:
    """Today's date as llama-server gives it to every Jinja template: ``date_string`` ("07 Dec
    2026": Llama 3.x's "Today Date") and ``datetime`` ("Dec 07 2026": Firefunction's)."""
    now = datetime.date.today()
    return {"date_string": now.strftime("%d %b %Y"), "datetime": now.strftime("%b %d %Y")}


def _apply_builtin(name: str, messages: Sequence[dict], add_generation_prompt: bool) -> str:
    import llama_cpp

    encoded = [(str(m.get("role", "")).encode("utf-8"), str(m.get("content") or "").encode("utf-8"))
               for m in messages]
    chat = (llama_cpp.llama_chat_message * max(1, len(encoded)))()
    for i, (role, content) in enumerate(encoded):  # (encoded keeps the bytes alive)
        chat[i].role, chat[i].content = role, content
    size = 2 * sum(len(r) + len(c) for r, c in encoded) + 256
    for _ in range(2):  # the first call says how long the prompt is when the buffer was short
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_chat_apply_template(name.encode("utf-8"), chat, len(encoded),
                                                add_generation_prompt, buf, size)
        if n < 0:
            raise InputError(f"llama.cpp's built-in chat template {name!r} refused these "
                             "messages", param="messages")
        if n <= size:
            return buf.raw[:n].decode("utf-8", errors="replace")
        size = n
    raise InputError(f"the built-in chat template {name!r} gave no prompt", param="messages")


_MARK = "Cactus-probe-7a31"  # a text no template writes by itself


class _Parts(list):
    """A message's content parts that note whether the template read them one by one (a
    ``for`` over them, an index, a filter that walks them), not as a whole (``| string``,
    ``| tojson``, ``+``: a list's text)."""

    read = False

    def __iter__(self):
        self.read = True
        return super().__iter__()

    def __getitem__(self, index):
        self.read = True
        return super().__getitem__(index)


@functools.lru_cache(maxsize=8)
def content_kinds(template: str | None, *, bos: str = "", eos: str = "") -> tuple[bool, bool]:
    """``(text, parts)``: whether ``template`` renders a message's content given as text, and
    given as a list of typed parts (``[{"type": "text", "text": ...}]``) that it reads part by
    part, as llama.cpp finds out before it renders (its template capabilities): a one-message
    chat rendered each way must show the message's text, and the parts must have been read one
    by one, not printed whole. A built-in template (or none) takes text only; one that shows
    neither, text."""
    if not template or is_builtin(template):
        return True, False

    def render(content) -> str:
        try:
            return apply_template(template, [{"role": "user", "content": content}], bos=bos,
                                  eos=eos)
        except Exception:  # noqa: BLE001 (the template's own refusal: it does not take this)
            return ""

    probe = _Parts([{"type": "text", "text": _MARK}])
    as_text, as_parts = render(_MARK), render(probe)
    # (a part printed whole, | tojson, shows its keys: that is not reading it)
    keys = sum(as_parts.count(q + "type" + q) for q in "'\"") > \
        sum(as_text.count(q + "type" + q) for q in "'\"")
    parts = probe.read and _MARK in as_parts and not keys
    return (_MARK in as_text or not parts), parts


def has_thinking_switch(template: str | None, *, bos: str = "", eos: str = "") -> bool:
    """Whether ``template`` reads ``enable_thinking``: a one-message chat's prompt (assistant's
    turn opened) differs between ``enable_thinking`` true and false. A template that fails to
    render that chat has none."""
    if not template or is_builtin(template):
        return False
    chat = [{"role": "user", "content": "test"}]
    try:
        on, off = (apply_template(template, chat, bos=bos, eos=eos, enable_thinking=flag)
                   for flag in (True, False))
    except Exception:  # noqa: BLE001 (a template's own raise_exception, Jinja errors: no switch)
        return False
    return on != off


def enable_thinking(reasoning: str, template: str | None, *, bos: str = "", eos: str = "") -> bool:
    """The ``enable_thinking`` every chat prompt is rendered with, for ``--reasoning``
    ``reasoning`` (module docstring)."""
    if reasoning not in REASONING:
        raise InputError(f"{{reasoning}} must be one of {', '.join(REASONING)}, got {reasoning!r}",
                         param="reasoning")
    if reasoning != "auto":
        return reasoning == "on"
    return has_thinking_switch(template, bos=bos, eos=eos)
