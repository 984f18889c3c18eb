"""Tool calls parsed out of the text a model writes, as it grows (the conventions and the JSON
rules: toolcalls.py's module text): :class:`ToolCallParser` takes each new piece and returns the
content that is final and the calls that closed, each validated against its tool's parameters."""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Sequence

from ..sampling.constraints import json_matches
from .text import StopMatcher
from .toolcalls import (ACTION_CLOSE, ACTION_OPEN, CLOSE, COMMAND_R7B, FENCE, FENCE_END, GENERIC,
                        HERMES, LLAMA3, OPEN, PYTHON_TAG, RESPONSE_CLOSE, RESPONSE_OPEN,
                        THINK_CLOSE, THINK_OPEN, ToolFormat, arguments_schema)

__all__ = ["ToolCall", "ToolCallParser"]

_DECODER = json.JSONDecoder()



@dataclass(frozen=True)
class ToolCall:
    """One parsed call: OpenAI's ``{"id", "type": "function", "function": {"name",
    "arguments"}}`` with the arguments as compact JSON text."""

    id: str
    name: str
    arguments: str

    def openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def _call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


class ToolCallParser:
    """Text in, (content, calls) out, as the reply grows: feed() takes each new piece and returns
    the content that is final and the calls completed; finish() ends the reply.

    A hermes call is found in three shapes: the template's ``<tool_call>`` tags (where the grammar
    binds it), a ```` ```json ```` block holding the call object, and a reply that is the bare
    object (small models write those two under tool_choice auto: Qwen2.5-Coder-1.5B does). A
    llama3 call is the reply itself. A command_r7b reply is read block by block: its plan is
    content with its markers, its answer content without them, and each call of its action list
    is handed out as it closes. A generic reply is one JSON object: its ``response`` is the
    content (streamed as the string grows), its ``tool_calls`` the calls (each handed out once
    whole), its ``tool_call`` the one call; a reply in no such shape is text, and so is one cut
    short before any of its calls was whole (a cut response is its text so far). Whatever the
    shape, a call is kept only if it names one of the ``tools`` and its arguments validate
    against that tool's parameters (the grammar engine's JSON Schema, as the constrained
    shapes): anything else stays text, so every call returned validates. Text that might begin
    a call is held back until it does or cannot (a partial tag or fence; a reply that opens with
    ``{``).

    ``stops``: stop strings, matched in the content only (never inside a call's markup or
    arguments, which the grammar constrains): the first one ends the reply there, ``stopped``
    turns true, and later text is ignored. ``finish(cut=True)``: the reply was cut short
    (max_tokens, a time limit), so a call it ends inside is half a call: dropped, neither a call
    nor content (a generic reply cut before its first whole call: its text, above)."""

    def __init__(self, fmt: ToolFormat, tools: Sequence[dict], stops: Sequence[str] = ()) -> None:
        self.fmt = fmt
        self.schemas = {t["function"]["name"]: arguments_schema(t["function"]) for t in tools}
        self.buffer = ""  # text not handed out yet
        self.calls: list[ToolCall] = []
        self._started = False  # non-blank text came before: a bare object is no call any more
        self._last = "start"  # what the reply last held: "start", "text" or "call" (blanks
        # between calls, or around them at the reply's ends, are no content)
        self._stop_strings = tuple(s for s in stops if s)
        self._stops = StopMatcher(self._stop_strings)  # the content since the last call
        self.stopped = False  # a stop string ended the content
        self._said = ""  # generic: the response text handed to the content so far
        self._in: str | None = None  # command_r7b: the block the text is in (_cohere)
        self._handed = 0  # command_r7b: the calls of the open action block handed out
        self._parse = {HERMES: self._hermes, LLAMA3: self._llama3, GENERIC: self._generic,
                       COMMAND_R7B: self._cohere}[fmt.kind]

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.stopped:
            return "", []
        self.buffer += text
        return self._parse(final=False)

    def finish(self, cut: bool = False) -> tuple[str, list[ToolCall]]:
        if self.stopped:
            return "", []
        content, calls = self._parse(final=True, cut=cut)
        return (content if self.stopped else content + self._stops.finish()), calls

    def _accept(self, obj: Any) -> ToolCall | None:
        """A parsed JSON value as a call, or None when it is not a valid call of a tool."""
        name = obj.get(self.fmt.name_key) if isinstance(obj, dict) else None
        if name not in self.schemas:
            return None
        args = obj.get(self.fmt.arguments_key, obj.get("arguments", obj.get("parameters", {})))
        if isinstance(args, str):  # some models write the arguments as JSON text
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict) or not json_matches(self.schemas[name], args):
            return None
        return ToolCall(_call_id(), name, json.dumps(args, ensure_ascii=False))

    def _next(self, buf: str) -> tuple[int, str]:
        """Where the next possible call starts in ``buf`` and its shape, or (-1, "")."""
        found = [(i, kind) for i, kind in ((buf.find(OPEN), "tag"), (buf.find(FENCE), "fence"))
                 if i >= 0]
        head = _skip_space(buf, 0)
        if not self._started and buf.startswith("{", head):
            found.append((head, "bare"))
        return min(found) if found else (-1, "")

    def _block(self, buf: str, start: int, kind: str, final: bool, cut: bool = False):
        """The block at ``start``: ("wait",) while it may still become a call, ("text", end)
        when it is not one, ("call", end, obj) when it holds a JSON object, ("cut",) when the
        reply was cut short inside the call a tag opened."""
        i = start + {"tag": len(OPEN), "fence": len(FENCE), "bare": 0}[kind]
        i = _skip_space(buf, i)
        if kind == "fence" and i < len(buf) and buf[i] != "{":
            return ("text", i)  # a JSON block of something else
        try:
            obj, end = _DECODER.raw_decode(buf, i)
        except json.JSONDecodeError:
            if final and cut and kind == "tag":
                return ("cut",)
            return ("text", len(buf)) if final else ("wait",)
        closing = {"tag": CLOSE, "fence": FENCE_END, "bare": ""}[kind]
        j = _skip_space(buf, end)
        if buf.startswith(closing, j):
            return ("call", j + len(closing), obj)
        if len(buf) - j < len(closing) and closing.startswith(buf[j:]):
            # the closing tag is on its way, or the reply ended inside it: the call is whole
            return ("call", len(buf), obj) if final else ("wait",)
        return ("call", end, obj) if kind == "tag" else ("text", end)

    def _hermes(self, final: bool, cut: bool = False) -> tuple[str, list[ToolCall]]:
        content, calls = [], []
        while not self.stopped:
            buf = self.buffer
            start, kind = self._next(buf)
            if start < 0:
                keep = 0 if final else max(_partial_tail(buf, OPEN), _partial_tail(buf, FENCE))
                text = buf[:len(buf) - keep]
                if final and cut:  # a reply cut inside its opening tag: no markup in the content
                    text = text[:len(text) - _partial_tail(text, OPEN)]
                if not final:  # blanks wait: they may only separate calls
                    keep += len(text) - len(text.rstrip())
                    text = text.rstrip()
                elif not text.strip() and self._last == "call":
                    text = ""  # blanks after the last call
                content.append(self._text(text))
                self.buffer = buf[len(buf) - keep:]
                break
            block = self._block(buf, start, kind, final, cut)
            if block[0] in ("wait", "cut"):
                content.append(self._text(buf[:start].rstrip()))
                self.buffer = "" if block[0] == "cut" else buf[len(buf[:start].rstrip()):]
                break
            call = self._accept(block[2]) if block[0] == "call" else None
            if call is None:
                content.append(self._text(buf[:block[1]]))
            else:
                if buf[:start].strip() or self._last == "text":
                    content.append(self._text(buf[:start]))  # blanks between text and a call
                    if self.stopped:  # the text before the call ended the reply
                        break
                content.append(self._end_text())
                self.calls.append(call)
                calls.append(call)
                self._last = "call"
            self.buffer = buf[block[1]:]
            self._started = True
        if self.stopped:
            self.buffer = ""
        return "".join(content), calls

    def _text(self, text: str) -> str:
        """Content released: after it, a bare object is no call; blanks alone change nothing.
        The stop strings see it first: what a stop string may still begin is held back, and a
        match ends the reply (``stopped``)."""
        if text.strip():
            self._started, self._last = True, "text"
        out = self._stops.feed(text)
        if self._stops.hit:
            self.stopped = True
        return out

    def _end_text(self) -> str:
        """A call follows the content: the text held for a stop string is final (a stop string
        never spans a call)."""
        out = self._stops.finish()
        self._stops = StopMatcher(self._stop_strings)
        return out

    def _llama3(self, final: bool, cut: bool = False) -> tuple[str, list[ToolCall]]:
        buf = self.buffer
        if not self._started:
            head = buf.lstrip(" \t\r\n")
            if final and cut and head and PYTHON_TAG.startswith(head):
                self.buffer = ""
                return "", []  # cut inside the tag that opens a call
            if not head or (not final and PYTHON_TAG.startswith(head)):
                return ("", []) if not final else self._flush()
            self._started = True
            self._json = head.startswith("{") or head.startswith(PYTHON_TAG)
        if not self._json:
            return self._flush()
        if not final:
            return "", []  # a reply that is a call is parsed whole, at its end
        text = buf.lstrip(" \t\r\n")
        if text.startswith(PYTHON_TAG):
            text = text[len(PYTHON_TAG):]
        calls, i = [], _skip_space(text, 0)
        while i < len(text):
            try:
                obj, i = _DECODER.raw_decode(text, i)
            except json.JSONDecodeError:
                if cut:  # cut short inside a call: the whole calls before it stay
                    break
                return self._flush()
            call = self._accept(obj)
            if call is None:
                return self._flush()
            calls.append(call)
            i = _skip_space(text, i)
            if i < len(text) and text[i] == ";":  # Llama 3.x's separator of several calls
                i = _skip_space(text, i + 1)
        self.buffer = ""
        self.calls.extend(calls)
        return "", calls

    # the markers that end the text of each Command R7B block (None: outside the blocks; a plan
    # also ends where the answer or the calls begin, as llama-server reads it)
    _ENDS = {None: (THINK_OPEN, RESPONSE_OPEN, ACTION_OPEN),
             "plan": (THINK_CLOSE, RESPONSE_OPEN, ACTION_OPEN), "answer": (RESPONSE_CLOSE,)}

    def _cohere(self, final: bool, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """A Command R7B reply, block by block: the plan (its text and markers) and the answer
        (its text without them) are content, released as they come, text outside the blocks
        too; an action block hands out each call of its list as it closes (_action)."""
        content, calls = [], []
        while not self.stopped:
            buf = self.buffer
            if self._in == "action":
                new, end = self._action(buf, final, cut)
                if new:
                    if self._handed == 0:
                        content.append(self._end_text())
                    self._handed += len(new)
                    self.calls.extend(new)
                    calls.extend(new)
                    self._last = "call"
                if end is None:
                    break
                if end < 0:  # no call in it: the block is text
                    end = -end
                    content.append(self._text(buf[:end]))
                self._in, self.buffer = None, buf[end:]
                continue
            ends = self._ENDS[self._in]
            found = [(i, m) for i, m in ((buf.find(m), m) for m in ends) if i >= 0]
            if not found:
                keep = 0 if final else max(_partial_tail(buf, m) for m in ends)
                text = buf[:len(buf) - keep]
                if final and cut:  # cut inside a marker: no markup in the content
                    text = text[:len(text) - max(_partial_tail(text, m) for m in ends)]
                if self._in is None and not final:  # blanks wait: between blocks they are none
                    keep += len(text) - len(text.rstrip())
                    text = text.rstrip()
                elif self._in is None and not text.strip():
                    text = ""
                content.append(self._text(text))
                self.buffer = buf[len(buf) - keep:]
                break
            at, marker = min(found)
            text = buf[:at]
            if self._in is None and not text.strip():
                text = ""  # blanks between blocks
            content.append(self._text(text))
            if self.stopped:
                break
            if marker in (THINK_OPEN, THINK_CLOSE):  # the plan stays content, markers and all
                content.append(self._text(marker))
            self.buffer = buf[at:] if marker == ACTION_OPEN else buf[at + len(marker):]
            self._in = {THINK_OPEN: "plan", RESPONSE_OPEN: "answer",
                        ACTION_OPEN: "action"}.get(marker)
            self._handed = 0
        if self.stopped:
            self.buffer = ""
        return "".join(content), calls

    def _action(self, buf: str, final: bool, cut: bool) -> tuple[list[ToolCall], int | None]:
        """The action block ``buf`` opens with: its calls not handed out yet, in order, up to
        the first item that is not a valid call, and where the block ends: None while it is
        open, -end when it holds no call (then it is text), else end. A block cut short, or
        ended without its closing marker, ends at the reply's end."""
        i = _skip_space(buf, len(ACTION_OPEN))
        new: list[ToolCall] = []
        close, bad, k = None, i < len(buf) and buf[i] != "[", 0
        i += 1
        while not bad and i < len(buf):
            i = _skip_space(buf, i)
            if buf.startswith("]", i):
                close = i + 1
                break
            try:
                obj, i = _DECODER.raw_decode(buf, i)
            except json.JSONDecodeError:
                break  # not whole yet
            if k >= self._handed:
                call = self._accept(obj)
                if call is None:
                    bad = True
                    break
                new.append(call)
            k += 1
            i = _skip_space(buf, i)
            if buf.startswith(",", i):
                i += 1
            elif buf.startswith("]", i):
                close = i + 1
                break
            else:
                bad = i < len(buf)
                break
        some = bool(self._handed or new)
        if close is not None and not bad:
            j = _skip_space(buf, close)
            if buf.startswith(ACTION_CLOSE, j):
                return new, (j + len(ACTION_CLOSE)) * (1 if some else -1)
            if not final and ACTION_CLOSE.startswith(buf[j:]):
                return new, None  # the closing marker is on its way
            end = len(buf) if ACTION_CLOSE.startswith(buf[j:]) else close
            return new, end if some else -end
        if bad:  # the list ends here: the block ends at its closing marker
            j = buf.find(ACTION_CLOSE)
            if j < 0 and not final:
                return new, None
            end = len(buf) if j < 0 else j + len(ACTION_CLOSE)
            return new, end if some else -end
        if not final:
            return new, None
        # the reply ended inside the list: the whole calls stay; cut short before any, nothing
        # (no half call, no markup); else the block is text
        return new, len(buf) if some or cut else -len(buf)

    def _generic(self, final: bool, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """A generic reply: the response's text as far as it is decoded, the calls of a
        ``tool_calls`` list as each one closes, the rest at the end (a reply cut short: the text
        and the whole calls before the cut)."""
        buf = self.buffer
        response = _RESPONSE.match(buf)
        many = _CALLS.match(buf)
        if not final:
            if response:
                return self._say(_string_prefix(buf, response.end())), []
            return "", (self._new_calls(buf, many.end()) if many else [])
        self.buffer = ""
        head = _skip_space(buf, 0)
        try:
            obj, end = _DECODER.raw_decode(buf, head)
            whole = not buf[end:].strip()
        except json.JSONDecodeError:
            obj, whole = None, False
        if whole and isinstance(obj, dict) and len(obj) == 1:
            key, value = next(iter(obj.items()))
            if key == "response":
                return self._say(value if isinstance(value, str) else
                                 json.dumps(value, ensure_ascii=False)), []
            call = self._accept(value) if key == "tool_call" else None
            if call is not None:
                self.calls.append(call)
                return "", [call]
            if key == "tool_calls" and many and isinstance(value, list) and value and \
                    all(self._accept(x) is not None for x in value):
                return "", self._new_calls(buf, many.end())
        if cut and response:
            return self._say(_string_prefix(buf, response.end())), []
        new = self._new_calls(buf, many.end()) if cut and many else []
        if new or self.calls:  # the whole calls before the cut; what follows them is no content
            return "", new
        # not a generic reply, or one cut short before its first call was whole (the model
        # ran out of tokens writing it): its text as it is, as llama-server answers a reply it
        # cannot parse, rather than an empty answer
        return self._say(buf), []

    def _say(self, text: str) -> str:
        """The response text so far: its part not yet handed out, through the stop strings."""
        if not text.startswith(self._said):  # not expected: the text grows at its end
            return ""
        new, self._said = text[len(self._said):], text
        return self._text(new)

    def _new_calls(self, buf: str, i: int) -> list[ToolCall]:
        """The whole calls of the ``tool_calls`` list opening at ``buf[i]`` that were not handed
        out yet; a call that does not validate ends the list."""
        new: list[ToolCall] = []
        k = 0  # the list's item at i
        while True:
            i = _skip_space(buf, i)
            try:
                obj, i = _DECODER.raw_decode(buf, i)
            except json.JSONDecodeError:
                break  # not whole yet
            if k >= len(self.calls):
                call = self._accept(obj)
                if call is None:
                    break
                new.append(call)
            k += 1
            i = _skip_space(buf, i)
            if not buf.startswith(",", i):
                break
            i += 1
        self.calls.extend(new)
        return new

    def _flush(self) -> tuple[str, list[ToolCall]]:
        out, self.buffer = self.buffer, ""
        return self._text(out), []


_RESPONSE = re.compile(r'\s*\{\s*"response"\s*:\s*"')  # a generic reply's text opens
_CALLS = re.compile(r'\s*\{\s*"tool_calls"\s*:\s*\[')  # a generic reply's calls open
_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")


def _string_prefix(text: str, i: int) -> str:
    """The decoded value of the JSON string whose text starts at ``text[i]`` (after its opening
    quote), as far as it is whole: up to its closing quote, else without an escape the text
    ends inside (a ``\\uD83D`` waiting for its low surrogate included)."""
    j, n = i, len(text)
    while j < n and text[j] != '"':
        if text[j] == "\\":
            if j + 1 >= n or (text[j + 1] == "u" and j + 6 > n):
                break  # an escape the text ends inside
            j += 6 if text[j + 1] == "u" else 2
        else:
            j += 1
    raw = text[i:min(j, n)]
    if (j >= n or text[j] != '"') and _HIGH_SURROGATE.search(raw):  # open: the pair may follow
        raw = raw[:-6]
    try:
        return json.loads('"' + raw + '"')
    except json.JSONDecodeError:  # not JSON (a raw control character): as far as it is
        return ""


def _partial_tail(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
