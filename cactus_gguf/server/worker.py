"""One thread owns the engine: it loads the models, then serves queued jobs one at a time, in
arrival order, streaming each job's chunks back to the asyncio side.

A job is cancelled (client gone, server stopping) or runs out of time between two steps: the
engine then stops it within one verification step and the next job starts. Whatever a job does
(bad input, a failed decode, a disconnect), the engine is ready for the next one: the engine
restores its caches per request and a failed step leaves it consistent.
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import CapacityError, EngineError, InputError
from ..llama.devices import RpcServerLostError

__all__ = ["Job", "Worker", "QueueFullError"]


class QueueFullError(CapacityError):
    """Too many requests are waiting for the engine (HTTP 503 with Retry-After)."""

    code = "queue_full"


@dataclass
class Job:
    """One request for the engine: a prompt (text, token ids, or chat messages) and its Request.

    ``events`` receives ("started", None), then ("chunk", Chunk) ..., then ("done",
    GenerationResult) or ("error", exception), on the event loop that created the job.
    ``stopped_by``: why it ended early ("cancelled", "timeout"), else "".
    """

    prompt: Any
    request: Any
    chat: bool
    loop: asyncio.AbstractEventLoop
    deadline: float
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    stopped_by: str = ""
    enqueued: float = field(default_factory=time.perf_counter)

    def put(self, kind: str, payload: Any) -> None:
        """From the worker thread: hand an event to the job's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def cancel(self) -> None:
        self.cancelled.set()


class Worker:
    """The engine's thread. ``state``: "loading", "ready" or "failed" (``error`` says why).

    Args:
        load: called in the worker thread, returns the Engine.
        max_queue: most jobs waiting (not counting the one running); submit() beyond it raises
            QueueFullError.
        on_finish: called in the worker thread with (job, result or None, seconds waited).
    """

    def __init__(self, load: Callable[[], Any], max_queue: int,
                 on_finish: Callable[[Job, Any, float], None] | None = None) -> None:
        self._load = load
        self.max_queue = max_queue
        self.on_finish = on_finish or (lambda *a: None)
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._outstanding = 0  # submitted and not finished: the running job and those waiting
        self._lock = threading.Lock()
        self.state, self.error = "loading", ""
        self.engine = None
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cactus-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def waiting(self) -> int:
        """Jobs queued behind the running one."""
        return max(0, self._outstanding - 1)

    def submit(self, job: Job) -> None:
        """Queue ``job``; QueueFullError when one job runs and max_queue jobs already wait."""
        with self._lock:
            if self._outstanding > self.max_queue:
                raise QueueFullError(f"the server is busy: {self._outstanding - 1} requests are "
                                     f"waiting (--max-queue {self.max_queue}); retry shortly")
            self._outstanding += 1
        self._jobs.put(job)

    def stop(self, timeout: float = 30.0) -> None:
        """Cancel what runs, end the thread, free the models (in the thread that made them)."""
        self._jobs.put(None)
        self._thread.join(timeout)

    # -- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.engine = self._load()
            self.state = "ready"
        except BaseException as e:  # noqa: BLE001 - reported through /health and the CLI
            self.state, self.error = "failed", str(e) or type(e).__name__
            self.ready.set()
            return
        self.ready.set()
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    break
                try:
                    self._serve(job)
                finally:
                    with self._lock:
                        self._outstanding -= 1
        finally:
            self.engine.close()
            self.state = "stopped"

    def _serve(self, job: Job) -> None:
        waited = time.perf_counter() - job.enqueued
        if job.cancelled.is_set():
            job.put("error", InputError("the client went away before its turn"))
            self.on_finish(job, None, waited)
            return
        if time.perf_counter() > job.deadline:
            job.put("error", CapacityError("the request timed out waiting for the engine "
                                           "(--timeout)"))
            self.on_finish(job, None, waited)
            return
        result = None
        try:
            prompt = self.engine.format_chat(job.prompt) if job.chat else job.prompt
            stream = self.engine.stream(prompt, job.request)
            job.put("started", None)
            for chunk in stream.steps():
                if chunk is not None:
                    job.put("chunk", chunk)
                if job.cancelled.is_set() or time.perf_counter() > job.deadline:
                    job.stopped_by = "cancelled" if job.cancelled.is_set() else "timeout"
                    break
            result = stream.result if stream.result is not None else stream.partial(job.stopped_by)
            stream.close()
            job.put("done", result)
        except RpcServerLostError as e:  # every later request would fail too: /health says so
            self.state, self.error = "lost", str(e)
            job.put("error", e)
        except (InputError, CapacityError, EngineError) as e:
            job.put("error", e)
        except Exception as e:  # noqa: BLE001 - an engine failure must not end the server
            job.put("error", EngineError(f"{type(e).__name__}: {e}"))
        self.on_finish(job, result, waited)
