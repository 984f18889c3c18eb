"""Text around the token loop: incremental UTF-8, stop strings, chat templates.

Streamed text is released only when it is final: whole UTF-8 characters (bytes that are not valid
UTF-8, and an unfinished character at the very end, become U+FFFD, as Python's
``errors="replace"``), never a piece that could still be the start of a stop string.
"""
from __future__ import annotations

import bisect
import codecs
from typing import Any, Mapping, Sequence

__all__ = ["StopMatcher", "TextStream", "render_chat", "typed_as_template_reads", "continued_text",
           "columns"]


class StopMatcher:
    """Stop strings across token boundaries, without ever releasing text a stop string may start.

    ``text`` is everything fed so far, cut before the earliest stop string once one matched
    (``hit``); ``released`` is how much of it has been handed out.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.text = ""
        self.released = 0
        self.hit = False
        self.matched: str | None = None  # the stop string that matched

    def feed(self, piece: str) -> str:
        """Add text; return what is now safe to stream (never part of a stop string)."""
        self.text += piece
        if not self.stops:
            out, self.released = self.text[self.released:], len(self.text)
            return out
        search_from = max(0, self.released - self.longest + 1)
        cut = None
        for s in self.stops:
            j = self.text.find(s, search_from)
            if j != -1 and (cut is None or j < cut):
                cut = j
        if cut is not None:
            self.hit = True
            self.matched = next(s for s in self.stops if self.text.startswith(s, cut))
            self.text = self.text[:cut]
            return self.finish()
        hold = 0  # longest tail of the text that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text) - self.released), hold, -1):
                if self.text.endswith(s[:n]):
                    hold = n
                    break
        safe = len(self.text) - hold
        out, self.released = self.text[self.released:safe], safe
        return out

    def finish(self) -> str:
        """Release everything held back."""
        out, self.released = self.text[self.released:], len(self.text)
        return out


class TextStream:
    """Token bytes in, final text out: an incremental UTF-8 decoder in front of a StopMatcher.

    Each token's bytes may carry a tag (e.g. where the token came from: an accepted draft or the
    verifier); ``take_segments()`` returns the text released since its last call as (text, tag)
    runs, each character tagged with the token that completed it.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopMatcher(stops)
        self._starts: list[int] = []  # character offsets where a tag's run begins
        self._tags: list = []
        self._given = 0  # characters handed out through take_segments

    @property
    def text(self) -> str:
        """All text so far (cut before a matched stop string)."""
        return self._stops.text

    @property
    def stopped(self) -> bool:
        """A stop string has matched: nothing more is released."""
        return self._stops.hit

    @property
    def matched_stop(self) -> str | None:
        """The stop string that matched, if one did."""
        return self._stops.matched

    def feed(self, data: bytes, tag=None) -> str:
        """The bytes of one token; returns the text that became final."""
        decoded = self._utf8.decode(data)
        if decoded:
            self._starts.append(len(self._stops.text))
            self._tags.append(tag)
        return self._stops.feed(decoded)

    def finish(self) -> str:
        """End of generation: the bytes of an unfinished character (U+FFFD), then any text held
        for stop strings. Returns what had not been released."""
        if self._stops.hit:
            return ""
        tail = self._utf8.decode(b"", final=True)  # the bytes of an unfinished character
        if tail:
            self._starts.append(len(self._stops.text))
            self._tags.append(self._tags[-1] if self._tags else None)
        piece = self._stops.feed(tail)
        return piece if self._stops.hit else piece + self._stops.finish()

    def take_segments(self) -> list[tuple[str, object]]:
        """The text released since the last call, as (text, tag) runs."""
        a, b = self._given, self._stops.released
        self._given = b
        out: list[tuple[str, object]] = []
        i = max(0, bisect.bisect_right(self._starts, a) - 1)
        while a < b and i < len(self._starts):
            end = min(b, self._starts[i + 1] if i + 1 < len(self._starts) else b)
            if end > a:
                out.append((self._stops.text[a:end], self._tags[i]))
                a = end
            i += 1
        return out


def render_chat(template: str | None, messages: Sequence[dict], *, bos: str, eos: str,
                model_name: str = "the model", add_generation_prompt: bool = True,
                variables: Mapping[str, Any] | None = None) -> str:
    """``messages`` ([{"role": ..., "content": ...}]) rendered with a chat template (a GGUF's
    Jinja template, or a built-in one by name: templates.py), ending with the assistant's turn
    opened (``add_generation_prompt``; False: ending with the last message); ``variables`` are
    given to the template too (``enable_thinking`` from ``--reasoning``, a request's
    ``chat_template_kwargs``: Engine.template_variables).

    Raises InputError when there is no template or a message is malformed.
    """
    from ..errors import InputError
    from .templates import apply_template

    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InputError(f"messages must be a list of {{\"role\": ..., \"content\": ...}} dicts, got "
                         f"{type(messages).__name__}", param="messages")
    if not template:
        raise InputError(f"{model_name} has no chat template (tokenizer.chat_template): use a "
                         "plain prompt instead of chat")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or (
                not isinstance(m.get("content"), str) and _texts(m.get("content")) is None):
            raise InputError(f"message {i} must be {{\"role\": str, \"content\": str or a list of "
                             f"text parts}}, got {m!r}"[:200])
    return apply_template(template, typed_as_template_reads(template, messages, bos=bos, eos=eos),
                          bos=bos, eos=eos, add_generation_prompt=add_generation_prompt,
                          **(variables or {}))


def _texts(content) -> list[str] | None:
    """The texts of a list of text parts (``[{"type": "text", "text": ...}]``); None for any
    other value."""
    if not isinstance(content, list) or not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return None
    return [p["text"] for p in content]


def typed_as_template_reads(template: str, messages: Sequence[dict], *, bos: str = "",
                            eos: str = "") -> list[dict]:
    """``messages`` with each content as ``template`` takes it (templates.content_kinds), as
    llama-server hands them over: text parts stay a list for a template that reads typed
    content and are joined with newlines for one that takes text only; text becomes one text
    part for a template that takes parts only."""
    from .templates import content_kinds

    typed = [_texts(m.get("content")) is not None for m in messages]
    text_ok, parts_ok = content_kinds(template, bos=bos, eos=eos)
    if (text_ok or not messages) and not (any(typed) and not parts_ok):
        return list(messages)  # (nothing to change)
    out = []
    for m, is_list in zip(messages, typed):
        content = m.get("content")
        if is_list and not parts_ok:
            content = "\n".join(_texts(content))
        elif not is_list and not text_ok:
            content = [{"type": "text", "text": content}]
        out.append({**m, "content": content})
    return out


def continued_text(content: str | list | None) -> str:
    """What a continued (prefilled) assistant message adds after the opened assistant turn: its
    text, or its text parts joined by a blank line, as llama-server continues one."""
    texts = _texts(content)
    return "\n\n".join(texts) if texts is not None else (content or "")


def columns(rows: Sequence[Sequence[str]], right: bool = False) -> list[str]:
    """Rows of cells as aligned text lines, columns two spaces apart (left-aligned, or
    right-aligned with ``right``); the first row is usually the header."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    pad = str.rjust if right else str.ljust
    return ["  ".join(pad(c, w) for c, w in zip(r, widths)).rstrip() for r in rows]
