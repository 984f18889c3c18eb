"""The Anthropic Messages API over the request core, as llama-server serves it: ``POST
/v1/messages`` (streamed and not) and ``POST /v1/messages/count_tokens``.

A Messages body becomes a chat body (``system`` first; text blocks joined; ``tool_use`` blocks
become the assistant's ``tool_calls``, ``tool_result`` blocks ``tool`` messages, ahead of the
turn's text; ``tools``' ``input_schema`` is a function's ``parameters``; ``tool_choice`` ``auto`` /
``any`` / ``tool`` / ``none`` is OpenAI's ``auto`` / ``required`` / the named function / ``none``;
``stop_sequences`` are ``stop``), which runs through openai_api.start with speculation as every
chat does. The reply is Anthropic's message: ``text`` and ``tool_use`` content blocks,
``stop_reason`` ``end_turn`` / ``max_tokens`` / ``stop_sequence`` (with the ``stop_sequence``) /
``tool_use``, ``usage``; streamed, Anthropic's named events (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``, ``message_stop``; an
``error`` event when the engine fails or the server's shutdown cuts the reply). This server's
``speculative`` block rides along on the message (and on ``message_delta``).

An assistant's ``thinking`` blocks reach the chat template as the message's
``reasoning_content`` (a thinking template renders them, e.g. in ``<think>``).
Refused with a 400 rather than ignored: image and document blocks (this server takes no media).
``thinking`` is accepted as llama-server accepts it: a model that does not reason (none that this
server parses) answers without thinking blocks. Errors are Anthropic's JSON,
``{"type": "error", "error": {"type", "message"}}``, the message naming the field.
"""
from __future__ import annotations

import json
import uuid
from typing import Any, Literal, Union

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from ..errors import CactusError, InputError
from .http_errors import answering_route
from .native_api import stopping_word
from .openai_api import converted_stream, count_tokens, start_chat
from .schemas import chat_request, given

__all__ = ["router", "MessagesRequest"]

# Anthropic's error types by status
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
          500: "api_error", 503: "overloaded_error"}


def anthropic_error(status: int, message: str, headers=None) -> JSONResponse:
    return JSONResponse({"type": "error", "error": {"type": _TYPES.get(status, "api_error"),
                                                    "message": message}},
                        status_code=status, headers=headers)


def _error_of(e: BaseException, redact) -> JSONResponse:
    if not isinstance(e, CactusError):
        return anthropic_error(500, redact(f"{type(e).__name__}: {e}"))
    return anthropic_error(e.http_status, redact(str(e)),
                           headers={"Retry-After": "1"} if e.http_status == 503 else None)


def _from_openai(response: Response) -> Response:
    """An OpenAI error answer of the core (a refusal before the start) in Anthropic's shape."""
    if not isinstance(response, JSONResponse):
        return response  # a 499: the client left
    message = json.loads(response.body).get("error", {}).get("message", "")
    return anthropic_error(response.status_code, message,
                           headers={k: v for k, v in response.headers.items()
                                    if k.lower() == "retry-after"} or None)


# routes whose errors are Anthropic's JSON: an invalid body (naming the field), an input or
# engine error, anything unexpected (500, one line)
AnthropicRoute = answering_route(lambda message, field: anthropic_error(400, message), _error_of)


router = APIRouter(route_class=AnthropicRoute)


class _Block(BaseModel):
    """A content block: ``text``, ``tool_use``, ``tool_result`` (others: refused)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: Any = None
    tool_use_id: str | None = None
    content: Union[str, list["_Block"], None] = None


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["user", "assistant"]
    content: Union[str, list[_Block]]


class _Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class _ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(BaseModel):
    """Anthropic's Messages body (module docstring); ``speculative`` is this server's."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[_Message]  # none is a chat too, as llama-server serves it
    system: Union[str, list[_Block], None] = None
    max_tokens: int | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[_Tool] | None = None
    tool_choice: _ToolChoice | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    speculative: Any = None
    seed: int | None = None


def _text_of(blocks, field: str) -> str:
    """The text of a string or of text blocks; InputError for any other block."""
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for i, b in enumerate(blocks):
        if b.type != "text" or b.text is None:
            raise InputError(f"{field}.{i}: a {b.type!r} block is not supported here (this "
                             "server takes text, tool_use and tool_result blocks)",
                             param=f"{field}.{i}")
        parts.append(b.text)
    return "".join(parts)


def chat_body(body: MessagesRequest) -> dict:
    """The chat-completions body of a Messages body (module docstring). InputError naming the
    Messages field for what this server cannot take."""
    messages: list[dict] = []
    if body.system is not None:
        messages.append({"role": "system", "content": _text_of(body.system, "system")})
    for i, m in enumerate(body.messages):
        field = f"messages.{i}.content"
        if isinstance(m.content, str):
            messages.append({"role": m.role, "content": m.content})
            continue
        text, calls, results, thoughts = [], [], [], []
        for j, b in enumerate(m.content):
            if b.type == "text":
                text.append(b.text or "")
            elif b.type == "thinking":
                # an earlier reply's reasoning: the message's reasoning_content, the blocks
                # joined as llama-server joins them
                thinking = (b.model_extra or {}).get("thinking", "")
                if not isinstance(thinking, str):
                    raise InputError(f"{field}.{j}.thinking must be a string",
                                     param=f"{field}.{j}.thinking")
                thoughts.append(thinking)
            elif b.type == "tool_use" and m.role == "assistant":
                if not b.id or not b.name:
                    raise InputError(f"{field}.{j}: a tool_use block needs id and name",
                                     param=f"{field}.{j}")
                calls.append({"id": b.id, "type": "function", "function": {
                    "name": b.name, "arguments": json.dumps(b.input if b.input is not None
                                                            else {})}})
            elif b.type == "tool_result" and m.role == "user":
                if not b.tool_use_id:
                    raise InputError(f"{field}.{j}: a tool_result block needs tool_use_id",
                                     param=f"{field}.{j}")
                results.append({"role": "tool", "tool_call_id": b.tool_use_id,
                                "content": _text_of(b.content, f"{field}.{j}.content")})
            else:
                raise InputError(f"{field}.{j}: a {b.type!r} block is not supported in a "
                                 f"{m.role} message (this server takes text, tool_use from the "
                                 "assistant, tool_result from the user)", param=f"{field}.{j}")
        messages.extend(results)
        if text or calls or thoughts or not results:
            message: dict[str, Any] = {"role": m.role, "content": "".join(text) or
                                       (None if calls else "")}
            if calls:
                message["tool_calls"] = calls
            if thoughts:
                message["reasoning_content"] = "".join(thoughts)
            messages.append(message)
    out: dict[str, Any] = {"messages": messages, "stream": body.stream, **given(
        model=body.model, max_tokens=body.max_tokens, temperature=body.temperature,
        top_p=body.top_p, top_k=body.top_k, seed=body.seed, speculative=body.speculative)}
    if body.stop_sequences:
        out["stop"] = body.stop_sequences
    if body.tools is not None:
        out["tools"] = [{"type": "function", "function": {
            "name": t.name, **({"description": t.description} if t.description else {}),
            "parameters": t.input_schema}} for t in body.tools]
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise InputError("tool_choice: type \"tool\" needs the tool's name",
                                 param="tool_choice.name")
            out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.disable_parallel_tool_use:
            out["parallel_tool_calls"] = False
    return out


def _stop_reason(openai_finish: str, result) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence of a chat answer's finish_reason."""
    if openai_finish == "tool_calls":
        return "tool_use", None
    if openai_finish == "length":
        return "max_tokens", None
    word = stopping_word(result)
    return ("stop_sequence", word) if word else ("end_turn", None)


def _usage(result) -> dict:
    s = result.stats
    return {"input_tokens": s.n_prompt_tokens, "output_tokens": s.n_tokens,
            "cache_read_input_tokens": s.n_prompt_tokens_reused}


def _message_id() -> str:
    return "msg_" + uuid.uuid4().hex


def message_of(openai: dict, result, model: str) -> dict:
    """Anthropic's message of an OpenAI chat response (and the engine's result)."""
    choice = openai["choices"][0]
    message = choice["message"]
    content: list[dict] = []
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        content.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"] or "{}")})
    reason, sequence = _stop_reason(choice["finish_reason"], result)
    return {"id": _message_id(), "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": _usage(result), "speculative": openai.get("speculative")}


class _Events:
    """Anthropic's stream events of one reply, from the OpenAI chunks of the core."""

    def __init__(self, model: str) -> None:
        self.model, self.index, self.open = model, -1, None  # the open block's kind

    @staticmethod
    def event(kind: str, **data) -> dict:
        return {"event": kind, "data": json.dumps({"type": kind, **data})}

    def start(self, input_tokens: int) -> dict:
        return self.event("message_start", message={
            "id": _message_id(), "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 0}})

    def _close(self) -> list[dict]:
        if self.open is None:
            return []
        self.open = None
        return [self.event("content_block_stop", index=self.index)]

    def _begin(self, block: dict) -> list[dict]:
        out = self._close()
        self.index += 1
        self.open = block["type"]
        return out + [self.event("content_block_start", index=self.index, content_block=block)]

    def chunk(self, openai_chunk: dict) -> list[dict]:
        """The events of one OpenAI chunk's delta: text, and whole tool calls."""
        out: list[dict] = []
        if not openai_chunk.get("choices"):
            return out
        delta = openai_chunk["choices"][0].get("delta") or {}
        if delta.get("content"):
            if self.open != "text":
                out += self._begin({"type": "text", "text": ""})
            out.append(self.event("content_block_delta", index=self.index,
                                  delta={"type": "text_delta", "text": delta["content"]}))
        for call in delta.get("tool_calls") or []:
            fn = call.get("function") or {}
            if call.get("id"):  # a new call
                out += self._begin({"type": "tool_use", "id": call["id"],
                                    "name": fn.get("name", ""), "input": {}})
            if fn.get("arguments"):
                out.append(self.event("content_block_delta", index=self.index, delta={
                    "type": "input_json_delta", "partial_json": fn["arguments"]}))
        return out

    def end(self, last_chunk: dict, result) -> list[dict]:
        """The last chunk's events, the block's end, message_delta and message_stop."""
        out = self.chunk(last_chunk) + self._close()
        reason, sequence = _stop_reason(last_chunk["choices"][0]["finish_reason"], result)
        out.append(self.event("message_delta", delta={"stop_reason": reason,
                                                      "stop_sequence": sequence},
                              usage=_usage(result),
                              speculative=last_chunk.get("speculative")))
        out.append(self.event("message_stop"))
        return out

    def error(self, e: BaseException, redact) -> list[dict]:
        status = e.http_status if isinstance(e, CactusError) else 500
        return [self.event("error", error={"type": _TYPES.get(status, "api_error"),
                                           "message": redact(str(e))})]


@router.post("/v1/messages")
async def messages(body: MessagesRequest, request: HttpRequest):
    started = await start_chat(request, chat_request(chat_body(body), empty=True))
    if isinstance(started, Response):
        return _from_openai(started)
    state = request.app.state
    job, shape = started.job, started.shape
    model = state.config.model_id
    if body.stream:
        events = _Events(model)
        # the prompt's tokens: the prepared text, as the engine tokenizes it
        head = [events.start(len(state.worker.engine.tokenize(job.prompt)))]
        return converted_stream(started, request, head, events.chunk, events.end, events.error)
    return await started.watch.answer(
        lambda text, result: message_of(shape.response(text, result, job.stopped_by), result,
                                        model),
        lambda e: _error_of(e, state.redact))


@router.post("/v1/messages/count_tokens")
async def messages_count_tokens(body: MessagesRequest, request: HttpRequest):
    """The tokens of a Messages body's prompt (its template, system and tools)."""
    return {"input_tokens": await count_tokens(request, chat_request(chat_body(body), empty=True))}

