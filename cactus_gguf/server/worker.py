"""One thread owns the engine: it loads the models, then serves queued jobs in arrival order,
streaming each job's chunks back to the asyncio side. As many jobs run at once as the engine has
slots (``--parallel``): each on its own slot, their steps taken in turn (one step, or one prompt,
of each running job per round); the others wait in the queue.

A job is cancelled (client gone, server stopping) or runs out of time between two steps, or
between two ``n_batch`` chunks of its prompt: the engine then stops it there and the next job
starts. ``shutdown(grace)`` refuses every job not yet running and ends the running ones after
``grace`` seconds (``stopped_by`` "shutdown"). Whatever a job does
(bad input, a failed decode, a disconnect), the engine is ready for the next one: the engine
restores its caches per request and a failed step leaves it consistent.

Sleep (``sleep_idle``, llama-server's ``--sleep-idle-seconds``): after that many seconds without
a job or a route's use of the engine (:meth:`Worker.awake`), the thread frees the engine (both
models, their contexts) and ``state`` reads "sleeping"; the next job loads it again first, and so
does :meth:`Worker.awake`, through a job of its own. A route that holds the engine it got from
``awake`` keeps it loaded for ``sleep_idle`` seconds (at least 1), far longer than any route's own
use of it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import CapacityError, EngineError, InputError
from ..llama.devices import RpcServerLostError
from ..speculative.together import DONE

__all__ = ["Job", "Worker", "QueueFullError", "ShuttingDownError"]

log = logging.getLogger(__name__)


class QueueFullError(CapacityError):
    """Too many requests are waiting for the engine (HTTP 503 with Retry-After)."""

    code = "queue_full"


class ShuttingDownError(CapacityError):
    """The server is stopping (SIGTERM / Ctrl-C): HTTP 503, or a stream's error event."""

    code = "server_shutdown"

    def __init__(self, message: str = "the server is shutting down: send the request again when "
                                      "it is back") -> None:
        super().__init__(message)


@dataclass
class Job:
    """One request for the engine: a prompt (text, token ids, or chat messages) and its Request.

    ``events`` receives ("started", None) (after ``prepare``, when given), then ("chunk",
    Chunk) ..., then ("done", GenerationResult) or ("error", exception), on the event loop that
    created the job; with the request's ``return_progress``, ("progress", Progress) events
    while its prompt is processed (between "started" and the first chunk); with its
    ``timings_per_token``, each Chunk carries its ``stats``.
    ``stopped_by``: why it ended early ("cancelled": the client left, "timeout", "shutdown"),
    else "".
    """

    prompt: Any
    request: Any
    chat: bool
    loop: asyncio.AbstractEventLoop
    deadline: float
    # run on the worker before the job starts, with the engine: (prompt, request) from what the
    # loaded models know (a chat template with tools, a FIM prompt, tokens); its InputError
    # refuses the job as any other error before the first step does
    prepare: Callable[[Any], tuple[Any, Any]] | None = None
    # instead of a generation: run on the worker with the engine (a slot's save or restore);
    # its return value is the "done" event's payload
    task: Callable[[Any], Any] | None = None
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    stopped_by: str = ""
    cancel_reason: str = "cancelled"
    id_slot: int = 0  # the slot its generation runs on (set before "started")
    enqueued: float = field(default_factory=time.perf_counter)

    def put(self, kind: str, payload: Any) -> None:
        """From the worker thread: hand an event to the job's event loop."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the job at the engine's next check; the first reason given is kept."""
        if not self.cancelled.is_set():
            self.cancel_reason = reason
        self.cancelled.set()

    def should_stop(self) -> bool:
        """The engine's cancel check: cancelled, or past the deadline."""
        return self.cancelled.is_set() or time.perf_counter() > self.deadline


class Worker:
    """The engine's thread. ``state``: "loading", "ready" or "failed" (``error`` says why).

    Args:
        load: called in the worker thread, returns the Engine.
        max_queue: most jobs waiting (not counting the one running); submit() beyond it raises
            QueueFullError.
        on_finish: called in the worker thread with (job, result or None, seconds waited).
    """

    def __init__(self, load: Callable[[], Any], max_queue: int,
                 on_finish: Callable[[Job, Any, float], None] | None = None,
                 sleep_idle: float | None = None) -> None:
        self._load = load
        self.max_queue = max_queue
        self.on_finish = on_finish or (lambda *a: None)
        self.sleep_idle = sleep_idle  # seconds idle before the engine is freed (None: never)
        # called in the worker thread with the engine just before sleep frees it (what the
        # read-only routes answer from while it sleeps)
        self.on_sleep: Callable[[Any], None] = lambda engine: None
        self._last_use = time.monotonic()
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._outstanding = 0  # submitted and not finished: the running job and those waiting
        self._lock = threading.Lock()
        self.state, self.error = "loading", ""
        self.exception: BaseException | None = None
        self.stopping = False  # shutdown() was called: no new job starts
        self._running: list[Job] = []  # the jobs running now, at most one per slot
        self.engine = None
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cactus-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def sleeping(self) -> bool:
        """The engine was freed for idleness; the next job loads it again."""
        return self.state == "sleeping"

    async def awake(self):
        """The engine, for a route that uses it directly (tokenize, a template, a count): loaded
        again first when it sleeps, through a job queued as any other. Raises what that load
        raised. Each call restarts the idle time."""
        while True:
            with self._lock:
                if self.engine is not None:
                    self._last_use = time.monotonic()
                    return self.engine
            job = Job(prompt=None, request=None, chat=False, loop=asyncio.get_running_loop(),
                      deadline=math.inf, task=lambda engine: None)
            self.submit(job)
            while (event := await job.events.get())[0] not in ("done", "error"):
                pass
            if event[0] == "error":
                raise event[1]

    @property
    def busy(self) -> bool:
        """A job is running."""
        return bool(self._running)

    @property
    def waiting(self) -> int:
        """Jobs queued behind the running ones."""
        return max(0, self._outstanding - len(self._running))

    @property
    def processing(self) -> int:
        """Jobs running (llama-server's ``requests_processing``): at most the slots."""
        return len(self._running)

    @property
    def n_slots(self) -> int:
        """Jobs that may run at once: the engine's slots (1 before it is loaded)."""
        return len(getattr(self.engine, "slots", ())) or 1

    def submit(self, job: Job) -> None:
        """Queue ``job``; QueueFullError when every slot runs a job and max_queue jobs already
        wait."""
        if self.stopping:
            raise ShuttingDownError()
        with self._lock:
            if self._outstanding >= self.max_queue + self.n_slots:
                raise QueueFullError(f"the server is busy: {self.waiting} requests are "
                                     f"waiting (--max-queue {self.max_queue}); retry shortly")
            self._outstanding += 1
        self._jobs.put(job)

    def shutdown(self, grace: float) -> None:
        """Begin a graceful stop (thread-safe, idempotent): jobs not yet running are refused
        (ShuttingDownError); the running ones may finish within ``grace`` seconds, then they
        are ended with ``stopped_by`` "shutdown". ``stop()`` ends the thread afterwards."""
        if self.stopping:
            return
        self.stopping = True
        timer = threading.Timer(grace, self._end_running)
        timer.daemon = True
        timer.start()

    def _end_running(self) -> None:
        for job in list(self._running):
            job.cancel("shutdown")

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
            self.exception = e  # for the CLI, which names options by their flags
            self.ready.set()
            return
        self.ready.set()
        running: list[list] = []  # [job, _serve's generator, what it yielded], at most n_slots
        stop = False
        try:
            while not stop or running:
                while not stop and len(running) < self.n_slots:  # start what slots allow
                    try:
                        job = self._next_job() if not running else self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if job is None:  # stop(): the running jobs end at their next step
                        stop = True
                        self._end_running()
                        break
                    if self.engine is None and not self._wake(job):
                        self._done(job)
                        continue
                    self._running.append(job)
                    running.append([job, self._serve(job), None])
                self._round(running)
        finally:
            if self.engine is not None:
                self.engine.close()
            self.state = "stopped"

    def _round(self, running: list[list]) -> None:
        """One engine call for each running job: a job that has not begun begins (its prompt
        prepared, its stream made); the streams are advanced together (Engine.step_streams:
        one prompt, or one step each, the steps of separate slots verified in one batch), and
        each outcome handed to its job. A job that ends leaves ``running``."""
        def feed(entry, outcome=None, first=False):
            job, gen, _ = entry
            try:
                entry[2] = next(gen) if first else (
                    gen.throw(outcome) if isinstance(outcome, BaseException) else gen.send(outcome))
            except StopIteration:
                running.remove(entry)
                self._running.remove(job)
                self._done(job)

        for entry in [e for e in running if e[2] is None]:
            feed(entry, first=True)
        stepping = list(running)
        if stepping:
            try:
                outcomes = self.engine.step_streams([e[2] for e in stepping])
            except Exception as e:  # noqa: BLE001 - every job of the round ends with it
                outcomes = [e] * len(stepping)
            for entry, outcome in zip(stepping, outcomes):
                feed(entry, outcome)

    def _done(self, job: Job) -> None:
        with self._lock:
            self._outstanding -= 1
            self._last_use = time.monotonic()

    def _next_job(self) -> Job | None:
        """The next job; while none comes, the engine is freed once it has been idle for
        ``sleep_idle`` seconds."""
        while True:
            if self.sleep_idle is None or self.engine is None:
                return self._jobs.get()
            wait = self.sleep_idle - (time.monotonic() - self._last_use)
            if wait > 0:
                try:
                    return self._jobs.get(timeout=wait)
                except queue.Empty:
                    continue  # (a route may have used the engine meanwhile: measured again)
            with self._lock:  # (awake() hands the engine out under the same lock)
                if time.monotonic() - self._last_use < self.sleep_idle or not self._jobs.empty():
                    continue
                engine, self.engine = self.engine, None
                self.on_sleep(engine)
                self.state = "sleeping"
            engine.close()
            log.info("idle for %gs: the models are freed until the next request", self.sleep_idle)

    def _wake(self, job: Job) -> bool:
        """Load the engine again for ``job``; False (the job refused) when that fails, which
        ``state`` "failed" then reports to every later request."""
        log.info("a request: loading the models again")
        try:
            engine = self._load()
        except BaseException as e:  # noqa: BLE001 - reported through /health and the job
            self.state, self.error = "failed", str(e) or type(e).__name__
            self.exception = e
            job.put("error", EngineError(f"the models failed to load again: {self.error}"))
            self.on_finish(job, None, time.perf_counter() - job.enqueued)
            return False
        with self._lock:
            self.engine, self.state = engine, "ready"
        return True

    def _serve(self, job: Job):
        """Run ``job`` (a generator: it yields its Stream each time it wants an engine call, and
        is sent that call's outcome, or thrown its exception: :meth:`_round`)."""
        waited = time.perf_counter() - job.enqueued
        if self.stopping:
            job.put("error", ShuttingDownError())
            self.on_finish(job, None, waited)
            return
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
            if job.task is not None:
                job.put("started", None)
                job.put("done", job.task(self.engine))
            else:
                result = yield from self._generate(job)
        except RpcServerLostError as e:  # every later request would fail too: /health says so
            self.state, self.error = "lost", str(e)
            job.put("error", e)
        except (InputError, CapacityError, EngineError) as e:
            job.put("error", e)
        except Exception as e:  # noqa: BLE001 - an engine failure must not end the server
            job.put("error", EngineError(f"{type(e).__name__}: {e}"))
        self.on_finish(job, result, waited)

    def _generate(self, job: Job):
        """Runs ``job``'s generation, handing its events over: yields its Stream for each engine
        call and is sent the call's Chunk (None: no text released; DONE: the stream ended);
        returns its GenerationResult."""
        if job.prepare is not None:
            job.prompt, job.request = job.prepare(self.engine)
        prompt = self.engine.format_chat(job.prompt) if job.chat else job.prompt
        req = job.request
        # llama-server's stream telemetry, only when asked: ("progress", Progress) events while
        # the prompt is processed; each chunk's statistics as of its step
        progress = (lambda p: job.put("progress", p)) if req.return_progress else None
        stream = self.engine.stream(prompt, req, cancel=job.should_stop, progress=progress)
        job.id_slot = stream.slot
        job.put("started", None)
        try:
            while (chunk := (yield stream)) is not DONE:
                if chunk is not None:
                    if req.timings_per_token:
                        chunk = dataclasses.replace(chunk, stats=stream.stats_so_far())
                    job.put("chunk", chunk)
                if job.should_stop():  # (a prompt cut short by it ends the stream too)
                    job.stopped_by = job.cancel_reason if job.cancelled.is_set() else "timeout"
                    break
        except BaseException:
            stream.close()
            raise
        result = stream.result if stream.result is not None else stream.partial(job.stopped_by)
        stream.close()
        job.put("done", result)
        return result
