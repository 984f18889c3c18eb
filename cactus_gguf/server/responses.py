"""OpenAI's Responses API over the request core, as llama-server serves it: ``POST
/v1/responses`` (streamed and not) and ``POST /v1/responses/input_tokens``, each also without
``/v1``.

A Responses body becomes a chat body: ``instructions`` is the system message; ``input`` is a
string (one user message) or a list of items: messages (``input_text`` / ``output_text`` parts or
a string; ``developer`` is ``system``), ``function_call`` items (the assistant's tool calls, joined
to the assistant message before them) and ``function_call_output`` items (``tool`` messages);
function ``tools`` (flat: ``name``, ``description``, ``parameters``) are chat tools;
``tool_choice`` (``auto`` / ``none`` / ``required`` / ``{"type": "function", "name"}``),
``max_output_tokens``, ``temperature``, ``top_p``, ``parallel_tool_calls`` map one to one. The
reply is a ``response`` object whose ``output`` holds a ``message`` item (``output_text``) and
one ``function_call`` item per call, ``status`` ``completed`` or ``incomplete``
(``incomplete_details.reason`` ``max_output_tokens``), and ``usage``; streamed, the Responses
events (``response.created``, ``response.output_item.added``, ``response.output_text.delta``,
``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``,
``response.completed``, also for a reply cut by ``max_output_tokens`` (llama-server's last event
whatever the finish, where OpenAI sends ``response.incomplete``; the response in it still says
``incomplete`` with the reason); ``error`` when the engine fails or the shutdown cuts the reply),
each with its ``sequence_number``. This server's ``speculative`` block rides along on the response.
llama-server's stream telemetry passes through: ``return_progress`` adds a
``response.in_progress`` event with ``prompt_progress`` per report of the prompt's processing,
``timings_per_token`` the ``timings`` on each chunk's last event; ``response.completed`` always
carries the ``timings``, as llama-server's.

Refused with a 400 rather than ignored, as llama-server does: ``previous_response_id`` (no
response is stored: send the whole conversation as ``input``), image and file inputs, tools other
than functions. Errors are OpenAI's JSON.
"""
from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal, Union

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from ..errors import InputError
from .http_errors import error_of
from .openai_api import converted_stream, count_tokens, start_chat
from .schemas import chat_request, given

__all__ = ["router", "ResponsesRequest"]

router = APIRouter()


class ResponsesRequest(BaseModel):
    """OpenAI's Responses body (module docstring); ``speculative`` is this server's."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: Union[str, list[dict[str, Any]]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    speculative: Any = None
    seed: int | None = None
    timings_per_token: bool | None = None  # llama-server's stream telemetry (chat bodies')
    return_progress: bool | None = None


def _parts_text(content, field: str) -> str:
    """A message item's text: a string, or input_text / output_text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(f"{field} must be a string or a list of text parts", param=field)
    out = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise InputError(f"{field}.{i}: only input_text and output_text parts with a text "
                             f"are supported, got {kind!r} (this server takes no media)",
                             param=f"{field}.{i}")
        out.append(part["text"])
    return "".join(out)


def chat_body(body: ResponsesRequest) -> dict:
    """The chat-completions body of a Responses body (module docstring). InputError naming the
    Responses field for what this server cannot take."""
    if body.previous_response_id:
        raise InputError("previous_response_id: this server stores no responses; send the "
                         "whole conversation as input items", param="previous_response_id")
    messages: list[dict] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
    items = [{"type": "message", "role": "user", "content": body.input}] \
        if isinstance(body.input, str) else body.input
    for i, item in enumerate(items):
        field = f"input.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InputError(f"{field}.role must be user, system, developer or assistant, "
                                 f"got {role!r}", param=f"{field}.role")
            text = _parts_text(item.get("content", ""), f"{field}.content")
            messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
                raise InputError(f"{field}: a function_call item needs call_id, name and "
                                 "arguments (strings)", param=field)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                last["content"] = last["content"] or None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise InputError(f"{field}: a function_call_output item needs call_id",
                                 param=f"{field}.call_id")
            output = item.get("output", "")
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else
                             _parts_text(output, f"{field}.output")})
        elif kind == "reasoning":
            continue  # an earlier reply's reasoning: not part of the prompt here
        else:
            raise InputError(f"{field}: items of type {kind!r} are not supported (message, "
                             "function_call, function_call_output)", param=f"{field}.type")
    out: dict[str, Any] = {"messages": messages, "stream": body.stream, **given(
        model=body.model, max_tokens=body.max_output_tokens, temperature=body.temperature,
        top_p=body.top_p, seed=body.seed, speculative=body.speculative,
        parallel_tool_calls=body.parallel_tool_calls, timings_per_token=body.timings_per_token,
        return_progress=body.return_progress)}
    if body.tools:
        tools = []
        for i, tool in enumerate(body.tools):
            if tool.get("type") != "function":
                raise InputError(f"tools.{i}: only function tools are supported, got "
                                 f"{tool.get('type')!r}", param=f"tools.{i}.type")
            tools.append({"type": "function", "function": {
                k: v for k, v in tool.items() if k in ("name", "description", "parameters",
                                                       "strict")}})
        out["tools"] = tools
    choice = body.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise InputError('tool_choice must be "auto", "none", "required" or {"type": '
                             '"function", "name": ...}', param="tool_choice")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif choice is not None:
        out["tool_choice"] = choice
    fmt = (body.text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {
            k: v for k, v in fmt.items() if k in ("name", "schema", "strict", "description")}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    return out


def _usage(result) -> dict:
    s = result.stats
    return {"input_tokens": s.n_prompt_tokens, "output_tokens": s.n_tokens,
            "total_tokens": s.n_prompt_tokens + s.n_tokens,
            "input_tokens_details": {"cached_tokens": s.n_prompt_tokens_reused},
            "output_tokens_details": {"reasoning_tokens": 0}}


class _Reply:
    """One response's objects: the response, its output items, and the stream's events."""

    def __init__(self, body: ResponsesRequest, model: str) -> None:
        self.body, self.model = body, model
        self.id = "resp_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.sequence = 0
        self.items: list[dict] = []  # the output so far
        self.text_item: dict | None = None  # the message item while its text streams

    def response(self, status: str, finish: str | None = None, result=None,
                 speculative=None) -> dict:
        b = self.body
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": status, "model": self.model, "output": self.items,
                "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if finish == "length"
                else None,
                "instructions": b.instructions, "max_output_tokens": b.max_output_tokens,
                "parallel_tool_calls": b.parallel_tool_calls is not False,
                "previous_response_id": None, "temperature": b.temperature,
                "top_p": b.top_p, "tool_choice": b.tool_choice or "auto",
                "tools": b.tools or [], "text": b.text or {"format": {"type": "text"}},
                "truncation": b.truncation or "disabled", "metadata": b.metadata or {},
                "store": False,
                "usage": _usage(result) if result is not None else None,
                "speculative": speculative}

    @staticmethod
    def _message(text: str, status: str) -> dict:
        return {"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": status,
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}

    @staticmethod
    def _call(call: dict) -> dict:
        return {"type": "function_call", "id": "fc_" + uuid.uuid4().hex,
                "call_id": call["id"], "name": call["function"]["name"],
                "arguments": call["function"]["arguments"], "status": "completed"}

    def whole(self, openai: dict, result) -> dict:
        """The response of an OpenAI chat response that was not streamed."""
        choice = openai["choices"][0]
        message = choice["message"]
        if message.get("content"):
            self.items.append(self._message(message["content"], "completed"))
        self.items.extend(self._call(c) for c in message.get("tool_calls") or [])
        finish = choice["finish_reason"]
        return self.response("incomplete" if finish == "length" else "completed", finish,
                             result, openai.get("speculative"))

    # -- streaming ---------------------------------------------------------------------------------

    def event(self, kind: str, **data) -> dict:
        self.sequence += 1
        return {"event": kind, "data": json.dumps({"type": kind,
                                                   "sequence_number": self.sequence, **data})}

    def start(self) -> list[dict]:
        return [self.event("response.created", response=self.response("in_progress")),
                self.event("response.in_progress", response=self.response("in_progress"))]

    def _end_text(self) -> list[dict]:
        item = self.text_item
        if item is None:
            return []
        self.text_item = None
        item["status"] = "completed"
        index = self.items.index(item)
        part = item["content"][0]
        return [self.event("response.output_text.done", item_id=item["id"], output_index=index,
                           content_index=0, text=part["text"]),
                self.event("response.content_part.done", item_id=item["id"],
                           output_index=index, content_index=0, part=part),
                self.event("response.output_item.done", output_index=index, item=item)]

    def progress(self, openai_chunk: dict) -> list[dict]:
        """A ``prompt_progress`` chunk (``return_progress``) as llama-server sends it here: a
        ``response.in_progress`` event with the report (and the ``timings`` when asked)."""
        return [self.event("response.in_progress", response=self.response("in_progress"),
                           **_telemetry(openai_chunk))]

    def chunk(self, openai_chunk: dict) -> list[dict]:
        out = self._chunk(openai_chunk)
        extra = _telemetry(openai_chunk)
        if out and extra:  # llama-server's place for them: the chunk's last event
            data = json.loads(out[-1]["data"])
            out[-1] = {**out[-1], "data": json.dumps({**data, **extra})}
        return out

    def _chunk(self, openai_chunk: dict) -> list[dict]:
        out: list[dict] = []
        if not openai_chunk.get("choices"):
            return out
        delta = openai_chunk["choices"][0].get("delta") or {}
        if delta.get("content"):
            if self.text_item is None:
                self.text_item = self._message("", "in_progress")
                self.items.append(self.text_item)
                index = len(self.items) - 1
                out += [self.event("response.output_item.added", output_index=index,
                                   item={**self.text_item, "content": []}),
                        self.event("response.content_part.added", item_id=self.text_item["id"],
                                   output_index=index, content_index=0,
                                   part={"type": "output_text", "text": "",
                                         "annotations": []})]
            self.text_item["content"][0]["text"] += delta["content"]
            out.append(self.event("response.output_text.delta", item_id=self.text_item["id"],
                                  output_index=self.items.index(self.text_item),
                                  content_index=0, delta=delta["content"]))
        for call in delta.get("tool_calls") or []:  # whole calls (server/tools.py)
            out += self._end_text()
            item = self._call(call)
            self.items.append(item)
            index = len(self.items) - 1
            out += [self.event("response.output_item.added", output_index=index,
                               item={**item, "arguments": "", "status": "in_progress"}),
                    self.event("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=index, delta=item["arguments"]),
                    self.event("response.function_call_arguments.done", item_id=item["id"],
                               output_index=index, arguments=item["arguments"]),
                    self.event("response.output_item.done", output_index=index, item=item)]
        return out

    def end(self, last_chunk: dict, result) -> list[dict]:
        out = self._chunk(last_chunk) + self._end_text()
        finish = last_chunk["choices"][0]["finish_reason"]
        # llama-server's last event whatever the finish (its clients and the openai package's
        # stream helper wait for it; OpenAI sends response.incomplete for a cut reply): the
        # response in it still says incomplete, with the reason, as the whole one does
        status = "incomplete" if finish == "length" else "completed"
        out.append(self.event("response.completed", response=self.response(
            status, finish, result, last_chunk.get("speculative")),
            timings=last_chunk["timings"]))
        return out

    def error(self, e: BaseException, redact) -> list[dict]:
        return [self.event("error", code=getattr(e, "code", None) or "server_error",
                           message=redact(str(e)), param=getattr(e, "param", None))]


def _telemetry(openai_chunk: dict) -> dict:
    """llama-server's telemetry an OpenAI chunk carries (``timings``, ``prompt_progress``)."""
    return {k: openai_chunk[k] for k in ("timings", "prompt_progress") if k in openai_chunk}


@router.post("/v1/responses")
@router.post("/responses")
async def responses(body: ResponsesRequest, request: HttpRequest):
    started = await start_chat(request, chat_request(chat_body(body)))
    if isinstance(started, Response):
        return started
    state = request.app.state
    job, shape = started.job, started.shape
    reply = _Reply(body, state.config.model_id)
    if body.stream:
        return converted_stream(started, request, reply.start(), reply.chunk, reply.end,
                                reply.error, reply.progress)
    return await started.watch.answer(
        lambda text, result: reply.whole(shape.response(text, result, job.stopped_by), result),
        lambda e: error_of(e, state.redact))


@router.post("/v1/responses/input_tokens")
@router.post("/responses/input_tokens")
async def responses_input_tokens(body: ResponsesRequest, request: HttpRequest):
    """The tokens of a Responses body's prompt (llama-server's answer shape)."""
    return {"object": "response.input_tokens",
            "input_tokens": await count_tokens(request, chat_request(chat_body(body)))}

