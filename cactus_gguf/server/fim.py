"""Fill-in-the-middle: llama-server's ``POST /infill`` and ``suffix`` on ``/v1/completions``.

``/infill`` takes llama-server's fields (``input_prefix``, ``input_suffix``, ``input_extra``
[{filename, text}], ``prompt``, ``n_predict``, ``t_max_predict_ms``, ``n_indent``,
``samplers``, ``response_fields``, ``cache_prompt`` and the sampling fields) and answers with
llama-server's object (``content``, ``stop_type``, ``tokens_predicted``, ``tokens_evaluated``,
``tokens_cached``, ``truncated``, ``timings`` ...) plus the ``speculative`` block; streamed, its
``data:`` events are llama-server's (no ``[DONE]``). The prompt is cactus_gguf/prompting/fim.py's, from the
model's FIM tokens; a model without them is a 400. Errors are llama-server's JSON, naming the
field (native_api.py), and the API key is checked as on its other endpoints. Speculation runs as
for any request (the server's drafter, or the request's ``speculative``); consecutive
completions of one file reuse the KV caches' common prefix (the repository context and the
prefix up to the edit).

When a completion stops early, as llama-server:
  ``t_max_predict_ms``  at the first newline generated after that many ms of generation (timed
                        from the first text; the rest of that step's text is dropped)
  ``n_indent``          at a line (after the first) indented less: cut before its first
                        non-blank character
and then ``tokens``, ``tokens_predicted`` and ``timings.predicted_n`` count the tokens of the text
returned (those wholly within it: a token the cut splits is not one of them); ``tokens_cached``
stays what the caches hold, every token generated.
``n_predict`` 0 (an editor's cache warm-up) processes the prompt into the caches and returns no
text (one token is computed and dropped).

``samplers``: this engine warps with top-k, top-p, min-p, then temperature (both models alike, so
the acceptance test compares like with like). A list naming some of them in that order is
honoured as llama-server does: a sampler left out is off (top-k 0, top-p 1, min-p 0, temperature
1). ``infill`` (llama.cpp's FIM sampler, which merges tokens sharing a prefix and leans to
ending) is accepted and not applied; any other sampler, or another order, is a 400.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Union

from fastapi import APIRouter, Request as HttpRequest
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse

from ..errors import InputError
from ..prompting.fim import ExtraChunk, infill_prompt
from ..speculative.session import tokens_within
from .core import stream, submit
from .http_errors import llama_error_of
from .native_api import (LlamaRoute, _not_ready, _stop_type as completion_stop_type,
                         stopping_word, error_event, generation_settings, response_fields)
from .report import speculative_block, telemetry, timings
from .schemas import _Common, completion_prompt, to_request
from .worker import Job

__all__ = ["InfillRequest", "SuffixPlan", "router", "sampler_overrides"]

# the warps of this engine, in its order, with each one's "off" value (llama-server's names and
# sampler characters: common/sampling.cpp)
WARPS = (("top_k", "k", 0), ("top_p", "p", 1.0), ("min_p", "m", 0.0), ("temperature", "t", 1.0))
IGNORED = {"infill": "i"}  # accepted, not applied (module docstring)


class InputExtra(BaseModel):
    """One repository chunk of ``input_extra`` (llama-server: filename optional, "tmp")."""

    model_config = ConfigDict(extra="forbid", strict=True)
    text: str
    filename: str | None = None


Mixed = Union[str, list[Union[int, str]]]  # text, or token ids mixed with text


class InfillRequest(_Common):
    """llama-server's ``/infill`` body (its other fields: the completion fields of ``_Common``)."""

    input_prefix: Mixed
    input_suffix: Mixed
    input_extra: list[InputExtra] = Field(default_factory=list)
    prompt: str = ""
    t_max_predict_ms: int | None = None
    t_max_prompt_ms: int | None = None  # accepted; llama-server does not implement it either
    n_indent: int | None = Field(default=None, ge=0)
    response_fields: list[str] | None = None
    return_tokens: bool = False


def sampler_overrides(samplers) -> dict[str, Any]:
    """The Request fields a llama-server ``samplers`` value sets (module docstring): the warps
    it leaves out turned off. None: {}. InputError (param samplers) for a sampler this engine
    does not apply, or an order other than its own."""
    if samplers is None:
        return {}
    by_char = {c: n for n, c, _ in WARPS} | {c: n for n, c in IGNORED.items()}
    if isinstance(samplers, str):  # llama-server's short form: one character per sampler
        names = [by_char.get(c, c) for c in samplers]
    elif isinstance(samplers, list) and all(isinstance(s, str) for s in samplers):
        names = list(samplers)
    else:
        raise InputError("samplers must be a list of sampler names or a string of their "
                         "characters", param="samplers")
    order = [n for n, _, _ in WARPS]
    bad = [n for n in names if n not in order and n not in IGNORED]
    if bad:
        raise InputError(f"samplers: {bad[0]!r} is not applied by this server, which warps with "
                         "top_k, top_p, min_p, then temperature (and accepts infill, not "
                         "applied): leave it out", param="samplers")
    used = [n for n in names if n in order]
    if used != sorted(used, key=order.index) or len(set(used)) != len(used):
        raise InputError(f"samplers: this server applies top_k, top_p, min_p, then temperature, "
                         f"in that order, got {', '.join(used)}", param="samplers")
    return {name: off for name, _, off in WARPS if name not in used}


class SuffixPlan:
    """``/v1/completions`` with ``suffix``: the prompt is the prefix, the completion fills in
    before the suffix (the FIM prompt of cactus_gguf/prompting/fim.py, nothing trimmed: a prompt too long
    for the context is the usual 400)."""

    def __init__(self, prefix, suffix: str) -> None:
        self.prefix, self.suffix = prefix, suffix

    @classmethod
    def of(cls, body) -> "SuffixPlan | None":
        return cls(completion_prompt(body), body.suffix) if body.suffix else None

    def prepare(self, engine, req):
        ids = infill_prompt(engine.verifier.model, self.prefix, self.suffix)
        return ids, req

    @staticmethod
    def reply():
        return None


class _LineLimits:
    """llama-server's early stops of a completion: ``t_max_predict_ms`` and ``n_indent`` (module
    docstring). ``take(piece)`` returns what of it to send; ``stop_type`` turns "limit" once a
    limit cut the text (nothing more is taken then)."""

    def __init__(self, t_max_predict_ms: int | None, n_indent: int | None) -> None:
        self.t_max = (t_max_predict_ms or 0) / 1000.0
        self.n_indent = n_indent or 0
        self.text = ""
        self.t_first: float | None = None
        self.checked = 0  # the text before this offset has had its lines checked
        self.stop_type: str | None = None

    def take(self, piece: str) -> str:
        if self.stop_type is not None:
            return ""
        now = time.perf_counter()
        if self.t_first is None and piece:
            self.t_first = now
        start = len(self.text)
        self.text += piece
        cut = self._indent_cut()
        if cut is None and self.t_max > 0 and self.t_first is not None and \
                now - self.t_first > self.t_max and "\n" in piece:
            cut = start + piece.index("\n") + 1
        if cut is not None:
            self.stop_type = "limit"
            self.text = self.text[:cut]
            return self.text[start:] if cut > start else ""
        return piece

    def _indent_cut(self) -> int | None:
        """Where a line (after the first) indented less than n_indent starts its text, if one
        does."""
        if self.n_indent <= 0:
            return None
        while True:
            nl = self.text.find("\n", self.checked)
            if nl < 0:
                return None
            pos = nl + 1
            while pos < len(self.text) and self.text[pos] in " \t":
                pos += 1
            if pos >= len(self.text):
                return None  # the line's indentation is not complete yet
            if self.text[pos] != "\n" and pos - nl - 1 < self.n_indent:
                return pos
            self.checked = pos


def _stop_type(result, limits: _LineLimits, stopped_by: str) -> str:
    """llama-server's stop_type: "limit" when an early stop cut the text, else /completion's."""
    return limits.stop_type or completion_stop_type(result, stopped_by)


class _Infill:
    """llama-server's objects for one ``/infill`` request (its /completion answer:
    native_api.py's settings and timings), with this server's ``speculative`` block.
    ``id_slot``: the slot its generation runs on (the job's, once started)."""

    id_slot = 0

    def __init__(self, body: InfillRequest, req, model_id: str, prompt_text: str,
                 n_prompt: int, speculative, piece=None) -> None:
        self.body, self.req, self.model_id = body, req, model_id
        self.prompt_text, self.n_prompt = prompt_text, n_prompt
        self.speculative = speculative  # result -> the speculative block (app's _Shape)
        self.piece = piece  # token id -> its bytes (the model's token_to_piece)
        self.warm_up = body.n_predict == 0

    def _returned(self, result, limits: "_LineLimits") -> list[int]:
        """The generated tokens of the text returned: all of them, but after an early stop
        (which cuts the text inside a step, maybe inside a token) those wholly within the text
        kept (speculative/session.py's ``tokens_within``)."""
        tokens = list(result.tokens)
        if limits.stop_type is None or self.piece is None:
            return tokens
        return tokens[:tokens_within(map(self.piece, tokens), len(limits.text))]

    def partial(self, text: str) -> dict:
        return {"index": 0, "content": text, "tokens": [], "stop": False, "id_slot": self.id_slot,
                "tokens_evaluated": self.n_prompt}

    def final(self, text: str, result, limits: "_LineLimits", stopped_by: str) -> dict:
        """The last object (``text``: "" when the partial events carried it)."""
        s = result.stats
        settings = generation_settings(self.req, self.body.stream)
        settings.update(n_indent=self.body.n_indent or 0,
                        t_max_predict_ms=self.body.t_max_predict_ms or -1,
                        samplers=[n for n, _, off in WARPS if getattr(self.req, n) != off])
        if self.warm_up:
            settings.update(n_predict=0, max_tokens=0)
        returned = [] if self.warm_up else self._returned(result, limits)
        n = len(returned)
        times = timings(s, n)  # predicted: the tokens returned (an early stop drops a step's rest)
        out = {"index": 0, "content": "" if self.warm_up else text,
               "tokens": returned if self.body.return_tokens else [],
               "id_slot": self.id_slot, "stop": True, "model": self.model_id,
               "tokens_predicted": n,
               "tokens_evaluated": self.n_prompt, "generation_settings": settings,
               "prompt": self.prompt_text, "has_new_line": "\n" in text,
               # llama-server's truncated: the context ran out (the FIM trim is not counted)
               "truncated": result.stop_reason == "length" and "context full" in result.message,
               "stop_type": "limit" if self.warm_up else _stop_type(result, limits, stopped_by),
               "stopping_word": stopping_word(result),
               # what the caches hold: every token generated, those an early stop dropped too
               "tokens_cached": self.n_prompt + s.n_tokens, "timings": times,
               "speculative": self.speculative(result)}
        if self.body.response_fields:
            return response_fields(out, self.body.response_fields)
        return out


def _prepare(body: InfillRequest, engine, defaults):
    """(prompt ids, Request) of an /infill body."""
    samplers = (body.model_extra or {}).get("samplers")
    overrides = sampler_overrides(samplers)
    changes: dict[str, Any] = {"samplers": None}  # honoured here: not refused downstream
    if body.n_predict == 0:  # a warm-up: fill the caches, answer nothing (module docstring)
        changes["n_predict"] = 1
    if body.t_max_predict_ms is not None and body.t_max_predict_ms < -1:
        raise InputError(f"t_max_predict_ms must be >= -1 (-1 or 0: no limit), got "
                         f"{body.t_max_predict_ms}", param="t_max_predict_ms")
    req = to_request(defaults, body.model_copy(update=changes))
    if overrides:
        req = req.replace(**overrides)
    ctx = engine.verifier
    extra = [ExtraChunk(c.filename or "", c.text) for c in body.input_extra]
    ids = infill_prompt(ctx.model, body.input_prefix, body.input_suffix, extra=extra,
                        prompt=body.prompt, n_batch=ctx.n_batch, n_ctx=ctx.n_ctx,
                        n_predict=req.n_predict)
    return ids, req


router = APIRouter(route_class=LlamaRoute)  # llama-server's errors (native_api.py)


@router.post("/infill")
async def infill(body: InfillRequest, request: HttpRequest):
    """llama-server's ``/infill`` (module docstring): the FIM prompt, the job, and the answer,
    streamed or not. Errors are llama-server's JSON."""
    state = request.app.state
    config, worker, metrics, redact = state.config, state.worker, state.metrics, state.redact
    refused = _not_ready(worker, redact)
    if refused is not None:
        return refused

    def failed(e):
        return llama_error_of(e, redact, body)

    job = Job(prompt=None, request=None, chat=False, loop=asyncio.get_running_loop(),
              deadline=time.perf_counter() + config.request_timeout,
              prepare=lambda engine: _prepare(body, engine, config.defaults))  # on the worker
    watch = await submit(worker, job, request, failed)
    if isinstance(watch, Response):  # refused before its first step (a queue timeout too)
        return watch
    ids, req = job.prompt, job.request
    model = worker.engine.verifier.model
    shape = _Infill(body, req, config.model_id, model.detokenize(ids, special=True), len(ids),
                    lambda result: speculative_block(req, result), model.token_to_piece)
    shape.id_slot = job.id_slot
    limits = _LineLimits(body.t_max_predict_ms, body.n_indent)

    def take(chunk) -> str:
        """What of a chunk to send: the early stops cut it, and then stop the job."""
        piece = limits.take(chunk.text)
        if limits.stop_type and not job.cancelled.is_set():
            job.cancel("limit")  # the engine stops within one step
        return "" if shape.warm_up else piece

    def stopped(job) -> str:
        return "" if job.stopped_by == "limit" else job.stopped_by

    if body.stream:
        def chunk(c):  # (its timings as of it under timings_per_token)
            piece = take(c)
            return [{"data": json.dumps({**shape.partial(piece), **telemetry(req, chunk=c)})}] \
                if piece else []

        def done(result):
            return [{"data": json.dumps(shape.final("", result, limits, stopped(job)))}]

        def progress(p):  # return_progress: llama-server's empty partial with prompt_progress
            return [{"data": json.dumps({**shape.partial(""), **telemetry(req, progress=p)})}]

        return EventSourceResponse(
            stream(job, request, metrics, chunk=chunk, done=done, progress=progress,
                   failed=lambda e: [error_event(e, redact)]),
            ping=15, shutdown_grace_period=config.shutdown_grace + 5)
    return await watch.answer(lambda text, result: shape.final(text, result, limits, stopped(job)),
                              failed, take)
