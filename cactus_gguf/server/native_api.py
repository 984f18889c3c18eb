"""llama-server's native endpoints over the same engine, with llama-server's field names, answer
shapes and errors (tools/server of the vendored llama.cpp: server-context.cpp, server-task.cpp).

``POST /completion`` (and ``/completions``): ``prompt`` as text, token ids, ids mixed with text
(``[12, "text", 34]``; BOS only before leading text) or ``{"prompt_string": ...}``; ``n_predict``
(-1 = no limit), ``stream``, ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed``, ``stop``,
``cache_prompt``, ``grammar``, ``json_schema``, ``n_probs``, ``post_sampling_probs``,
``return_tokens``, ``response_fields`` and this server's ``speculative`` object. The answer is
llama-server's object (``content``, ``tokens``, ``stop``, ``tokens_predicted``,
``tokens_evaluated``, ``generation_settings``, ``prompt``, ``stop_type``, ``stopping_word``,
``tokens_cached``, ``timings``, ``completion_probabilities``) plus the ``speculative`` block;
streamed, ``data:`` events of partial objects (each with its ``tokens``, and its tokens'
``completion_probabilities``), then the final one, and no ``[DONE]``, as llama-server.
``n_probs`` here reads the raw log-softmax (``logprob``, llama-server's default);
``post_sampling_probs`` true gives ``prob`` of q, the verifier's law after the request's warps
and grammar (server/logprobs.py).

``POST /tokenize`` (``content``, ``add_special`` false, ``parse_special`` true, ``with_pieces``),
``POST /detokenize`` (``tokens``), ``POST /apply-template`` (a chat body: ``{"prompt"}`` rendered with
the GGUF's template), ``GET /props`` (``default_generation_settings``, ``total_slots`` 1,
``model_alias``, ``model_path`` = the verifier's file name, never a path of this machine,
``chat_template``, ``bos_token``, ``eos_token``, ``modalities``, ``build_info``, plus this
server's default ``speculative`` settings); ``POST /props`` is llama-server's 501 without
``--props``.

Fields of ``/completion`` that change the answer and are not implemented here are a 400 naming
them unless they hold the value that changes nothing (schemas.py's list, shared with the OpenAI
endpoints: ``repeat_penalty`` 1, ``n_indent`` 0, ``t_max_predict_ms`` 0 or -1, ``min_keep`` 0,
``lora`` [], ...; and ``echo`` false, no media); ``id_slot`` -1 or 0 (one slot);
``n_keep``, ``n_discard``, ``n_cache_reuse``, ``sse_ping_interval``, ``verbose`` and
``t_max_prompt_ms`` change nothing here (no context shift; llama-server ignores the last two on
this endpoint) and are accepted. Errors are llama-server's JSON, ``{"error": {"code": 400,
"message": ..., "type": "invalid_request_error"}}``, the message naming the field, with a
``param`` as on the OpenAI endpoints.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import time
from typing import Any, Callable, ClassVar, Union

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict
from sse_starlette.sse import EventSourceResponse

from ..errors import CactusError, InputError
from ..options.rule import rule_of
from .core import NotReadyError, not_ready, stream, submit
from .http_errors import Refused, answering_route, llama_error, llama_error_of
from .logprobs import llama_probs
from .report import build_info, speculative_block, telemetry, timings
from .prompts import chat_prompt
from .schemas import ChatCompletionRequest, _Common, to_request
from .worker import Job

__all__ = ["router", "NATIVE_PATHS", "is_native", "llama_error", "LlamaCompletionRequest",
           "ready_engine"]

NATIVE_PATHS = frozenset({"/completion", "/completions", "/tokenize", "/detokenize",
                          "/apply-template", "/props", "/infill", "/slots"})  # fim.py, slots_api.py


def is_native(path: str) -> bool:
    """Whether ``path`` is one of llama-server's native routes (its errors, its key check)."""
    return path in NATIVE_PATHS or path.startswith("/slots/")

# routes whose errors are llama-server's JSON: an invalid body (naming the field), an input or
# engine error, anything unexpected (500, one line); an engine not ready: its Refused answer
LlamaRoute = answering_route(lambda message, field: llama_error(400, message, param=field),
                             llama_error_of)


router = APIRouter(route_class=LlamaRoute)

Mixed = Union[str, list[Union[int, str]]]  # text, token ids, or ids mixed with text


class PromptObject(BaseModel):
    """llama-server's ``{"prompt_string": ..., "multimodal_data": [...]}`` (no media here)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    prompt_string: Mixed
    multimodal_data: list[str] | None = None


class LlamaCompletionRequest(_Common):
    """llama-server's ``/completion`` body (module docstring); the sampling, stop, grammar and
    ``speculative`` fields are the OpenAI endpoints' (schemas.py)."""

    POST_SAMPLING_PROBS: ClassVar[bool] = False  # n_probs: the raw log-softmax, as llama-server

    # one prompt, or several (llama-server's batch: one answer each, as a JSON array)
    prompt: Union[Mixed, PromptObject, list[Union[str, list[Union[int, str]], PromptObject]]]
    n_probs: int | None = None
    post_sampling_probs: bool | None = None
    return_tokens: bool = False
    response_fields: list[str] | None = None


# /completion's own answer-changing fields not implemented here (the others, shared with the
# OpenAI endpoints: schemas.py), accepted at the value that changes nothing: (field, that value,
# its test)
_NEUTRAL = (
    ("echo", "false", lambda v: v is False),
    ("image_data", "[]", lambda v: v == []),
    ("multimodal_data", "[]", lambda v: v == []),
)


def _refused(body: LlamaCompletionRequest) -> None:
    """InputError naming the first field of ``body`` this server would have to ignore."""
    extra = body.model_extra or {}
    for name, neutral, is_neutral in _NEUTRAL:
        if extra.get(name) is not None and not is_neutral(extra[name]):
            raise InputError(f"{name} is not supported on /completion by this server (only "
                             f"{neutral}, which changes nothing), got "
                             f"{json.dumps(extra[name])[:40]}: leave it out", param=name)
    if isinstance(body.prompt, PromptObject) and body.prompt.multimodal_data:
        raise InputError("prompt.multimodal_data: this server takes no media", param="prompt")


def prompt_ids(engine, prompt) -> list[int]:
    """The token ids of a llama-server prompt (tokenize_mixed): text is tokenized as the OpenAI
    endpoints do (BOS where the model adds it, once), text after the first element without BOS,
    ids as they are. InputError (param prompt) for several prompts, none, or an id outside the
    vocabulary."""
    if isinstance(prompt, PromptObject):
        prompt = prompt.prompt_string
    if isinstance(prompt, str):
        return engine.tokenize(prompt)
    if not prompt:
        raise InputError("the prompt is empty", param="prompt")
    if all(isinstance(p, str) for p in prompt):  # llama-server: one prompt per string
        if len(prompt) != 1:
            raise InputError(f"only one prompt per request is supported, got {len(prompt)}",
                             param="prompt")
        return engine.tokenize(prompt[0])
    model, ids = engine.verifier.model, []
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            ids += engine.tokenize(p) if i == 0 else model.tokenize(p, add_special=False,
                                                                     parse_special=True)
        else:
            ids.append(p)
    _check_ids(ids, model.n_vocab, "prompt")  # before any llama.cpp call reads them
    return ids


def _stop_type(result, stopped_by: str) -> str:
    """llama-server's ``stop_type``: eos, word (a stop string), limit (n_predict, a full context,
    the request's time limit), none (cut short)."""
    if stopped_by == "timeout":
        return "limit"
    if stopped_by:
        return "none"
    return {"eos": "eos", "stop": "word", "length": "limit"}.get(result.stop_reason, "none")


def stopping_word(result) -> str:
    """The stop string that ended the text (session.py writes ``stop string 'WORD'`` into the
    message, its repr), else ""."""
    import ast

    head = "stop string "
    if result.stop_reason != "stop" or not result.message.startswith(head):
        return ""
    try:
        return ast.literal_eval(result.message[len(head):])
    except (ValueError, SyntaxError):
        return ""


def response_fields(obj: dict, paths: list[str]) -> dict:
    """llama-server's ``response_fields`` (json_get_nested_values): each path that exists, keyed
    by the path itself (``"timings/prompt_n"``: what llama.vim reads); a missing one is left
    out."""
    out = {}
    for path in paths:
        value, found = obj, True
        for key in path.split("/"):
            if isinstance(value, dict) and key in value:
                value = value[key]
            else:
                found = False
                break
        if found:
            out[path] = value
    return out


def generation_settings(req, stream: bool = False, biases=()) -> dict:
    """llama-server's ``generation_settings`` (task_params::to_json) of a Request: its warps and
    limits, and the samplers it does not have at the values that leave them off. ``biases``: the
    request's logit bias as (token id, bias) entries (Engine.logit_biases), a ban's -inf as
    null (JSON has no infinity; llama-server's JSON writes null too)."""
    return {"seed": req.seed, "temperature": req.temperature, "top_k": req.top_k,
            "top_p": req.top_p, "min_p": req.min_p, "n_predict": req.n_predict,
            "max_tokens": req.n_predict, "stream": stream, "stop": list(req.stop),
            "n_probs": req.n_probs or 0, "post_sampling_probs": req.post_sampling_probs,
            "cache_prompt": req.cache_prompt,
            "samplers": ["top_k", "top_p", "min_p", "temperature"],
            "dynatemp_range": 0.0, "top_n_sigma": -1.0, "xtc_probability": 0.0,
            "typical_p": 1.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "dry_multiplier": 0.0, "mirostat": 0, "min_keep": 0,
            "ignore_eos": req.ignore_eos, "n_keep": 0, "grammar": req.grammar or "",
            "timings_per_token": req.timings_per_token,
            "logit_bias": [{"bias": None if math.isinf(b) else b, "token": t} for t, b in biases],
            "json_schema": json.loads(req.json_schema) if req.json_schema else None}


class _Completion:
    """llama-server's completion objects for one ``/completion`` request (server-task.cpp:
    to_json_non_oaicompat), with this server's ``speculative`` block. ``id_slot``: the slot
    its generation runs on (the job's, once started)."""

    id_slot = 0

    def __init__(self, body: LlamaCompletionRequest, req, model_id: str, prompt_text: str,
                 n_prompt: int, speculative: Callable[[Any], dict], biases=()) -> None:
        self.body, self.req, self.model_id, self.biases = body, req, model_id, biases
        self.prompt_text, self.n_prompt, self.speculative = prompt_text, n_prompt, speculative
        self.sent = 0  # tokens the partial objects carried

    def _probs(self, logprobs) -> dict:
        if self.req.n_probs is None or not logprobs:
            return {}
        return {"completion_probabilities": llama_probs(logprobs, self.req.post_sampling_probs)}

    def partial(self, text: str, tokens, logprobs=(), segments=None) -> dict:
        """One streamed event: its text, its tokens (as llama-server, whatever return_tokens)."""
        self.sent += len(tokens)
        out = {"index": 0, "content": text, "tokens": list(tokens), "stop": False,
               "id_slot": self.id_slot,
               "tokens_predicted": self.sent, "tokens_evaluated": self.n_prompt,
               **self._probs(logprobs)}
        if segments is not None:  # which characters came from accepted drafts, which from q
            out["speculative"] = {"segments": [[t, src] for t, src in segments]}
        return out

    def progress(self, p) -> dict:
        """The streamed event of a prompt-processing report ``p`` (``return_progress``): an
        empty partial object with ``prompt_progress`` (and the ``timings`` so far under
        ``timings_per_token``)."""
        return {"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": self.id_slot,
                "tokens_predicted": 0, "tokens_evaluated": self.n_prompt,
                **telemetry(self.req, progress=p)}

    def final(self, text: str, result, stopped_by: str, *, streamed: bool = False) -> dict:
        """The last object: everything (streamed: no content, tokens or probabilities, which
        the partial events carried)."""
        s = result.stats
        out = {"index": 0, "content": "" if streamed else text,
               "tokens": list(result.tokens) if self.body.return_tokens and not streamed else [],
               "id_slot": self.id_slot, "stop": True, "model": self.model_id,
               "tokens_predicted": s.n_tokens, "tokens_evaluated": self.n_prompt,
               "generation_settings": generation_settings(self.req, self.body.stream,
                                                          self.biases),
               "prompt": self.prompt_text, "has_new_line": "\n" in result.text,
               # llama-server's truncated: a context shift discarded tokens (--context-shift)
               "truncated": s.n_context_shifts > 0,
               "stop_type": _stop_type(result, stopped_by),
               "stopping_word": stopping_word(result),
               "tokens_cached": self.n_prompt + s.n_tokens, "timings": timings(s),
               **({} if streamed else self._probs(result.logprobs)),
               "speculative": self.speculative(result)}
        if self.body.response_fields:
            return response_fields(out, self.body.response_fields)
        return out


def _not_ready(worker, redact) -> JSONResponse | None:
    """llama-server's answer while the engine cannot take a request (core.not_ready), else
    None."""
    refused = not_ready(worker)
    if refused is None:
        return None
    if isinstance(refused, NotReadyError):  # llama-server's words while it loads
        return llama_error(503, "Loading model", headers={"Retry-After": "1"})
    return llama_error_of(refused, redact)


@router.post("/completion")
@router.post("/completions")
async def completion(body: LlamaCompletionRequest, request: HttpRequest):
    state = request.app.state
    config, worker, metrics, redact = state.config, state.worker, state.metrics, state.redact
    refused = _not_ready(worker, redact)
    if refused is not None:
        return refused
    _refused(body)
    try:
        req = to_request(config.defaults, body)
    except CactusError as e:
        return llama_error_of(e, redact, body)

    prompts = split_prompts(body.prompt)
    if len(prompts) > 1:
        return await _batch(request, body, req, prompts)
    started = await _start(request, body, req, body.prompt)
    if isinstance(started, Response):
        return started
    job, watch, shape = started
    if body.stream:
        return EventSourceResponse(_events(job, request, shape, metrics, redact), ping=15,
                                   shutdown_grace_period=config.shutdown_grace + 5)
    return await watch.answer(lambda text, result: shape.final(text, result, job.stopped_by),
                              lambda e: llama_error_of(e, redact, body))


async def _start(request: HttpRequest, body: LlamaCompletionRequest, req, prompt):
    """Starts the engine on one prompt: (job, watch, shape), or llama-server's answer refusing
    it. The prompt's token ids are made on the worker."""
    state = request.app.state
    job = Job(prompt=None, request=req, chat=False, loop=asyncio.get_running_loop(),
              deadline=time.perf_counter() + state.config.request_timeout,
              prepare=lambda engine: (prompt_ids(engine, prompt), req))
    watch = await submit(state.worker, job, request,
                         lambda e: llama_error_of(e, state.redact, body))
    if isinstance(watch, Response):
        return watch
    ids, engine = job.prompt, state.worker.engine
    shape = _Completion(body, req, state.config.model_id,
                        engine.verifier.model.detokenize(ids, special=True),
                        len(ids), lambda result: speculative_block(req, result),
                        engine.logit_biases(req))
    shape.id_slot = job.id_slot
    return job, watch, shape


def split_prompts(prompt) -> list:
    """llama-server's prompts of a body: a string, token ids, ids mixed with text, or a prompt
    object is one prompt; a list of strings, of id lists or of prompt objects is one prompt each."""
    if isinstance(prompt, (str, PromptObject)) or not prompt:
        return [prompt]
    if any(isinstance(p, int) for p in prompt) and all(isinstance(p, (int, str)) for p in prompt):
        return [prompt]  # ids, perhaps mixed with text
    return list(prompt)


async def _batch(request: HttpRequest, body: LlamaCompletionRequest, req, prompts: list):
    """Several prompts, answered one after another on the engine: llama-server's JSON array of
    final objects, each with its ``index``. Not streamed (a 400 says so)."""
    if body.stream:
        raise InputError("stream answers one prompt here: send one prompt per request (or leave "
                         "stream out)", param="prompt")
    redact = request.app.state.redact
    out = []
    for index, prompt in enumerate(prompts):
        started = await _start(request, body, req, prompt)
        if isinstance(started, Response):
            return started
        job, watch, shape = started
        answer = await watch.answer(
            lambda text, result, shape=shape, job=job: shape.final(text, result, job.stopped_by),
            lambda e: llama_error_of(e, redact, body))
        if isinstance(answer, Response):
            return answer
        out.append({**answer, "index": index})
    return out


def error_event(e, redact) -> dict:
    """A stream's error event: llama-server's ``data: {"error": {...}}``."""
    return {"data": json.dumps({"error": json.loads(llama_error_of(e, redact).body)["error"]})}


def _events(job: Job, request: HttpRequest, shape: _Completion, metrics, redact):
    """The SSE events of a streamed /completion: partial objects, the final one (no [DONE]);
    an error event in its place when the engine fails or the shutdown cuts the reply."""

    def chunk(c):  # (its timings as of it under timings_per_token)
        partial = shape.partial(c.text, c.tokens, c.logprobs, c.segments)
        yield {"data": json.dumps({**partial, **telemetry(shape.req, chunk=c)})}

    def done(result):
        left = result.tokens[shape.sent:]  # tokens whose text no chunk released
        if left:
            yield {"data": json.dumps(shape.partial("", left, (result.logprobs or [])[shape.sent:]))}
        yield {"data": json.dumps(shape.final("", result, job.stopped_by, streamed=True))}

    return stream(job, request, metrics, chunk=chunk, done=done,
                  progress=lambda p: [{"data": json.dumps(shape.progress(p))}],
                  failed=lambda e: [error_event(e, redact)])


# -------------------------------------------------------------------------------------------------
# Tokens, templates, properties
# -------------------------------------------------------------------------------------------------

class TokenizeRequest(BaseModel):
    """llama-server's ``/tokenize`` body (no ``content``: no tokens)."""

    model_config = ConfigDict(extra="allow", strict=True)
    content: Mixed | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    tokens: list[int] | None = None


async def ready_engine(request: HttpRequest):
    """The loaded engine (woken first when it sleeps). Raises Refused with llama-server's answer
    saying why there is none (:func:`_not_ready`), or why it did not load again."""
    worker, redact = request.app.state.worker, request.app.state.redact
    refused = _not_ready(worker, redact)
    if refused is not None:
        raise Refused(refused)
    try:
        return await worker.awake()
    except CactusError as e:
        raise Refused(llama_error_of(e, redact)) from None


def _piece_json(piece: bytes) -> str | list[int]:
    """A piece as llama-server writes it: text when it is valid UTF-8, else its bytes."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


def _check_ids(ids: list[int], n_vocab: int, field: str) -> None:
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise InputError(f"{field}[{bad}]: token id {ids[bad]} is outside the vocabulary "
                         f"[0, {n_vocab})", param=field)


@router.post("/tokenize")
async def tokenize(body: TokenizeRequest, request: HttpRequest):
    model = (await ready_engine(request)).verifier.model
    content, ids = body.content, []
    for i, part in enumerate([content] if isinstance(content, str) else content or []):
        if isinstance(part, str):
            ids += model.tokenize(part, add_special=body.add_special and i == 0,
                                  parse_special=body.parse_special)
        else:
            ids.append(part)
    _check_ids(ids, model.n_vocab, "content")
    if body.with_pieces:
        return {"tokens": [{"id": t, "piece": _piece_json(model.token_to_piece(t, special=True))}
                           for t in ids]}
    return {"tokens": ids}


@router.post("/detokenize")
async def detokenize(body: DetokenizeRequest, request: HttpRequest):
    model = (await ready_engine(request)).verifier.model
    ids = body.tokens or []
    _check_ids(ids, model.n_vocab, "tokens")
    return {"content": model.detokenize(ids, special=True)}


@router.post("/apply-template")
async def apply_template(body: ChatCompletionRequest, request: HttpRequest):
    """The prompt a chat body decodes: its messages and tools in the GGUF's template."""
    return {"prompt": chat_prompt(await ready_engine(request), body, request.app.state.config.defaults)}


def model_facts(engine) -> dict:
    """What ``GET /props`` reads of the loaded models, kept while they sleep (llama-server
    answers /props from such a copy then)."""
    model = engine.verifier.model

    def text(token: int) -> str:
        return model.token_text(token).decode("utf-8", "replace") if token >= 0 else ""

    return {"n_ctx": engine.verifier.n_ctx, "n_slots": len(engine.slots),
            "chat_template": model.chat_template() or "",
            "bos_token": text(model.bos), "eos_token": text(model.eos)}


@router.get("/props")
async def props(request: HttpRequest):
    """llama-server's properties; while the models sleep, from what they were (they are not
    woken), with ``is_sleeping`` true."""
    worker, config = request.app.state.worker, request.app.state.config
    sleeping = worker.sleeping
    if sleeping:
        facts = request.app.state.model_facts
    else:
        refused = _not_ready(worker, request.app.state.redact)
        if refused is not None:
            return refused
        facts = model_facts(worker.engine)
    defaults = config.defaults
    return {"default_generation_settings": {"n_ctx": facts["n_ctx"],
                                            "params": generation_settings(defaults)},
            "total_slots": facts["n_slots"], "model_alias": config.model_id,
            # the file's name, never this machine's path (docs/server.md "Endpoints and
            # fields against llama-server")
            "model_path": os.path.basename(str(config.verifier)),
            "modalities": {"vision": False, "audio": False, "video": False},
            "endpoint_slots": config.slots, "endpoint_props": False, "endpoint_metrics": config.metrics,
            "ui": config.ui, "chat_template": facts["chat_template"],
            "bos_token": facts["bos_token"], "eos_token": facts["eos_token"],
            "build_info": build_info(),
            "is_sleeping": sleeping,
            # this server's own: the speculation every request gets unless it says otherwise
            "speculative": rule_of(defaults),
            "draft_path": os.path.basename(str(config.draft)) if config.draft else None}


@router.post("/props")
async def set_props(request: HttpRequest):
    return llama_error(501, "this server does not support changing global properties (as "
                            "llama-server without --props)")


# -------------------------------------------------------------------------------------------------
