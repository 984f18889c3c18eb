"""Tool calls on ``/v1/chat/completions``: OpenAI's ``tools``, ``tool_choice`` and
``parallel_tool_calls``, assistant messages with ``tool_calls`` and ``tool`` messages in the
history, and the reply's calls as OpenAI sends them (``message.tool_calls``, streamed
``delta.tool_calls`` with index / id / function name / arguments, ``finish_reason``
``"tool_calls"``).

The prompt, the calling conventions and the grammar are cactus_gguf/prompting/toolcalls.py's,
the parser toolparse.py's;
this module validates the request, prepares the engine request (the prompt rendered with the
GGUF's template and its tools, the calls' grammar unless ``tool_choice`` is ``none``) and shapes
the reply. Speculation stays on: the grammar constrains the draft, the acceptance test and the
residual alike (docs/server.md "Structured output").
"""
from __future__ import annotations

import codecs
import json
import re
from typing import Any, Generic, Literal, TypeVar, Union

import llama_cpp
from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import InputError
from ..sampling.constraints import grammar_spec
from ..prompting.toolparse import ToolCallParser
from ..prompting.toolcalls import (GENERIC, ToolFormat, arguments_schema,
                                   render_with_tools, special_markup, tool_format, tool_grammar)
from .schemas import reasoning_of

__all__ = ["ToolPlan", "ToolReply"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's function names
_F = TypeVar("_F")


class _Strict(BaseModel):
    """A part of a request: unknown fields and coerced values are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class _Function(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class _Named(_Strict):
    name: str


class _OfFunction(_Strict, Generic[_F]):
    """OpenAI's ``{"type": "function", "function": {...}}`` around a function's model."""

    type: Literal["function"]
    function: _F


class _Tool(_OfFunction[_Function]):
    """One of ``tools``."""


class _NamedChoice(_OfFunction[_Named]):
    """A ``tool_choice`` that names the function to call."""


class _CalledFunction(_Strict):
    name: str
    arguments: str


class _Call(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _CalledFunction


def _validated(model, value, field: str):
    """``value`` validated as the pydantic ``model``; InputError naming ``field`` and the place
    inside it at fault (``tools.0.function.name``)."""
    try:
        return model.model_validate(value)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        name = f"{field}.{where}" if where else field
        raise InputError(f"{name}: {first['msg']}", param=name) from None


def _text(content, field: str) -> str:
    """A message's content as text: a string, text parts, or nothing."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if part.type != "text" or part.text is None:
            raise InputError(f"{field}: only text parts are supported, got {part.type!r}",
                             param=field)
        parts.append(part.text)
    return "".join(parts)


class ToolPlan:
    """A chat request that involves tools: its tools, choice, and history with calls.

    Made by :meth:`of` from the body alone (InputError for malformed tools, choice or history);
    :meth:`prepare` then needs the engine's model: the prompt from its chat template, and the
    engine Request with the calls' grammar."""

    def __init__(self, tools: list[dict], choice: Union[str, dict], parallel: bool,
                 messages: list[dict], constrained_by: str | None) -> None:
        self.tools, self.choice, self.parallel = tools, choice, parallel
        self.messages = messages
        self.constrained_by = constrained_by  # the body's own output constraint, if any
        self.format: ToolFormat | None = None  # known after prepare()
        self.template_kwargs: dict | None = None  # the body's chat_template_kwargs (of())
        # the request's stop strings: the content's, never a call's (ToolCallParser), so the
        # engine runs without them when calls are allowed (prepare())
        self.stops: tuple[str, ...] = ()
        # the convention's markup that is one control token (prepare()): id -> its text,
        # written into the reply's text (the engine writes a control token as nothing)
        self.markup: dict[int, bytes] = {}
        self._piece = None  # the model's token_to_piece (prepare())

    @property
    def calls_allowed(self) -> bool:
        return bool(self.tools) and self.choice != "none"

    @property
    def parsed(self) -> bool:
        """Whether the reply goes through the parser: calls may come, or (the generic format,
        after prepare()) the reply is JSON even when they may not (its ``response``)."""
        return self.calls_allowed or (bool(self.tools) and self.format is not None
                                      and self.format.kind == GENERIC)

    @classmethod
    def of(cls, body) -> "ToolPlan | None":
        """The plan of a ChatCompletionRequest, or None when it has no tools and no message
        carries a call or a call's result (a plain chat)."""
        extra = body.model_extra or {}
        raw_tools = extra.get("tools")
        history = any(m.role == "tool" or (m.model_extra or {}).get("tool_calls")
                      for m in body.messages)
        # null is the field left out (llama-server's and OpenAI's clients send it so)
        choice_given = extra.get("tool_choice") is not None
        if raw_tools is not None and not isinstance(raw_tools, list):
            raise InputError(f"tools must be a list of tools, got {type(raw_tools).__name__}",
                             param="tools")
        if raw_tools == []:  # no tools, as llama-server reads it (OpenAI refuses it)
            raw_tools = None
        if not raw_tools and not history and not choice_given and \
                extra.get("parallel_tool_calls") is None:
            return None
        tools = [_validated(_Tool, t, f"tools.{i}").model_dump(exclude_none=True)
                 for i, t in enumerate(raw_tools or [])]
        names = [t["function"]["name"] for t in tools]
        for i, name in enumerate(names):
            if not _NAME.match(name):
                raise InputError(f"tools.{i}.function.name must be 1-64 letters, digits, _ or -, "
                                 f"got {name!r}"[:160], param=f"tools.{i}.function.name")
            if name in names[:i]:
                raise InputError(f"tools.{i}.function.name {name!r} is given twice",
                                 param=f"tools.{i}.function.name")
            _check_parameters(tools[i]["function"], f"tools.{i}.function.parameters")
        choice = extra.get("tool_choice")
        choice = "auto" if choice is None else choice
        if choice_given and not tools:
            raise InputError("tool_choice needs tools", param="tool_choice")
        if isinstance(choice, dict):
            named = _validated(_NamedChoice, choice, "tool_choice").function.name
            if named not in names:
                raise InputError(f"tool_choice names {named!r}, which is not among the tools "
                                 f"({', '.join(names)})"[:200], param="tool_choice")
            choice = {"type": "function", "function": {"name": named}}
        elif choice not in ("auto", "none", "required"):
            raise InputError(f'tool_choice must be "auto", "none", "required" or {{"type": '
                             f'"function", "function": {{"name": ...}}}}, got {choice!r}'[:200],
                             param="tool_choice")
        parallel = extra.get("parallel_tool_calls")
        parallel = True if parallel is None else parallel
        if not isinstance(parallel, bool):
            raise InputError(f"parallel_tool_calls must be a boolean, got {parallel!r}"[:80],
                             param="parallel_tool_calls")
        rf = body.response_format
        constrained_by = ("response_format" if rf is not None and rf.type != "text" else
                          "grammar" if body.grammar is not None else
                          "json_schema" if body.json_schema is not None else None)
        plan = cls(tools, choice, parallel, _messages(body), constrained_by)
        plan.template_kwargs = body.chat_template_kwargs
        return plan

    def prepare(self, engine, req):
        """(prompt text, Request) for the engine: the messages rendered with the GGUF's chat
        template and the tools (a template that never reads them: the generic format's system
        message), and ``req`` with the reply's grammar (tool_choice "none": text that opens no
        call). InputError: no template, a request that also gives its own output
        constraint."""
        model = engine.verifier.model
        template = model.chat_template()
        if self.tools:
            self.format = tool_format(template, lambda text: _is_special(model, text))
            self._piece = model.token_to_piece
            for text in special_markup(self.format):
                token = model.tokenize(text, add_special=False, parse_special=True)[0]
                if not model.token_to_piece(token):  # a control token: the text leaves it out
                    self.markup[token] = text.encode()
            if self.constrained_by:
                raise InputError(f"{self.constrained_by} cannot be combined with tools: the "
                                 "reply has the tool calls' grammar (leave the tools out)",
                                 param=self.constrained_by)
        elif not template:
            raise InputError("this model has no chat template (tokenizer.chat_template): use "
                             "/v1/completions with a plain prompt", param="messages")
        # the tools stay in the prompt under tool_choice "none" (the grammar then allows no
        # call), so a conversation's turns share their prefix in the KV cache
        prompt = render_with_tools(
            template, self.messages, self.tools or None,
            bos=model.token_text(model.bos).decode("utf-8", "replace"),
            eos=model.token_text(model.eos).decode("utf-8", "replace"),
            variables=engine.template_variables(self.template_kwargs), fmt=self.format,
            parallel=self.parallel)
        if self.tools:
            grammar = tool_grammar(self.format, self.tools, self.choice, self.parallel)
            try:
                req = req.replace(grammar=grammar)
            except InputError as e:  # each tool's parameters compiled alone (of()): not expected
                why = str(e).split("%llguidance")[0].split("%json")[0].strip()[:200]
                raise InputError(f"tools: the tools' parameters compile one by one but not "
                                 f"together into the calls' grammar: {why}",
                                 param="tools") from None
        if self.parsed and req.stop:
            # stop strings end the content, never a call (they would cut its markup or its
            # arguments): the parser applies them to the content, and the reply ends the job
            self.stops, req = tuple(req.stop), req.replace(stop=())
        return prompt, req

    def reply(self) -> "ToolReply | None":
        """The reply's shaper (after prepare), or None when the reply is plain text."""
        if not self.parsed:
            return None
        return ToolReply(ToolCallParser(self.format, self.tools, self.stops), self.markup,
                         self._piece)


def _check_parameters(function: dict, field: str) -> None:
    """A function's ``parameters`` must describe an object (OpenAI's rule: a call's arguments
    are a JSON object) and be a JSON schema the grammar engine enforces; InputError naming
    ``field`` otherwise, on one line."""
    params = function.get("parameters")
    if params is None:
        return  # no parameters: the function takes none
    kind = params.get("type", "object")
    if kind != "object":
        raise InputError(f"{field} must be a JSON schema of an object (\"type\": \"object\", "
                         f"with the arguments as its properties), got \"type\": "
                         f"{json.dumps(kind)[:40]}: put the value in a property, e.g. "
                         f"{{\"type\": \"object\", \"properties\": {{\"value\": ...}}}}",
                         param=field)
    try:
        grammar_spec("json_schema", json.dumps(arguments_schema(function)))
    except InputError as e:
        # grammar_spec's message names its own field ("json_schema: the JSON schema is ...")
        why = str(e).removeprefix("json_schema: ").removeprefix("the JSON schema is invalid: ")
        raise InputError(f"{field} ({function['name']}) is not a JSON schema this server can "
                         f"enforce: {why}"[:300], param=field) from None


def _is_special(model, text: str) -> bool:
    """Whether ``text`` is one token the grammar engine sees as special (llguidance's rule for a
    llama.cpp vocabulary: a control token, or a user-defined one written ``<...>``)."""
    ids = model.tokenize(text, add_special=False, parse_special=True)
    if len(ids) != 1:
        return False
    attr = model.token_attr(ids[0])
    return bool(attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL or (
        attr & llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED and text.startswith("<")
        and text.endswith(">")))


def _messages(body) -> list[dict]:
    """The messages as chat templates take them: role, text content, and OpenAI's tool fields
    (assistant ``tool_calls``; a tool result's ``tool_call_id`` and ``name``)."""
    out = []
    call_ids: list[str] = []  # the ids of the calls made so far
    for i, m in enumerate(body.messages):
        extra = m.model_extra or {}
        msg: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                               "content": _text(m.content, f"messages.{i}.content"),
                               **reasoning_of(m, i)}
        calls = extra.get("tool_calls")
        if calls:
            if m.role != "assistant":
                raise InputError(f"messages.{i}.tool_calls: only an assistant message has tool "
                                 "calls", param=f"messages.{i}.tool_calls")
            if not isinstance(calls, list):
                raise InputError(f"messages.{i}.tool_calls must be a list",
                                 param=f"messages.{i}.tool_calls")
            msg["tool_calls"] = [_validated(_Call, c, f"messages.{i}.tool_calls.{j}")
                                 .model_dump(exclude_none=True) for j, c in enumerate(calls)]
            call_ids += [c["id"] for c in msg["tool_calls"] if "id" in c]
        if m.role == "tool":
            for key in ("tool_call_id", "name"):
                value = extra.get(key)
                if value is not None and not isinstance(value, str):
                    raise InputError(f"messages.{i}.{key} must be a string",
                                     param=f"messages.{i}.{key}")
                if value is not None:
                    msg[key] = value
            answered = msg.get("tool_call_id")
            if answered is not None and answered not in call_ids:
                made = (f"the calls made before it are {', '.join(call_ids)}"[:200] if call_ids
                        else "no assistant message before it has tool_calls")
                raise InputError(f"messages.{i}.tool_call_id {answered!r} answers no earlier tool "
                                 f"call ({made}): give the id of the assistant's call it answers"
                                 [:300], param=f"messages.{i}.tool_call_id")
        out.append(msg)
    return out


class ToolReply:
    """The reply of a request whose model may call tools: content and calls parsed as the text
    comes (ToolCallParser), shaped as OpenAI's message or streamed deltas.

    A stop string that ends the content (``stopped``) ends the reply: ``on_stop()`` (set by the
    server: it ends the job) is called once, later text is ignored, and the finish reason is
    "stop" ("tool_calls" when calls came before). A reply cut short (finish reason "length")
    drops the call it ends inside: no half call, and no markup in the content (the generic
    format's reply cut inside its first call: its JSON text, ToolCallParser)."""

    def __init__(self, parser: ToolCallParser, markup: dict[int, bytes] | None = None,
                 piece=None) -> None:
        self.parser = parser
        self.markup = markup or {}  # special tokens written into the text (text_of)
        self._piece = piece
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.n_calls = 0
        self.on_stop = lambda: None
        self._told = False
        self._taken: tuple[list[str], list] | None = None  # take()'s content and calls

    @property
    def called(self) -> bool:
        return self.n_calls > 0 or bool(self._taken and self._taken[1])

    @property
    def stopped(self) -> bool:
        return self.parser.stopped

    def finish_reason(self, finish: str) -> str:
        """The reply's finish_reason, from the engine's."""
        finish = "stop" if self.stopped else finish
        return "tool_calls" if self.called and finish == "stop" else finish

    def text_of(self, chunk) -> str:
        """An engine chunk's text as the parser reads it: with the convention's markup that is
        one control token (Command R7B's markers), which the engine's text leaves out, written
        in (llama-server's preserved tokens): the chunk's tokens decoded here."""
        return self._decode(chunk.tokens) if self.markup else chunk.text

    def _decode(self, tokens, final: bool = False) -> str:
        data = b"".join(self.markup.get(t) or self._piece(t) for t in tokens)
        return self._utf8.decode(data, final)

    def _feed(self, text: str):
        out = self.parser.feed(text)
        if self.parser.stopped and not self._told:
            self._told = True
            self.on_stop()
        return out

    def _calls(self, calls) -> list[dict]:
        out = [{"index": self.n_calls + i, **c.openai()} for i, c in enumerate(calls)]
        self.n_calls += len(calls)
        return out

    def delta(self, text: str | None, finish: str | None = None) -> dict:
        """A streamed chunk's delta for the next piece of text (None: the reply ended, with the
        engine's ``finish`` reason): the content that is final and the calls completed, ``{}``
        when everything is held back."""
        if text is None:
            content, calls = self._feed(self._decode((), True)) if self.markup else ("", [])
            more, rest = self.parser.finish(cut=finish == "length")
            content, calls = content + more, calls + rest
        else:
            content, calls = self._feed(text)
        out: dict[str, Any] = {}
        if content:
            out["content"] = content
        if calls:
            out["tool_calls"] = self._calls(calls)
        return out

    def take(self, text: str) -> str:
        """A reply that is not streamed, piece by piece as it comes (a stop string in the content
        ends it at once); returns ``text``. message() then shapes what was taken."""
        content, calls = self._feed(text)
        taken = self._taken = self._taken or ([], [])
        taken[0].append(content)
        taken[1].extend(calls)
        return text

    def take_chunk(self, chunk) -> str:
        """take() of an engine chunk's text (text_of)."""
        return self.take(self.text_of(chunk))

    def message(self, text: str, finish: str = "stop", tokens=None) -> dict:
        """The whole reply as OpenAI's assistant message (content None when there is only
        calls): ``text`` (its ``tokens`` decoded where markup is written in, text_of), unless
        take() had it piece by piece; ``finish``: the engine's finish reason."""
        if self._taken is None:
            if self.markup and tokens is not None:
                text = self._decode(tokens, True)
            content, calls = self._feed(text)
        else:
            if self.markup:  # a character the last chunk ended inside
                self.take(self._decode((), True))
            content, calls = "".join(self._taken[0]), self._taken[1]
            self._taken = None
        rest, more = self.parser.finish(cut=finish == "length")
        message: dict[str, Any] = {"role": "assistant", "content": (content + rest) or None}
        if calls or more:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"}
                                     for c in self._calls(calls + more)]
        else:
            message["content"] = content + rest
        return message
