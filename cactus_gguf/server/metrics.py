"""The server's Prometheus metrics (``GET /metrics``), with prometheus-client, declared by the
statistics table (stats/table.py): ours (``cactus_*``) and llama-server's (``llamacpp:*``).

Ours: counters of requests (by endpoint and HTTP status), tokens, verifier calls and draft
forwards, generations by ``draft_vocab``; histograms per finished generation (an answer) of its
time end to end, its verifier calls and tokens (the per-answer figures: what a client waits for),
time to first token, decode speed, acceptance rate, acceptance length, KL and a foreign draft's
``vocab_coverage``; the queue depth as a gauge. llama-server's: its counters (summed over
finished generations), its throughput gauges (Σ tokens / Σ seconds since the last read) and its
request gauges, after ours in llama-server's own text (server-task.cpp ``to_metrics``: its names,
help and types). One registry per app, so two servers in one process do not mix.
"""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from ..stats.table import LLAMA_METRICS, METRICS, value_of

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]

_KINDS = {"counter": Counter, "by_value": Counter, "histogram": Histogram, "gauge": Gauge}


class Metrics:
    """The registry: ``requests`` (labels endpoint, status) and ``queue_depth`` are the server's
    to set; ``finished`` records a generation; ``state`` the server's state before a render."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        #: our metrics by name (``cactus_requests`` ...), each with the field that feeds it
        self.by_name: dict[str, tuple] = {}
        for field, m in METRICS:
            kw = {"buckets": m.buckets} if m.kind == "histogram" else {}
            metric = _KINDS[m.kind](m.name, m.help, list(m.labels), registry=r, **kw)
            self.by_name[m.name] = (field, m, metric)
        self.requests = self.by_name["cactus_requests"][2]
        self.queue_depth = self.by_name["cactus_queue_depth"][2]
        self.llama = _LlamaMetrics()

    def finished(self, stats) -> None:
        """Record one finished generation's statistics (a GenerationStats)."""
        for field, m, metric in self.by_name.values():
            if field.source != "stats":
                continue
            value = value_of(field, stats)
            if (m.when == "nonzero" and not value) or (m.when == "given" and value is None) \
                    or (m.when == "drafted" and not stats.n_drafted):
                continue
            if m.kind == "counter":
                metric.inc(value)
            elif m.kind == "by_value":
                metric.labels(value).inc()
            else:
                metric.observe(value)
        self.llama.finished(stats)

    def state(self, *, waiting: int, processing: int, slots=()) -> None:
        """The server's state, set before a render: requests waiting, and running (at most the
        slots); ``slots``: (id, processing, cached tokens) per slot (none while the models
        sleep: the last values stay)."""
        self.queue_depth.set(waiting)
        self.llama.states.update(queue_depth=waiting, requests_processing=processing)
        for slot, busy, cached in slots:
            self.by_name["cactus_slot_processing"][2].labels(str(slot)).set(int(busy))
            self.by_name["cactus_slot_cached_tokens"][2].labels(str(slot)).set(cached)

    def render(self) -> bytes:
        return generate_latest(self.registry) + self.llama.text().encode()


class _LlamaMetrics:
    """llama-server's ``llamacpp:*`` metrics, folded over finished generations (stats/table.py
    LlamaMetric: sum, max, rate, window) and the server's state."""

    def __init__(self) -> None:
        self.totals = {m.name: (0.0, 0.0) if m.fold in ("rate", "window") else 0.0
                       for _, m in LLAMA_METRICS}
        self.states: dict[str, float] = {}
        self.lock = threading.Lock()  # finished: the worker's thread; text: the event loop's

    def finished(self, stats) -> None:
        with self.lock:
            self._fold(stats)

    def _fold(self, stats) -> None:
        for field, m in LLAMA_METRICS:
            if m.fold == "state":
                continue
            value = m.value(stats) if m.value is not None else value_of(field, stats)
            have = self.totals[m.name]
            if m.fold in ("rate", "window"):
                self.totals[m.name] = (have[0] + value[0], have[1] + value[1])
            elif m.fold == "max":
                self.totals[m.name] = max(have, value)
            else:
                self.totals[m.name] = have + value

    def text(self) -> str:
        """llama-server's exposition, line for line (server-task.cpp ``to_metrics``: HELP, TYPE
        and the sample under the same name; a counter's name is its whole name). A read ends the
        throughput gauges' window, as llama-server's does."""
        with self.lock:
            return self._text()

    def _text(self) -> str:
        lines = []
        for field, m in LLAMA_METRICS:
            if m.fold == "state":
                value = self.states.get(field.name, 0)
            elif m.fold in ("rate", "window"):
                num, den = self.totals[m.name]
                value = num / den if den > 0 else 0.0
                if m.fold == "window":  # averaged over the window between two reads
                    self.totals[m.name] = (0.0, 0.0)
            else:
                value = self.totals[m.name]
            name = f"llamacpp:{m.name}"
            lines += [f"# HELP {name} {m.help}", f"# TYPE {name} {m.kind}",
                      f"{name} {floatToGoString(value)}"]
        return "\n".join(lines) + "\n"
