"""OpenAI's API over the request core: ``POST /v1/chat/completions`` (tool calls:
server/tools.py), ``POST /v1/completions`` (``suffix``: fill in the middle, server/fim.py), the
count of a chat body's tokens (``/v1/chat/completions/input_tokens``), each also without ``/v1``
where llama-server serves it so. A body is parsed (schemas.py) into a job the core runs
(core.py); its events become OpenAI's response and chunk objects (:class:`_Shape`), with
llama-server's additions (``timings``, ``system_fingerprint``) and this server's ``speculative``
block. The Responses and Anthropic APIs (responses.py, anthropic.py) convert their bodies to a
chat body and run through :func:`start` too.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any, Callable, NamedTuple

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import Response
from sse_starlette.sse import EventSourceResponse

from ..errors import InputError
from .core import Watch, not_ready, stream, submit
from .fim import SuffixPlan
from .http_errors import error, error_of
from .logprobs import openai_chat, openai_completion
from .native_api import generation_settings
from .prompts import chat_prompt
from .report import speculative_block, system_fingerprint, telemetry, timings
from .schemas import (ChatCompletionRequest, CompletionRequest, chat_format, chat_messages,
                      completion_prompts, to_request)
from .tools import ToolPlan
from .worker import Job

__all__ = ["router", "start", "start_chat", "converted_stream", "Started", "openai_events",
           "count_tokens", "FINISH"]

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "timeout": "length",
          "interrupted": "length", "cancelled": "length"}

router = APIRouter()


@router.post("/v1/chat/completions")
@router.post("/chat/completions")  # llama-server's alias: a client whose base URL lacks /v1
async def chat(body: ChatCompletionRequest, request: HttpRequest):
    def choice(i: int):
        tools = ToolPlan.of(body)  # None: no tools, no calls in the history; one per choice
        return (chat_messages(body) if tools is None else None), tools

    return await _generate(request, body, True, choice, body.n)

@router.post("/v1/completions")
async def completions(body: CompletionRequest, request: HttpRequest):
    prompts = completion_prompts(body)

    def choice(i: int):  # prompt i // n
        fim = SuffixPlan.of(body)  # a suffix: fill in the middle (one prompt)
        return (prompts[i // body.n] if fim is None else None), fim

    return await _generate(request, body, False, choice, len(prompts) * body.n)

@router.post("/v1/chat/completions/input_tokens")
@router.post("/chat/completions/input_tokens")
async def chat_input_tokens(body: ChatCompletionRequest, request: HttpRequest):
    """llama-server's count of a chat body's prompt tokens (its template, its tools)."""
    return {"input_tokens": await count_tokens(request, body)}


class Started(NamedTuple):
    """A job the engine has started, its watch on the client, and its OpenAI shaper."""

    job: Job
    watch: Watch
    shape: "_Shape"


async def start(request: HttpRequest, body, prompt, chat: bool, plan=None) -> Started | Response:
    """Starts the engine on an OpenAI body (the Responses and Anthropic APIs convert theirs to
    one first): the Started job, or the OpenAI error answer refusing it. ``prompt``: chat
    messages or a completion prompt; ``plan``: a prompt that needs the loaded model (tools:
    server/tools.py, a FIM suffix: server/fim.py), prepared on the worker: its
    ``prepare(engine, req)`` gives the prompt and the request, its ``reply()`` the shaper of a
    reply with tool calls (or None). Raises InputError for a body the options refuse (a 400)."""
    state = request.app.state
    config, worker, redact = state.config, state.worker, state.redact
    refused = not_ready(worker)
    if refused is not None:
        return error_of(refused, redact)
    if config.strict_model and body.model is not None and \
            body.model not in (config.model_id, config.verifier):
        return error(404, f"model {body.model!r} not found: this server serves "
                          f"{config.model_id!r} (GET /v1/models)", param="model",
                     code="model_not_found")
    req = to_request(config.defaults, body)
    if plan is not None:
        prepare = lambda engine: plan.prepare(engine, req)  # noqa: E731
    elif chat:  # the messages rendered with the template's switches (schemas.chat_format)
        prepare = lambda engine: (engine.format_chat(prompt, **chat_format(body)), req)  # noqa: E731
    else:
        prepare = None
    job = Job(prompt=prompt, request=req, chat=False, loop=asyncio.get_running_loop(),
              deadline=time.perf_counter() + config.request_timeout, prepare=prepare)
    watch = await submit(worker, job, request, lambda e: error_of(e, redact, body))
    if isinstance(watch, Response):
        return watch
    shape = _Shape(chat, config.model_id, job.request, plan.reply() if plan is not None else None)
    if shape.tools is not None:  # a stop string in the content ends the job (server/tools.py)
        shape.tools.on_stop = lambda: job.cancel("stop")
    return Started(job, watch, shape)


def openai_events(started: Started, request: HttpRequest, include_usage: bool):
    """The SSE events of a streamed OpenAI answer: the role chunk, the ``prompt_progress``
    chunks when asked (``return_progress``), the chunks (each with its ``timings`` under
    ``timings_per_token``), the last chunk (its ``finish_reason``, ``speculative`` and
    ``timings``), the usage chunk when asked (with the ``timings`` too, as llama-server's last
    chunk), then ``[DONE]``; an error event before ``[DONE]`` when the engine fails or the
    shutdown cuts the reply (code ``server_shutdown``), so that no client takes it as
    complete."""
    job, shape, state = started.job, started.shape, request.app.state

    def data(obj) -> dict:
        return {"data": json.dumps(obj)}

    def done(result):
        yield data(shape.chunk(result=result, stopped_by=job.stopped_by))
        if include_usage:
            yield data(shape.usage_chunk(result))
        yield DONE

    def failed(e):
        return [error_event(e, state.redact), DONE]

    return stream(job, request, state.metrics, head=[data(shape.chunk(role=True))],
                  chunk=lambda c: [data(shape.text_chunk(c))],
                  progress=lambda p: [data(shape.progress_chunk(p))],
                  done=done, failed=failed)


DONE = {"data": "[DONE]"}


async def start_chat(request: HttpRequest, chat: ChatCompletionRequest) -> Started | Response:
    """:func:`start` on a chat body another API converted (responses.py, anthropic.py): its
    tools and history planned as /v1/chat/completions plans them."""
    tools = ToolPlan.of(chat)
    return await start(request, chat, chat_messages(chat) if tools is None else None, True, tools)


def converted_stream(started: Started, request: HttpRequest, head: list[dict],
                     chunk: Callable[[dict], list[dict]],
                     end: Callable[[dict, Any], list[dict]],
                     failed: Callable[[BaseException, Callable[[str], str]], list[dict]],
                     progress: Callable[[dict], list[dict]] = lambda p: []):
    """Another API's stream over a started chat job: ``head``, then ``progress(chunk)`` of each
    OpenAI ``prompt_progress`` chunk (``return_progress``), ``chunk(c)`` of each OpenAI chunk,
    ``end(last_chunk, result)`` of the last one, ``failed(e, redact)`` in its place when the
    engine fails or the shutdown cuts the reply (core.stream)."""
    job, shape, state = started.job, started.shape, request.app.state
    return EventSourceResponse(
        stream(job, request, state.metrics, head=head,
               chunk=lambda c: chunk(shape.text_chunk(c)),
               progress=lambda p: progress(shape.progress_chunk(p)),
               done=lambda result: end(shape.chunk(result=result, stopped_by=job.stopped_by),
                                       result),
               failed=lambda e: failed(e, state.redact)),
        ping=15, shutdown_grace_period=state.config.shutdown_grace + 5)


async def count_tokens(request: HttpRequest, body: ChatCompletionRequest) -> int:
    """The tokens of a chat body's prompt as the engine would decode it: the GGUF's template
    with the tools, tokenized as llama-server counts (special tokens parsed, BOS where the model
    adds it). Raises the engine's refusal (not ready) or InputError, answered by the handlers."""
    state = request.app.state
    refused = not_ready(state.worker)
    if refused is not None:
        raise refused
    engine = await state.worker.awake()
    prompt = chat_prompt(engine, body, state.config.defaults)
    return len(engine.verifier.model.tokenize(prompt))


def error_event(e, redact=lambda text: text) -> dict:
    """An OpenAI stream's error event."""
    return {"data": json.dumps({"error": {
        "message": redact(str(e)), "type": getattr(e, "error_type", "server_error"),
        "param": getattr(e, "param", None), "code": getattr(e, "code", None)}})}


async def _generate(request: HttpRequest, body, chat: bool, choice, count: int) -> Response:
    """An OpenAI answer of ``count`` choices, streamed or not: ``choice(i)`` gives choice i's
    (prompt, plan) (:func:`start`)."""
    if count > 1:
        return await _several(request, body, chat, choice, count)
    prompt, plan = choice(0)
    started = await start(request, body, prompt, chat, plan)
    if isinstance(started, Response):
        return started
    state = request.app.state
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        # on shutdown, sse-starlette would cut the stream at once (a silent end): it waits while
        # the worker's grace runs and the stream sends its own last event
        return EventSourceResponse(openai_events(started, request, include_usage), ping=15,
                                   shutdown_grace_period=state.config.shutdown_grace + 5)
    job, shape = started.job, started.shape
    engine = state.worker.engine

    def answer(text, result) -> dict:
        out = shape.response(text, result, job.stopped_by)
        # llama-server's debug copy (the answer as /completion gives it): asked for, or serve -v
        if body.verbose or (body.verbose is None and state.config.verbose):
            out["__verbose"] = verbose_object(engine, job, text, result, shape.model)
        return out

    return await started.watch.answer(
        answer,
        lambda e: error_of(e, state.redact, body),
        # tool calls: parsed as the text comes, so a stop string in the content ends the job
        **({} if shape.tools is None else {"piece": lambda chunk: shape.tools.take_chunk(chunk)}))


def verbose_object(engine, job: Job, text: str, result, model: str) -> dict:
    """llama-server's ``__verbose`` of an OpenAI answer (``verbose: true``; its
    to_json_non_oaicompat): the text, the prompt as the engine decoded it (a chat's rendered
    template), the counts, the generation settings and the timings."""
    ids = engine.tokenize(job.prompt) if isinstance(job.prompt, str) else list(job.prompt)
    prompt = engine.verifier.model.detokenize(ids, special=True)  # as decoded: BOS included
    s = result.stats
    return {"index": 0, "content": text, "tokens": [], "id_slot": 0, "stop": True,
            "model": model, "tokens_predicted": s.n_tokens, "tokens_evaluated": s.n_prompt_tokens,
            "generation_settings": generation_settings(job.request, False,
                                                       engine.logit_biases(job.request)),
            "prompt": prompt, "has_new_line": "\n" in text, "truncated": False,
            "tokens_cached": s.n_prompt_tokens + s.n_tokens,
            "timings": timings(s)}


async def _several(request: HttpRequest, body, chat: bool, choice, count: int) -> Response:
    """Several choices (``n`` > 1, or several prompts), generated one after another on the
    engine: choice i of prompt p is index p * n + i, its seed the request's + i (so choice 0 is
    the answer of n = 1). Not streamed (a 400 says so). ``usage`` adds up every choice (each
    prompt counted once), ``speculative`` is the first choice's, and each choice carries its
    own."""
    if body.stream:
        raise InputError("stream answers one choice here: send n = 1 and one prompt per request "
                         "(or leave stream out)", param="n" if body.n > 1 else "prompt")
    state, answers = request.app.state, []
    for i in range(count):
        j = i % body.n
        b = body if j == 0 or body.seed is None else body.model_copy(
            update={"seed": body.seed + j})
        prompt, plan = choice(i)
        started = await start(request, b, prompt, chat, plan)
        if isinstance(started, Response):
            return started
        job, shape = started.job, started.shape
        answer = await started.watch.answer(
            lambda text, result: shape.response(text, result, job.stopped_by),
            lambda e: error_of(e, state.redact, body),
            **({} if shape.tools is None else {"piece": lambda c: shape.tools.take_chunk(c)}))
        if isinstance(answer, Response):
            return answer
        answers.append((j, answer))
    first = answers[0][1]
    usage = {"prompt_tokens": sum(a["usage"]["prompt_tokens"] for j, a in answers if j == 0),
             "completion_tokens": sum(a["usage"]["completion_tokens"] for _, a in answers)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    usage["prompt_tokens_details"] = {"cached_tokens": sum(
        a["usage"]["prompt_tokens_details"]["cached_tokens"] for j, a in answers if j == 0)}
    choices = [{**a["choices"][0], "index": i, "speculative": a["speculative"]}
               for i, (_, a) in enumerate(answers)]
    return {**first, "choices": choices, "usage": usage}


class _Shape:
    """OpenAI's response and chunk objects for one request."""

    def __init__(self, chat: bool, model: str, request, tools=None) -> None:
        self.chat, self.model, self.request = chat, model, request
        self.tools = tools  # a reply that may hold tool calls (server/tools.py's ToolReply)
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._sent = self._offset = 0  # tokens whose logprobs were sent; their characters

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": system_fingerprint()}

    def speculative(self, result) -> dict:
        """The speculative block: what speculation did for this request (report.py)."""
        return speculative_block(self.request, result)

    def logprobs(self, entries) -> dict | None:
        """A choice's ``logprobs`` for ``entries`` (speculative/logprobs.TokenLogprob: the
        tokens it carries, in order), OpenAI's chat or legacy completions shape (server/logprobs.py);
        None when the request asked for none."""
        if self.request.n_probs is None or entries is None:
            return None
        out = openai_chat(entries) if self.chat else openai_completion(entries, self._offset)
        self._sent += len(entries)
        if not self.chat:  # text_offset: characters of the completion before each token
            self._offset += sum(len(token) for token in out["tokens"])
        return out

    @staticmethod
    def usage(result) -> dict:
        s = result.stats
        return {"prompt_tokens": s.n_prompt_tokens, "completion_tokens": s.n_tokens,
                "total_tokens": s.n_prompt_tokens + s.n_tokens,
                "prompt_tokens_details": {"cached_tokens": s.n_prompt_tokens_reused}}

    def response(self, text: str, result, stopped_by: str) -> dict:
        finish = FINISH.get(stopped_by or result.stop_reason, "stop")
        message = {"role": "assistant", "content": text}
        if self.tools is not None:  # the calls parsed out of the text
            message = self.tools.message(text, finish, result.tokens)
            finish = self.tools.finish_reason(finish)
        choice = ({"index": 0, "message": message,
                   "finish_reason": finish, "logprobs": self.logprobs(result.logprobs)} if self.chat else
                  {"index": 0, "text": text, "finish_reason": finish,
                   "logprobs": self.logprobs(result.logprobs)})
        return {**self._head(False), "choices": [choice], "usage": self.usage(result),
                "timings": timings(result.stats), "speculative": self.speculative(result)}

    def chunk(self, *, role: bool = False, text: str | None = None, segments=None, result=None,
              stopped_by: str = "", logprobs=None) -> dict:
        finish = None if result is None else FINISH.get(stopped_by or result.stop_reason, "stop")
        if result is not None and result.logprobs is not None:  # the tokens no chunk carried
            logprobs = result.logprobs[self._sent:]
        if self.chat:
            # the first delta's content is null, as llama-server and OpenAI send it
            delta = {"role": "assistant", "content": None} if role else (
                {"content": text} if text is not None else {})
            if self.tools is not None and not role:  # content and calls, parsed as they come
                delta = self.tools.delta(text, finish)
                finish = None if finish is None else self.tools.finish_reason(finish)
            choice = {"index": 0, "delta": delta, "finish_reason": finish,
                      "logprobs": None if role else self.logprobs(logprobs)}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish,
                      "logprobs": None if role else self.logprobs(logprobs)}
        out = {**self._head(True), "choices": [choice]}
        if segments is not None:  # which characters came from accepted drafts, which from q
            out["speculative"] = {"segments": [[t, src] for t, src in segments]}
        if result is not None:
            out["timings"] = timings(result.stats)
            out["speculative"] = self.speculative(result)
        return out

    def text_chunk(self, c) -> dict:
        """The chunk of an engine Chunk ``c``: its text, sources, log-probabilities, and its
        ``timings`` under ``timings_per_token``."""
        text = c.text if self.tools is None else self.tools.text_of(c)  # markup written in
        return {**self.chunk(text=text, segments=c.segments, logprobs=c.logprobs),
                **telemetry(self.request, chunk=c)}

    def progress_chunk(self, p) -> dict:
        """llama-server's chunk of a prompt-processing report ``p`` (``return_progress``): an
        empty choice (a chat's the role delta, as llama-server repeats it) with
        ``prompt_progress``, and the ``timings`` so far under ``timings_per_token``."""
        choice = {"index": 0, "delta": {"role": "assistant", "content": None},
                  "finish_reason": None} if self.chat else \
            {"index": 0, "text": "", "finish_reason": None, "logprobs": None}
        return {**self._head(True), "choices": [choice], **telemetry(self.request, progress=p)}

    def usage_chunk(self, result) -> dict:
        """The usage chunk: no choice, the ``usage`` and, as on llama-server's last chunk, the
        ``timings``."""
        return {**self._head(True), "choices": [], "usage": self.usage(result),
                "timings": timings(result.stats)}
