"""The OpenAI-compatible HTTP API over one engine (FastAPI; SSE streaming with sse-starlette).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (streaming and not),
``GET /v1/models``, ``GET /health`` (503 while the models load), ``GET /metrics`` (Prometheus),
``GET /`` (the chat page, static files of the package).

Every error is OpenAI's JSON, ``{"error": {"message", "type", "param", "code"}}``: 400 for invalid
JSON or values (naming the field) and for a prompt longer than the context, 401 for a missing or
wrong API key, 404 for an unknown model or route, 413 for a body over the limit, 503 while loading
or when the queue is full (with Retry-After), 500 with the one-line reason when the engine fails.
No traceback reaches a client.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import CactusError
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .schemas import (ChatCompletionRequest, CompletionRequest, chat_messages, completion_prompt,
                      to_request)
from .worker import Job, QueueFullError, Worker

__all__ = ["ServerConfig", "create_app"]

MAX_BODY = 8 << 20  # bytes: a chat far longer than any context still fits
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "timeout": "length",
          "interrupted": "length"}


@dataclass(frozen=True)
class ServerConfig:
    """What the server was started with: the default Request of every generation, the model id
    clients name, and the serve options (options.py)."""

    defaults: Any
    model_id: str
    verifier: str
    draft: str | None
    api_key: str | None = None
    request_timeout: float = 600.0
    cors_origins: tuple[str, ...] = ()
    max_body: int = MAX_BODY
    created: int = field(default_factory=lambda: int(time.time()))


def error(status: int, message: str, *, type_: str = "invalid_request_error",
          param: str | None = None, code: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


def error_of(e: CactusError) -> JSONResponse:
    """An engine or input error as its HTTP answer (errors.py gives status and type)."""
    headers = {"Retry-After": "1"} if e.http_status == 503 else None
    return error(e.http_status, str(e), type_=e.error_type, param=e.param, code=e.code,
                 headers=headers)


_TYPE_TAGS = {"str", "bool", "int", "float", "none", "dict"}


def _field(loc) -> str:
    """A pydantic error location as the client's field name: ``speculative.k``, ``messages.0``
    (without "body" and the tags pydantic adds for the members of a union, e.g. "Speculative")."""
    parts = [str(p) for p in loc if p != "body" and not (
        isinstance(p, str) and (p[:1].isupper() or "[" in p or p in _TYPE_TAGS))]
    return ".".join(parts) if parts else "body"


def create_app(worker: Worker, config: ServerConfig, metrics: Metrics | None = None) -> FastAPI:
    """The app serving ``worker``'s engine with ``config``."""
    metrics = metrics or Metrics()
    worker.on_finish = lambda job, result, waited: (metrics.finished(result.stats)
                                                   if result is not None else None)
    app = FastAPI(title="cactus-gguf", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics, app.state.worker, app.state.config = metrics, worker, config
    _install_middleware(app, config, metrics)
    _install_error_handlers(app)
    static = resources.files("cactus_gguf.server") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(str(static / "index.html"))

    @app.get("/health")
    async def health():
        if worker.state == "ready":
            return {"status": "ok"}
        if worker.state == "loading":
            return JSONResponse({"status": "loading"}, status_code=503,
                                headers={"Retry-After": "1"})
        if worker.state == "lost":  # an RPC server died: restart it and this server
            return error(503, worker.error, type_="server_error", code="rpc_server_lost")
        return error(500, f"the models failed to load: {worker.error}", type_="server_error")

    @app.get("/metrics")
    async def metrics_route():
        metrics.queue_depth.set(worker.waiting)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": config.model_id, "object": "model", "created": config.created,
            "owned_by": "cactus-gguf", "verifier": config.verifier, "draft": config.draft}]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: HttpRequest):
        return await _generate(request, body, chat_messages(body), True, config, worker)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HttpRequest):
        return await _generate(request, body, completion_prompt(body), False, config, worker)

    return app


def _install_middleware(app: FastAPI, config: ServerConfig, metrics: Metrics) -> None:
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["*"], allow_headers=["*"])

    @app.middleware("http")
    async def guard(request: HttpRequest, call_next):
        path = request.url.path
        protected = path.startswith("/v1/") or path == "/metrics"
        if protected and config.api_key and request.method != "OPTIONS":
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {config.api_key}":
                metrics.requests.labels(path, "401").inc()
                return error(401, "invalid or missing API key: send Authorization: Bearer KEY",
                             code="invalid_api_key")
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > config.max_body:
            metrics.requests.labels(path, "413").inc()
            return error(413, f"the request body is {int(size)} bytes, more than the limit of "
                              f"{config.max_body}", code="request_too_large")
        response = await call_next(request)
        metrics.requests.labels(path if protected or path == "/health" else "other",
                                str(response.status_code)).inc()
        return response


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        name = _field(first.get("loc", ()))
        if first.get("type") == "json_invalid":
            return error(400, f"the body is not valid JSON: {first.get('msg')}", param=None)
        return error(400, f"{name}: {first.get('msg')}", param=name)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        what = {404: f"no route {request.method} {request.url.path}"}.get(exc.status_code,
                                                                          str(exc.detail))
        return error(exc.status_code, what, code=None)

    @app.exception_handler(CactusError)
    async def cactus_error(request, exc: CactusError):
        return error_of(exc)

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        return error(500, f"internal error: {type(exc).__name__}: {exc}", type_="server_error")


# -------------------------------------------------------------------------------------------------
# Generation
# -------------------------------------------------------------------------------------------------

class _ClientGone(Exception):
    pass


async def _next_event(job: Job, request: HttpRequest):
    """The job's next event; cancels the job (and raises _ClientGone) if the client left."""
    while True:
        try:
            return await asyncio.wait_for(job.events.get(), 0.25)
        except asyncio.TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                raise _ClientGone() from None


async def _generate(request: HttpRequest, body, prompt, chat: bool, config: ServerConfig,
                    worker: Worker):
    if worker.state == "lost":
        return error(503, worker.error, type_="server_error", code="rpc_server_lost")
    if worker.state != "ready":
        return error(503, "the models are still loading" if worker.state == "loading"
                     else f"the models failed to load: {worker.error}", type_="server_error",
                     code="not_ready", headers={"Retry-After": "1"})
    if body.model is not None and body.model not in (config.model_id, config.verifier):
        return error(404, f"model {body.model!r} not found: this server serves "
                          f"{config.model_id!r} (GET /v1/models)", param="model",
                     code="model_not_found")
    req = to_request(config.defaults, body)
    job = Job(prompt=prompt, request=req, chat=chat, loop=asyncio.get_running_loop(),
              deadline=time.perf_counter() + config.request_timeout)
    try:
        worker.submit(job)
    except QueueFullError as e:
        return error_of(e)
    try:
        kind, payload = await _next_event(job, request)
    except _ClientGone:
        return Response(status_code=499)
    if kind == "error":
        return error_of(payload) if isinstance(payload, CactusError) else error(
            500, str(payload), type_="server_error")
    shape = _Shape(chat, config.model_id, req)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventSourceResponse(_sse(job, request, shape, include_usage), ping=15)
    text = []
    try:
        while True:
            kind, payload = await _next_event(job, request)
            if kind == "chunk":
                text.append(payload.text)
            elif kind == "done":
                return shape.response("".join(text), payload, job.stopped_by)
            else:
                return error_of(payload) if isinstance(payload, CactusError) else error(
                    500, str(payload), type_="server_error")
    except _ClientGone:
        return Response(status_code=499)


async def _sse(job: Job, request: HttpRequest, shape: "_Shape", include_usage: bool):
    """The SSE events of a streaming response: OpenAI's chunks, then ``[DONE]``."""
    try:
        yield {"data": json.dumps(shape.chunk(role=True))}
        while True:
            kind, payload = await job.events.get()
            if kind == "chunk":
                yield {"data": json.dumps(shape.chunk(text=payload.text,
                                                      segments=payload.segments))}
            elif kind == "done":
                yield {"data": json.dumps(shape.chunk(result=payload, stopped_by=job.stopped_by))}
                if include_usage:
                    yield {"data": json.dumps(shape.usage_chunk(payload))}
                break
            else:
                e = payload
                yield {"data": json.dumps({"error": {
                    "message": str(e), "type": getattr(e, "error_type", "server_error"),
                    "param": getattr(e, "param", None), "code": getattr(e, "code", None)}})}
                break
        yield {"data": "[DONE]"}
    finally:
        job.cancel()  # the client left mid-stream (or the stream ended): stop within one step


class _Shape:
    """OpenAI's response and chunk objects for one request."""

    def __init__(self, chat: bool, model: str, request) -> None:
        self.chat, self.model, self.request = chat, model, request
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat \
            else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def speculative(self, result) -> dict:
        """The speculative block: what speculation did for this request."""
        s, r = result.stats, self.request
        return {"method": r.method, "delta": r.delta if r.method == "cactus" else None,
                "solver": r.solver if r.method == "cactus" else None,
                "budget": r.budget if r.method == "cactus" else None,
                "k": r.k if r.method != "none" else None,
                "k_max": r.k_max if r.method != "none" and r.k == "auto" else None,
                "drafter": r.drafter if r.method != "none" else None,
                "acceptance_length": s.mean_accepted_length, "acceptance_rate": s.acceptance_rate,
                "tokens_per_verifier_call": s.tokens_per_verifier_call, "kl_mean": s.kl_mean,
                "kl_max": s.kl_max, "output_kl_mean": s.output_kl_mean,
                "output_kl_max": s.output_kl_max, "output_kl_sum": s.output_kl_sum,
                "draft_seconds": s.draft_seconds,
                "verify_seconds": s.verify_seconds, "prefill_seconds": s.prefill_seconds,
                "first_token_seconds": s.first_token_seconds,
                "tokens_per_second": s.tokens_per_second,
                "prompt_tokens_reused": s.n_prompt_tokens_reused,
                "draft_stopped_at": s.draft_stopped_at, "seed": result.seed}

    @staticmethod
    def usage(result) -> dict:
        s = result.stats
        return {"prompt_tokens": s.n_prompt_tokens, "completion_tokens": s.n_tokens,
                "total_tokens": s.n_prompt_tokens + s.n_tokens,
                "prompt_tokens_details": {"cached_tokens": s.n_prompt_tokens_reused}}

    def response(self, text: str, result, stopped_by: str) -> dict:
        finish = FINISH.get(stopped_by or result.stop_reason, "stop")
        choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                   "finish_reason": finish, "logprobs": None} if self.chat else
                  {"index": 0, "text": text, "finish_reason": finish, "logprobs": None})
        return {**self._head(False), "choices": [choice], "usage": self.usage(result),
                "speculative": self.speculative(result)}

    def chunk(self, *, role: bool = False, text: str | None = None, segments=None, result=None,
              stopped_by: str = "") -> dict:
        finish = None if result is None else FINISH.get(stopped_by or result.stop_reason, "stop")
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else (
                {"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        out = {**self._head(True), "choices": [choice]}
        if segments is not None:  # which characters came from accepted drafts, which from q
            out["speculative"] = {"segments": [[t, src] for t, src in segments]}
        if result is not None:
            out["speculative"] = self.speculative(result)
        return out

    def usage_chunk(self, result) -> dict:
        return {**self._head(True), "choices": [], "usage": self.usage(result)}
