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

import hmac
import os
import re
import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from fastapi import FastAPI, Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import CactusError
from .core import not_ready
from .cors import CanonicalHeaders, LlamaCors
from .fim import router as fim_router
from .http_errors import error, error_of, invalid_body, llama_error
from .metrics import CONTENT_TYPE_LATEST, Metrics
from .native_api import is_native, model_facts, router as native_router
from .slots_api import router as slots_router
from .report import build_info
from .anthropic import router as anthropic_router
from .openai_api import router as openai_router
from .responses import router as responses_router
from .worker import Worker

__all__ = ["ServerConfig", "create_app"]

MAX_BODY = 8 << 20  # bytes: a chat far longer than any context still fits
SHUTDOWN_GRACE = 5.0  # seconds the running request may take to finish after SIGTERM / Ctrl-C
# no API key asked (llama-server's public endpoints, and this server's page and request schemas)
PUBLIC_PATHS = frozenset({"/health", "/v1/health", "/", "/docs", "/openapi.json", "/sw.js",
                          "/manifest.webmanifest", "/_app/version.json"})
# the reads a monitor polls: they neither wake sleeping models nor count in cactus_requests, so
# scraping an idle (or sleeping) server reads the same text each time, as llama-server's
MONITORING_PATHS = frozenset({"/health", "/v1/health", "/metrics", "/props", "/models",
                              "/v1/models"})


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
    slots: bool = True  # GET /slots served (--no-slots: 501)
    n_parallel: int = 1  # slots (--parallel): what a slot id is checked against before a load
    ui: bool = True  # the chat page at / (--no-ui: 404)
    slot_save_path: str | None = None  # the folder of /slots' save and restore (None: refused)
    metrics: bool = False  # GET /metrics served (without --metrics: 501, as llama-server)
    verbose: bool = False  # -v: OpenAI answers carry __verbose unless a request says (llama-server)
    aliases: tuple[str, ...] = ()  # every name of the model (--alias a,b,c), the id among them
    tags: tuple[str, ...] = ()  # --tags, listed on /models
    gcp: GcpCompat | None = None  # Vertex AI's prediction route (AIP_MODE=PREDICTION)
    max_body: int = MAX_BODY
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass(frozen=True)
class GcpCompat:
    """Google Vertex AI's custom-container contract (its ``AIP_*`` environment variables), as
    llama-server serves it: ``POST predict_route`` takes ``{"instances": [...]}``, each instance
    a body for the route its ``@requestFormat`` names (``chatCompletions``: the route's path
    without ``/v1`` in camel case, or the path itself), and answers ``{"predictions": [...]}``,
    one reply per instance in order (an instance's error is its prediction); ``health_route``
    (when not empty) answers as ``/health``."""

    port: int = 8080
    predict_route: str = "/predict"
    health_route: str = ""


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


def create_app(worker: Worker, config: ServerConfig, metrics: Metrics | None = None) -> FastAPI:
    """The app serving ``worker``'s engine with ``config``."""
    metrics = metrics or Metrics()
    worker.on_finish = lambda job, result, waited: (metrics.finished(result.stats)
                                                   if result is not None else None)
    # while the models sleep, /props answers from what they were
    worker.on_sleep = lambda engine: setattr(app.state, "model_facts", model_facts(engine))
    # /docs and /openapi.json: the request bodies' JSON schema, the speculative object's from the
    # options table (server/speculative.py)
    app = FastAPI(title="cactus-gguf", docs_url="/docs", redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.metrics, app.state.worker, app.state.config = metrics, worker, config
    redact = app.state.redact = Redactor(config, worker)
    app.state.shutdown = lambda: worker.shutdown(config.shutdown_grace)
    paths: set[str] = set()  # filled below, once every route is there
    _install_middleware(app, config, metrics, paths)
    _install_error_handlers(app)
    app.include_router(openai_router)  # /v1/chat/completions, /v1/completions: openai_api.py
    app.include_router(responses_router)  # /v1/responses: responses.py
    app.include_router(anthropic_router)  # /v1/messages: anthropic.py
    app.include_router(native_router)  # llama-server's /completion, /tokenize, ...: native_api.py
    app.include_router(slots_router)  # llama-server's /slots: slots_api.py
    app.include_router(fim_router)  # llama-server's /infill: fim.py
    _install_page(app, config)

    @app.get("/health")
    @app.get("/v1/health")
    async def health():
        if worker.stopping:
            return JSONResponse({"status": "stopping"}, status_code=503)
        if worker.state == "loading":
            return JSONResponse({"status": "loading"}, status_code=503,
                                headers={"Retry-After": "1"})
        refused = not_ready(worker)  # an RPC server died (503), the models failed to load (500)
        return {"status": "ok"} if refused is None else error_of(refused, redact)

    @app.get("/metrics")
    async def metrics_route():
        if not config.metrics:
            return llama_error(501, "this server does not serve metrics: start it with --metrics")
        engine = worker.engine  # (None while the models sleep)
        metrics.state(waiting=worker.waiting, processing=worker.processing,
                      slots=[(s.id, s.busy, s.verifier.n_past)
                             for s in getattr(engine, "slots", ())])
        # llama-server's header: when this process started (Unix seconds; its spelling:
        # CanonicalHeaders, server/cors.py)
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST,
                        headers={"Process-Start-Time-Unix": str(config.created)})

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        # the models by name (a registry name, or the file's name), never this machine's path
        return {"object": "list", "data": [{
            "id": config.model_id, "object": "model", "created": config.created,
            "owned_by": "cactus-gguf", "aliases": sorted(config.aliases or (config.model_id,)),
            "tags": sorted(config.tags), "verifier": os.path.basename(config.verifier),
            "draft": os.path.basename(config.draft) if config.draft else None}]}

    if config.gcp is not None:
        _install_gcp(app, config.gcp, health)

    paths.update(p for p in _route_paths(app.routes) if p not in ("/", "/static"))
    paths.update(PUBLIC_PATHS - {"/"})
    return app


def _install_page(app: FastAPI, config: ServerConfig) -> None:
    """The chat page (``/``, its files under ``/static``) and the three files that
    llama-server's web UI has at fixed paths, which browsers and PWA tools ask for: the page's
    web app manifest, SvelteKit's ``/_app/version.json`` (this server's build) and ``/sw.js``, a
    service worker that removes one a browser kept from llama-server's UI (static/sw.js; served
    with ``--no-ui`` too, as llama-server's). All public, revalidated on each use."""
    static = resources.files("cactus_gguf.server") / "static"
    app.mount("/static", StaticFiles(directory=str(static)), name="static")
    no_ui = "this server was started with --no-ui: no chat page"
    fresh = {"Cache-Control": "no-cache"}

    @app.get("/", include_in_schema=False)
    async def page():
        return FileResponse(str(static / "index.html")) if config.ui else error(404, no_ui)

    @app.get("/manifest.webmanifest", include_in_schema=False)
    async def manifest():
        if not config.ui:
            return error(404, no_ui)
        return FileResponse(str(static / "manifest.webmanifest"), headers=fresh,
                            media_type="application/manifest+json")

    @app.get("/_app/version.json", include_in_schema=False)
    async def ui_version():
        return JSONResponse({"version": build_info()}, headers=fresh) if config.ui \
            else error(404, no_ui)

    @app.get("/sw.js", include_in_schema=False)
    async def service_worker():
        return FileResponse(str(static / "sw.js"), media_type="application/javascript",
                            headers=fresh)


MAX_INSTANCES = 128  # Vertex AI instances per prediction (llama-server's limit)


def _gcp_format(path: str) -> str:
    """A route's ``@requestFormat`` name, as llama-server derives it: the path without its
    ``/v1`` and leading slash, each ``/``, ``-`` or ``_`` dropped and the next letter upper-cased,
    up to a path parameter (``/v1/chat/completions`` -> ``chatCompletions``)."""
    text = path[3:] if path.startswith("/v1") and len(path) > 3 else path
    text = text.removeprefix("/").split("{")[0]
    words = re.split(r"[/_-]", text)
    return words[0] + "".join(w[:1].upper() + w[1:] for w in words[1:])


def _install_gcp(app: FastAPI, gcp: GcpCompat, health) -> None:
    """Vertex AI's prediction route (:class:`GcpCompat`): each instance is served by the route
    it names, inside this process (an ASGI call of this app with the prediction's headers, so
    the API key and the metrics apply to it as to any request), one after another, as the one
    engine serves requests; never streamed."""
    import json

    if gcp.health_route:
        app.add_api_route(gcp.health_route, health, methods=["GET"], include_in_schema=False)
    posts: dict[str, str] = {}  # @requestFormat -> path, the first route of a name winning
    for route in _all_routes(app.routes):
        if "POST" in (getattr(route, "methods", None) or ()):
            posts.setdefault(_gcp_format(route.path), route.path)
            posts.setdefault(route.path, route.path)

    def failed(message: str, type_: str = "invalid_request_error") -> dict:
        return {"error": {"code": 400 if type_ == "invalid_request_error" else 500,
                          "message": message, "type": type_}}

    async def one(request: HttpRequest, instance) -> Any:
        if not isinstance(instance, dict):
            return failed("each instance must be a JSON object")
        name = instance.get("@requestFormat")
        if not isinstance(name, str):
            return failed("each instance must include a string @requestFormat")
        if name not in posts:
            return failed(f"no route for @requestFormat {name!r}")
        payload = {k: v for k, v in instance.items() if k != "@requestFormat"}
        if "stream" in payload:
            payload["stream"] = False  # a prediction is one JSON answer
        body = json.dumps(payload).encode()
        headers = [(k, v) for k, v in request.scope["headers"]
                   if k not in (b"content-type", b"content-length")]
        headers += [(b"content-type", _JSON), (b"content-length", str(len(body)).encode())]
        scope = {**request.scope, "path": posts[name], "raw_path": posts[name].encode(),
                 "headers": headers, "state": {}}
        sent = [False]

        async def receive():
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await request.receive()  # (blocks until the prediction's client leaves)

        parts: list[bytes] = []

        async def send(message) -> None:
            if message["type"] == "http.response.body":
                parts.append(message.get("body", b""))

        await app(scope, receive, send)
        data = b"".join(parts)
        if not data:
            return None
        try:
            return json.loads(data)
        except ValueError:
            return data.decode("utf-8", "replace")

    @app.post(gcp.predict_route, include_in_schema=False)
    async def predict(request: HttpRequest):
        try:
            data = json.loads(await request.body())
        except ValueError as e:
            return llama_error(400, f"the body is not JSON: {e}")
        if not isinstance(data, dict):
            return llama_error(400, "the request body must be a JSON object")
        instances = data.get("instances")
        if not isinstance(instances, list):
            return llama_error(400, "the request body must have an array named instances",
                               param="instances")
        if len(instances) > MAX_INSTANCES:
            return llama_error(400, f"instances has {len(instances)} items, more than "
                                    f"{MAX_INSTANCES}", param="instances")
        return {"predictions": [await one(request, instance) for instance in instances]}


def _route_paths(routes) -> list[str]:
    """The paths of ``routes``, those of included routers too (FastAPI includes them lazily)."""
    return [route.path for route in _all_routes(routes)]


def _all_routes(routes) -> list:
    """``routes`` with those of included routers in their place."""
    out = []
    for route in routes:
        if hasattr(route, "path"):
            out.append(route)
        elif hasattr(route, "original_router"):
            out += _all_routes(route.original_router.routes)
    return out


def _install_middleware(app: FastAPI, config: ServerConfig, metrics: Metrics,
                        paths: set[str]) -> None:
    app.add_middleware(_Guard, config=config, metrics=metrics, paths=paths)
    if config.cors_origins:  # outside the guard: its 401 and 413 carry them too (llama-server's)
        app.add_middleware(LlamaCors, origins=config.cors_origins)
    app.add_middleware(CanonicalHeaders)  # outermost: header names as llama-server spells them


class _Guard:
    """The API key, the body size limit and the request counter, as a plain ASGI middleware
    (Starlette's BaseHTTPMiddleware would hide a client's disconnect from the routes:
    ``request.is_disconnected()`` never turns true behind it)."""

    def __init__(self, app, config: ServerConfig, metrics: Metrics, paths: set[str]) -> None:
        self.app, self.config, self.metrics = app, config, metrics
        self.paths = paths  # the app's routes, counted by path (any other path: "other")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        config, metrics = self.config, self.metrics
        request = HttpRequest(scope)
        path = request.url.path
        # every route but the public ones (llama-server's: the health check and the page)
        protected = path not in PUBLIC_PATHS and not path.startswith("/static/")
        native = is_native(path)  # llama-server's endpoints: its key check and errors
        answer = llama_error if native else error
        if protected and config.api_key and request.method != "OPTIONS":
            if not _key_matches(request, config.api_key):
                metrics.requests.labels(path, "401").inc()
                # llama-server's type on every route (OpenAI's clients read the status and code)
                return await answer(401, "invalid or missing API key: send Authorization: Bearer "
                                        "KEY (or x-api-key: KEY)", type_="authentication_error",
                                   code="invalid_api_key")(scope, receive, send)
        if request.method == "POST":
            _read_body_as_json(scope)
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
            if status and not scope.get("state", {}).get("counted_by_stream") \
                    and path not in MONITORING_PATHS:
                # (a stream counts itself when it ends: 200, or 499 if the client left first)
                metrics.requests.labels(path if path in self.paths else "other",
                                        str(status[0])).inc()


_JSON = b"application/json"


def _read_body_as_json(scope) -> None:
    """A body is JSON whatever its Content-Type says, as llama-server reads it (curl's ``-d``
    sends application/x-www-form-urlencoded, a browser's ``fetch`` with a string body
    text/plain): the header is set to application/json for the routes' parsers."""
    headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
    given = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
    kind = given.split(b";")[0].strip().lower()
    if kind == _JSON or kind.endswith(b"+json"):
        return
    scope["headers"] = [*headers, (b"content-type", _JSON)]


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
        message, name = invalid_body(exc)
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
