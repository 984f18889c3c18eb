"""The request core every route runs on: whether the engine can take a request, a job's start and
its refusals, the watch on the client's connection, the gathering of a reply that is not
streamed, and the one stream loop with its status counting.

Each API (OpenAI in app.py, llama-server's native routes in native_api.py and fim.py, the Responses
and Anthropic APIs in responses.py and anthropic.py) parses its body into a job and formats the
job's events; none runs a loop of its own, so a refusal, a queue timeout, a shutdown or a client
that leaves is answered the same way on every route, each in its own API's error shape.

Status counting: a reply that is not streamed is counted by the guard middleware from its HTTP
status; a stream counts itself when it ends (200; 499 when the client left first; 503 when the
server's shutdown cut it; 500 when the engine failed).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Callable, Iterable

from fastapi import Request as HttpRequest
from fastapi.responses import Response

from ..errors import CactusError, CapacityError, EngineError
from .worker import Job, ShuttingDownError

__all__ = ["ClientGone", "Watch", "cut_short", "not_ready", "submit", "stream", "POLL"]

POLL = 0.25  # seconds between two looks at the connection while a request runs


class NotReadyError(CapacityError):
    """The models are still loading (HTTP 503 with Retry-After)."""

    code = "not_ready"


class LoadFailedError(EngineError):
    """The models failed to load: nothing can be served until the server is restarted."""

    code = "load_failed"


class RpcLostError(CapacityError):
    """An RPC server holding the verifier's layers died: restart it, then this server."""

    code = "rpc_server_lost"


def not_ready(worker) -> CactusError | None:
    """Why the engine cannot take a request now (each API formats it), or None when it can."""
    if worker.state == "lost":
        return RpcLostError(worker.error)
    if worker.stopping:
        return ShuttingDownError()
    if worker.state == "loading":
        return NotReadyError("the models are still loading: retry in a moment")
    if worker.state not in ("ready", "sleeping"):  # (a sleeping engine loads again for a job)
        return LoadFailedError(f"the models failed to load: {worker.error}")
    return None


class ClientGone(Exception):
    """The client closed its connection; its job is cancelled."""


def cut_short(result) -> str:
    """The message of a reply the server's shutdown ended: how much of it was sent."""
    return (f"the server is shutting down: this reply was cut short after "
            f"{result.stats.n_tokens} tokens; send the request again when it is back")


class Watch:
    """Whether the client of a running request is still there: ``request.is_disconnected()``
    every POLL seconds, however fast the job's events come (a job that streams chunks without a
    pause must still notice a closed connection)."""

    def __init__(self, job: Job, request: HttpRequest) -> None:
        self.job, self.request = job, request
        self.checked = time.perf_counter()

    async def next_event(self):
        """The job's next event; cancels the job (and raises ClientGone) if the client left."""
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
                    raise ClientGone()
            if event is not None:
                return event

    async def started(self, failed: Callable[[BaseException], Response]) -> Response | None:
        """Waits for the job's first event: None once it has started, else the answer:
        ``failed(e)`` of the error that ended it before it started (a bad prompt, a queue
        timeout, the shutdown), a 499 when the client left first."""
        try:
            kind, payload = await self.next_event()
        except ClientGone:
            return Response(status_code=499)
        return failed(payload) if kind == "error" else None

    async def answer(self, done: Callable[[str, Any], Any],
                     failed: Callable[[BaseException], Response],
                     piece: Callable[[Any], str] = lambda chunk: chunk.text) -> Any:
        """The answer to a request that is not streamed, once its job ends: ``done(text,
        result)`` of the chunks' ``piece(chunk)`` joined and the GenerationResult;
        ``failed(e)`` of the engine's error, or of a ShuttingDownError (code
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
                        return failed(ShuttingDownError(cut_short(payload)))
                    return done("".join(text), payload)
                elif kind == "error":
                    return failed(payload)
        except ClientGone:
            return Response(status_code=499)


async def submit(worker, job: Job, request: HttpRequest,
                 failed: Callable[[BaseException], Response]) -> Watch | Response:
    """Queues ``job`` and waits for its start: its Watch, or the answer refusing it
    (``failed(e)``: a full queue, an error before the first step, a queue timeout, the shutdown;
    a 499 when the client left first)."""
    try:
        worker.submit(job)
    except CactusError as e:  # QueueFullError, ShuttingDownError
        return failed(e)
    watch = Watch(job, request)
    refused = await watch.started(failed)
    return refused if refused is not None else watch


async def stream(job: Job, request: HttpRequest, metrics, *,
                 chunk: Callable[[Any], Iterable[dict]], done: Callable[[Any], Iterable[dict]],
                 failed: Callable[[BaseException], Iterable[dict]],
                 head: Iterable[dict] = (),
                 progress: Callable[[Any], Iterable[dict]] = lambda p: ()
                 ) -> AsyncIterator[dict]:
    """The SSE events of a started job (sse-starlette's dicts): ``head``, then ``progress(p)``
    for each report of its prompt processing (the request's ``return_progress``: a
    speculative.session.Progress), ``chunk(c)`` for each chunk (its ``stats`` set under
    ``timings_per_token``), then ``done(result)``; ``failed(e)`` in place of ``done`` when the
    engine fails or the server's shutdown cuts the reply (a ShuttingDownError, code
    ``server_shutdown``), so no client takes a cut reply as complete. Counted in the metrics
    when it ends (module docstring). Marks the request so that the guard middleware does not
    count it too."""
    request.state.counted_by_stream = True
    status = "499"  # unless it gets to its end
    try:
        for event in head:
            yield event
        while True:
            kind, payload = await job.events.get()
            if kind == "chunk":
                for event in chunk(payload):
                    yield event
            elif kind == "progress":
                for event in progress(payload):
                    yield event
            elif kind == "done":
                if job.stopped_by == "shutdown":
                    status = "503"
                    events = failed(ShuttingDownError(cut_short(payload)))
                else:
                    status = "200"
                    events = done(payload)
                for event in events:
                    yield event
                break
            else:
                status = "500"
                for event in failed(payload):
                    yield event
                break
    finally:
        job.cancel()  # the client left mid-stream (or the stream ended): stop within one step
        metrics.requests.labels(request.url.path, status).inc()
