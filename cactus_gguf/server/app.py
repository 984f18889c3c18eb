"""The OpenAI-compatible HTTP API over one engine (FastAPI; SSE streaming with sse-starlette).

Routes: ``POST /v1/chat/completions`` (tool calls: server/tools.py), ``POST /v1/completions``
(streaming and not; ``suffix``: fill in the middle), ``POST /infill`` (llama-server's, server/fim.py),
``GET /v1/models``, ``GET /health`` (503 while the models load), ``GET /metrics`` (Prometheus),
``GET /`` (the chat page, static files of the package), ``GET /docs`` and ``/openapi.json`` (the
request schemas); llama-server's ``POST /completion``, ``/tokenize``, ``/detokenize``,
``/apply-template`` and ``GET /props`` (native_api.py, with llama-server's shapes and errors).

Every error is OpenAI's JSON, ``{"error": {"message", "type", "param", "code"}}``: 400 for invalid
JSON or values (naming the field) and for a prompt longer than the context, 401 for a missing or
wrong API key, 404 for an unknown route (and, with ``strict_model``, another model's name), 413 for
a body over the limit, 503 while loading, when the queue is full (with Retry-After) or while
shutting down, 500 with the one-line reason when the engine fails. No traceback reaches a client.

A client that goes away (a closed connection, streaming or not) cancels its request: between two
steps, or between two ``n_batch`` chunks of its prompt; it is counted with status 499 in the
metrics. ``shutdown()`` (SIGTERM / Ctrl-C on ``serve``) refuses new and waiting requests and gives
the running one ``shutdown_grace`` seconds; a stream it then ends gets an error event
(code ``server_shutdown``) instead of a ``finish_reason``, so no client takes it as complete.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import CactusError
from ..options.rule import rule_of
from .logprobs import openai_chat, openai_completion
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .native_api import NATIVE_PATHS, llama_error, router as native_router
from .schemas import (ChatCompletionRequest, CompletionRequest, chat_messages, completion_prompt,
                      openai_param, to_request)
from .fim import SuffixPlan, router as fim_router
from .tools import ToolPlan
from .worker import Job, QueueFullError, ShuttingDownError, Worker

__all__ = ["ServerConfig", "create_app"]

MAX_BODY = 8 << 20  # bytes: a chat far longer than any context still fits
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "timeout": "length",
          "interrupted": "length", "cancelled": "length"}
SHUTDOWN_GRACE = 5.0  # seconds the running request may take to finish after SIGTERM / Ctrl-C


@dataclass(frozen=True)
class ServerConfig:
    """What the server was started with: the default Request of every generation, the model id
    clients see (``--alias``, else the pair's or the verifier's name), and the serve options
    (the options table). ``strict_model``: a request naming another model gets 404 (default:
    served)."""

    defaults: Any
    model_id: str
    verifier: str
    draft: str | None
    api_key: str | None = None
    strict_model: bool = False
    shutdown_grace: float = SHUTDOWN_GRACE
    request_timeout: float = 600.0
    cors_origins: tuple[str, ...] = ()
    max_body: int = MAX_BODY
    created: int = field(default_factory=lambda: int(time.time()))


def error(status: int, message: str, *, type_: str = "invalid_request_error",
          param: str | None = None, code: str | None = None, headers=None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


def _same(text: str) -> str:
    return text


def error_of(e: CactusError, redact=_same, body=None) -> JSONResponse:
    """An engine or input error as its HTTP answer (errors.py gives status and type); ``redact``
    takes this machine's paths out of the message (:class:`Redactor`); with the request's
    ``body``, options are named as its client wrote them (``speculative.draft_vocab``)."""
    headers = {"Retry-After": "1"} if e.http_status == 503 else None
    name = (lambda n: openai_param(n, body)) if body is not None else (lambda n: n)
    return error(e.http_status, redact(e.render(name)), type_=e.error_type, param=name(e.param)
                 if e.param else None, code=e.code, headers=headers)


# an absolute path: POSIX (checked against the file system, so a URL path such as /v1/models in a
# message stays) or a Windows drive path
_ABS_PATH = re.compile(r"(?<![\w.~/-])(?:[A-Za-z]:\\|/)[^\s'\"`,;()<>]*[^\s'\"`,;()<>.:]")


class Redactor:
    """What a client may read of an error: the server's message without this machine's file paths
    or model file names. Each model's paths (as given, absolute, real, and the loaded file) and
    their file names become VERIFIER and DRAFT, the names the CLI's usage gives them; any other
    absolute path on this machine becomes ``<server path>``. Library messages name files to help
    the operator (`cactus-gguf vocab /models/v.gguf ...`); the operator's log keeps them."""

    def __init__(self, config: "ServerConfig", worker: Worker) -> None:
        self.config, self.worker = config, worker

    def _known(self) -> list[tuple[str, str]]:
        """(text, replacement) pairs, longest text first."""
        engine = self.worker.engine
        found = set()
        for role, spec, attr in (("VERIFIER", self.config.verifier, "verifier"),
                                 ("DRAFT", self.config.draft, "draft")):
            ctx = getattr(engine, attr, None)
            paths = [p for p in (spec, getattr(getattr(ctx, "model", None), "path", None)) if p]
            for p in paths:
                p = os.fspath(p)
                if p == spec and not (os.sep in p or "/" in p or os.path.isfile(p)):
                    continue  # a registry name: public, not a file of this machine
                for variant in {p, os.path.abspath(p), os.path.realpath(p)}:
                    found.update({(variant, role), (os.path.basename(variant), role)})
        return sorted(found, key=lambda x: -len(x[0]))

    def __call__(self, text: str) -> str:
        for known, role in self._known():
            text = text.replace(known, role)
        return _ABS_PATH.sub(self._path, text)

    @staticmethod
    def _path(m: re.Match) -> str:
        path = m.group(0)
        if path.startswith("/"):  # a path of this machine's file system, not a URL's
            top = path.split("/")[1]
            if not top or not os.path.exists("/" + top):
                return path
        return "<server path>"


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
    # /docs and /openapi.json: the request bodies' JSON schema, the speculative object's from the
    # options table (server/speculative.py)
    app = FastAPI(title="cactus-gguf", docs_url="/docs", redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.metrics, app.state.worker, app.state.config = metrics, worker, config
    redact = app.state.redact = Redactor(config, worker)
    app.state.shutdown = lambda: worker.shutdown(config.shutdown_grace)
    _install_middleware(app, config, metrics)
    _install_error_handlers(app)
    app.include_router(native_router)  # llama-server's /completion, /tokenize, ...: native_api.py
    app.include_router(fim_router)  # llama-server's /infill: fim.py
    static = resources.files("cactus_gguf.server") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(str(static / "index.html"))

    @app.get("/health")
    async def health():
        if worker.stopping:
            return JSONResponse({"status": "stopping"}, status_code=503)
        if worker.state == "ready":
            return {"status": "ok"}
        if worker.state == "loading":
            return JSONResponse({"status": "loading"}, status_code=503,
                                headers={"Retry-After": "1"})
        if worker.state == "lost":  # an RPC server died: restart it and this server
            return error(503, redact(worker.error), type_="server_error", code="rpc_server_lost")
        return error(500, redact(f"the models failed to load: {worker.error}"),
                     type_="server_error")

    @app.get("/metrics")
    async def metrics_route():
        metrics.queue_depth.set(worker.waiting)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        # the models by name (a registry name, or the file's name), never this machine's path
        return {"object": "list", "data": [{
            "id": config.model_id, "object": "model", "created": config.created,
            "owned_by": "cactus-gguf", "verifier": os.path.basename(config.verifier),
            "draft": os.path.basename(config.draft) if config.draft else None}]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: HttpRequest):
        tools = ToolPlan.of(body)  # None: no tools, no calls in the history
        return await _generate(request, body, chat_messages(body) if tools is None else None, True,
                               config, worker, metrics, redact, plan=tools)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HttpRequest):
        fim = SuffixPlan.of(body)  # a suffix: fill in the middle
        return await _generate(request, body, completion_prompt(body) if fim is None else None,
                               False, config, worker, metrics, redact, plan=fim)

    return app


def _install_middleware(app: FastAPI, config: ServerConfig, metrics: Metrics) -> None:
    if config.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["*"], allow_headers=["*"])
    app.add_middleware(_Guard, config=config, metrics=metrics)  # outermost


class _Guard:
    """The API key, the body size limit and the request counter, as a plain ASGI middleware
    (Starlette's BaseHTTPMiddleware would hide a client's disconnect from the routes:
    ``request.is_disconnected()`` never turns true behind it)."""

    def __init__(self, app, config: ServerConfig, metrics: Metrics) -> None:
        self.app, self.config, self.metrics = app, config, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        config, metrics = self.config, self.metrics
        request = HttpRequest(scope)
        path = request.url.path
        protected = path.startswith("/v1/") or path == "/metrics"
        native = path in NATIVE_PATHS  # llama-server's endpoints: its key check and errors
        protected = protected or native
        answer = llama_error if native else error
        if protected and config.api_key and request.method != "OPTIONS":
            if not _key_matches(request, config.api_key):
                metrics.requests.labels(path, "401").inc()
                return await answer(401, "invalid or missing API key: send Authorization: Bearer "
                                        "KEY (or x-api-key: KEY)",
                                   code="invalid_api_key")(scope, receive, send)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > config.max_body:
            metrics.requests.labels(path, "413").inc()
            return await answer(413, f"the request body is {int(size)} bytes, more than the limit "
                                    f"of {config.max_body}",
                               code="request_too_large")(scope, receive, send)
        status = []

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            if status and not scope.get("state", {}).get("counted_by_stream"):
                # (a stream counts itself when it ends: 200, or 499 if the client left first)
                metrics.requests.labels(path if protected or path == "/health" else "other",
                                        str(status[0])).inc()


def _key_matches(request: HttpRequest, key: str) -> bool:
    """``Authorization: Bearer KEY`` (the scheme in any case, RFC 9110) or ``x-api-key: KEY``."""
    scheme, _, token = request.headers.get("authorization", "").strip().partition(" ")
    given = [token.strip()] if scheme.lower() == "bearer" else []
    given.append(request.headers.get("x-api-key", "").strip())
    want = key.encode()
    return any(g and hmac.compare_digest(g.encode(), want) for g in given)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        name = _field(first.get("loc", ()))
        if first.get("type") == "json_invalid":
            return error(400, f"the body is not valid JSON: {first.get('msg')}", param=None)
        message = f"{name}: {first.get('msg')}"
        if str(first.get("type", "")).endswith("_type") and "input" in first:  # strict types
            message += f", got {json.dumps(first['input'], default=str)[:60]}"
        return error(400, message, param=name)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        what = {404: f"no route {request.method} {request.url.path}"}.get(exc.status_code,
                                                                          str(exc.detail))
        return error(exc.status_code, what, code=None)

    @app.exception_handler(CactusError)
    async def cactus_error(request, exc: CactusError):
        return error_of(exc, request.app.state.redact)

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        return error(500, request.app.state.redact(f"internal error: {type(exc).__name__}: {exc}"),
                     type_="server_error")


# -------------------------------------------------------------------------------------------------
# Generation
# -------------------------------------------------------------------------------------------------

class _ClientGone(Exception):
    pass


POLL = 0.25  # seconds between two looks at the connection while a request runs


class _Watch:
    """Whether the client of a running request is still there: ``request.is_disconnected()``
    every POLL seconds, however fast the job's events come (a job that streams chunks without a
    pause must still notice a closed connection)."""

    def __init__(self, job: Job, request: HttpRequest) -> None:
        self.job, self.request = job, request
        self.checked = time.perf_counter()

    async def next_event(self):
        """The job's next event; cancels the job (and raises _ClientGone) if the client left."""
        while True:
            try:
                event = await asyncio.wait_for(self.job.events.get(), POLL)
            except asyncio.TimeoutError:
                event = None
            now = time.perf_counter()
            if event is None or now - self.checked >= POLL:
                self.checked = now
                if await self.request.is_disconnected():
                    self.job.cancel()
                    raise _ClientGone()
            if event is not None:
                return event

    async def started(self, failed: Callable[[BaseException], Response]) -> Response | None:
        """Waits for the job's first event: None once it has started, else the answer:
        ``failed(e)`` of the error that ended it before it started, a 499 when the client
        left first."""
        try:
            kind, payload = await self.next_event()
        except _ClientGone:
            return Response(status_code=499)
        return failed(payload) if kind == "error" else None

    async def answer(self, done: Callable[[str, Any], Response],
                     failed: Callable[[BaseException], Response],
                     cut_short: Callable[[ShuttingDownError], Response],
                     piece: Callable[[Any], str] = lambda chunk: chunk.text) -> Response:
        """The answer to a request that is not streamed, once its job ends: ``done(text,
        result)`` of the chunks' ``piece(chunk)`` joined and the GenerationResult;
        ``failed(e)`` of the engine's error; ``cut_short(e)`` of a ShuttingDownError (code
        ``server_shutdown``, the count of tokens sent) when the server's shutdown cut the reply
        short; a 499 when the client left first."""
        text = []
        try:
            while True:
                kind, payload = await self.next_event()
                if kind == "chunk":
                    text.append(piece(payload))
                elif kind == "done":
                    if self.job.stopped_by == "shutdown":
                        return cut_short(ShuttingDownError(_cut_short(payload)))
                    return done("".join(text), payload)
                elif kind == "error":
                    return failed(payload)
        except _ClientGone:
            return Response(status_code=499)


def _engine_error(payload, redact, body) -> JSONResponse:
    return error_of(payload, redact, body) if isinstance(payload, CactusError) else error(
        500, redact(str(payload)), type_="server_error")


async def _generate(request: HttpRequest, body, prompt, chat: bool, config: ServerConfig,
                    worker: Worker, metrics: Metrics, redact: Redactor, plan=None):
    """``plan``: a prompt that needs the loaded model (tools: server/tools.py, a FIM suffix:
    server/fim.py); its ``prepare(engine, req)`` gives the prompt and the request, its
    ``reply()`` the shaper of a reply with tool calls (or None)."""
    if worker.state == "lost":
        return error(503, redact(worker.error), type_="server_error", code="rpc_server_lost")
    if worker.stopping:
        return error_of(ShuttingDownError())
    if worker.state != "ready":
        return error(503, "the models are still loading" if worker.state == "loading"
                     else redact(f"the models failed to load: {worker.error}"),
                     type_="server_error", code="not_ready", headers={"Retry-After": "1"})
    if config.strict_model and body.model is not None and \
            body.model not in (config.model_id, config.verifier):
        return error(404, f"model {body.model!r} not found: this server serves "
                          f"{config.model_id!r} (GET /v1/models)", param="model",
                     code="model_not_found")
    req = to_request(config.defaults, body)
    if plan is not None:
        prompt, req = plan.prepare(worker.engine, req)
    job = Job(prompt=prompt, request=req, chat=chat and plan is None,
              loop=asyncio.get_running_loop(),
              deadline=time.perf_counter() + config.request_timeout)
    try:
        worker.submit(job)
    except QueueFullError as e:
        return error_of(e)
    watch = _Watch(job, request)
    refused = await watch.started(lambda e: _engine_error(e, redact, body))
    if refused is not None:
        return refused
    shape = _Shape(chat, config.model_id, req, plan.reply() if plan is not None else None)
    if shape.tools is not None:  # a stop string in the content ends the job (server/tools.py)
        shape.tools.on_stop = lambda: job.cancel("stop")
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        request.state.counted_by_stream = True  # its status is known only at its end
        # on shutdown, sse-starlette would cut the stream at once (a silent end): it waits while
        # the worker's grace runs and the stream sends its own last event
        return EventSourceResponse(_sse(job, request, shape, include_usage, metrics, redact),
                                   ping=15, shutdown_grace_period=config.shutdown_grace + 5)
    return await watch.answer(lambda text, result: shape.response(text, result, job.stopped_by),
                              lambda e: _engine_error(e, redact, body), error_of,
                              # tool calls: parsed as the text comes, so a stop string in the
                              # content ends the job
                              **({} if shape.tools is None else
                                 {"piece": lambda chunk: shape.tools.take(chunk.text)}))


def _cut_short(result) -> str:
    return (f"the server is shutting down: this reply was cut short after "
            f"{result.stats.n_tokens} tokens; send the request again when it is back")


def _error_event(e, redact=_same) -> dict:
    return {"data": json.dumps({"error": {
        "message": redact(str(e)), "type": getattr(e, "error_type", "server_error"),
        "param": getattr(e, "param", None), "code": getattr(e, "code", None)}})}


async def _sse(job: Job, request: HttpRequest, shape: "_Shape", include_usage: bool,
               metrics: Metrics, redact: Redactor):
    """The SSE events of a streaming response: OpenAI's chunks, then ``[DONE]``. A stream the
    server's shutdown ends early gets an error event (code ``server_shutdown``) in place of the
    chunk with a ``finish_reason``. Counted in the metrics when it ends: 200, 499 when the client
    left first, 503 when the shutdown cut it."""
    status = "499"  # unless it gets to its end
    try:
        yield {"data": json.dumps(shape.chunk(role=True))}
        while True:
            kind, payload = await job.events.get()
            if kind == "chunk":
                yield {"data": json.dumps(shape.chunk(text=payload.text,
                                                      segments=payload.segments,
                                                      logprobs=payload.logprobs))}
            elif kind == "done":
                if job.stopped_by == "shutdown":
                    status = "503"
                    yield _error_event(ShuttingDownError(_cut_short(payload)))
                else:
                    yield {"data": json.dumps(shape.chunk(result=payload,
                                                          stopped_by=job.stopped_by))}
                    if include_usage:
                        yield {"data": json.dumps(shape.usage_chunk(payload))}
                break
            else:
                status = "500"
                yield _error_event(payload, redact)
                break
        yield {"data": "[DONE]"}
        if status == "499":
            status = "200"
    finally:
        job.cancel()  # the client left mid-stream (or the stream ended): stop within one step
        metrics.requests.labels(request.url.path, status).inc()


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
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def speculative(self, result) -> dict:
        """The speculative block: what speculation did for this request."""
        s, r = result.stats, self.request
        speculates = r.speculates
        # the whole rule that ran, each setting where it applies, null elsewhere (options/rule.py;
        # k = 0 reports method none: the verifier alone), then what it did
        return {**rule_of(r),
                # AL: accepted drafts per step, the residual / bonus token not counted (vLLM's
                # mean acceptance length is AL + 1; stats.py's glossary)
                "acceptance_length": s.mean_accepted_length, "acceptance_rate": s.acceptance_rate,
                "tokens_per_verifier_call": s.tokens_per_verifier_call, "kl_mean": s.kl_mean,
                "kl_max": s.kl_max, "output_kl_mean": s.output_kl_mean,
                "output_kl_max": s.output_kl_max, "output_kl_sum": s.output_kl_sum,
                "draft_seconds": s.draft_seconds,
                "verify_seconds": s.verify_seconds, "prefill_seconds": s.prefill_seconds,
                "first_token_seconds": s.first_token_seconds,
                "tokens_per_second": s.tokens_per_second,
                "prompt_tokens_reused": s.n_prompt_tokens_reused,
                "draft_stopped_at": s.draft_stopped_at,
                # how the draft's tokens reached the verifier, and (another vocabulary) the
                # verifier's mass on the tokens it could propose: README "Foreign drafts"
                "draft_vocab": s.draft_vocab if speculates else None,
                "vocab_coverage": s.vocab_coverage if speculates else None,
                "seed": result.seed}

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
            message = self.tools.message(text, finish)
            finish = self.tools.finish_reason(finish)
        choice = ({"index": 0, "message": message,
                   "finish_reason": finish, "logprobs": self.logprobs(result.logprobs)} if self.chat else
                  {"index": 0, "text": text, "finish_reason": finish,
                   "logprobs": self.logprobs(result.logprobs)})
        return {**self._head(False), "choices": [choice], "usage": self.usage(result),
                "speculative": self.speculative(result)}

    def chunk(self, *, role: bool = False, text: str | None = None, segments=None, result=None,
              stopped_by: str = "", logprobs=None) -> dict:
        finish = None if result is None else FINISH.get(stopped_by or result.stop_reason, "stop")
        if result is not None and result.logprobs is not None:  # the tokens no chunk carried
            logprobs = result.logprobs[self._sent:]
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else (
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
            out["speculative"] = self.speculative(result)
        return out

    def usage_chunk(self, result) -> dict:
        return {**self._head(True), "choices": [], "usage": self.usage(result)}
