"""The server's Prometheus metrics (``GET /metrics``), with prometheus-client.

Counters of requests (by endpoint and HTTP status), tokens, verifier calls and draft forwards,
generations by ``draft_vocab``; histograms per finished generation (an answer) of its time end to
end, its verifier calls and tokens (the per-answer figures: what a client waits for), time to
first token, decode speed, acceptance rate, acceptance length, KL and a foreign draft's
``vocab_coverage``; the queue depth as a gauge. One registry per app, so
two servers in one process do not mix.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

__all__ = ["Metrics", "CONTENT_TYPE_LATEST"]

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_RATE = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("cactus_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("cactus_prompt_tokens", "prompt tokens of finished requests",
                                     registry=r)
        self.prompt_tokens_reused = Counter(
            "cactus_prompt_tokens_reused", "prompt tokens the verifier's KV cache already held",
            registry=r)
        self.completion_tokens = Counter("cactus_completion_tokens", "generated tokens",
                                         registry=r)
        self.drafted = Counter("cactus_drafted_tokens", "draft tokens proposed", registry=r)
        self.accepted = Counter("cactus_accepted_tokens", "draft tokens accepted", registry=r)
        self.verifier_calls = Counter("cactus_verifier_calls",
                                      "verifier forward passes of generations (steps)", registry=r)
        self.draft_forwards = Counter("cactus_draft_forwards",
                                      "draft-model forward passes of generations", registry=r)
        self.answer_seconds = Histogram("cactus_answer_seconds",
                                        "one answer end to end: prompt processing plus decoding",
                                        buckets=_SECONDS, registry=r)
        self.answer_verifier_calls = Histogram(
            "cactus_answer_verifier_calls", "verifier calls of one answer",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000), registry=r)
        self.answer_tokens = Histogram(
            "cactus_answer_tokens", "tokens of one answer",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000), registry=r)
        self.queue_depth = Gauge("cactus_queue_depth", "requests waiting for the engine",
                                 registry=r)
        self.ttft = Histogram("cactus_time_to_first_token_seconds",
                              "time to the first token, prompt processing included",
                              buckets=_SECONDS, registry=r)
        self.tps = Histogram("cactus_tokens_per_second", "decode speed of a generation",
                             buckets=(1, 2, 5, 10, 15, 20, 30, 50, 100, 200, 500), registry=r)
        self.acceptance = Histogram("cactus_acceptance_rate", "accepted / drafted tokens",
                                    buckets=_RATE, registry=r)
        self.al = Histogram("cactus_acceptance_length",
                            "accepted drafts per verification step (AL; the residual / bonus "
                            "token not counted: vLLM's mean acceptance length is AL + 1)",
                            buckets=(0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16), registry=r)
        self.kl = Histogram("cactus_kl_mean_nats", "mean KL(h || q) of the acceptance target",
                            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4), registry=r)
        self.output_kl = Histogram("cactus_output_kl_mean_nats",
                                   "mean KL(P || q) of the emitted tokens' law, per token",
                                   buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4),
                                   registry=r)
        self.draft_vocab = Counter(
            "cactus_draft_vocab_generations", "finished generations with a draft model, by how "
            "its tokens reached the verifier (same, map, intersect, text)", ["draft_vocab"],
            registry=r)
        self.vocab_coverage = Histogram(
            "cactus_vocab_coverage", "a draft of another vocabulary: the verifier's mean "
            "probability mass on the tokens the draft can propose, per generation",
            buckets=_RATE, registry=r)

    def finished(self, stats) -> None:
        """Record one finished generation's statistics (a GenerationStats)."""
        self.prompt_tokens.inc(stats.n_prompt_tokens)
        self.prompt_tokens_reused.inc(stats.n_prompt_tokens_reused)
        self.completion_tokens.inc(stats.n_tokens)
        self.drafted.inc(stats.n_drafted)
        self.accepted.inc(stats.n_accepted)
        self.verifier_calls.inc(stats.n_steps)
        self.draft_forwards.inc(stats.n_draft_forwards)
        self.answer_seconds.observe(stats.answer_seconds)
        self.answer_verifier_calls.observe(stats.n_steps)
        self.answer_tokens.observe(stats.n_tokens)
        if stats.first_token_seconds:
            self.ttft.observe(stats.first_token_seconds)
        if stats.tokens_per_second:
            self.tps.observe(stats.tokens_per_second)
        if stats.draft_vocab is not None:
            self.draft_vocab.labels(stats.draft_vocab).inc()
        if stats.vocab_coverage is not None:
            self.vocab_coverage.observe(stats.vocab_coverage)
        if stats.n_drafted:
            self.acceptance.observe(stats.acceptance_rate)
            self.al.observe(stats.mean_accepted_length)
            self.kl.observe(stats.kl_mean)
            self.output_kl.observe(stats.output_kl_mean)

    def render(self) -> bytes:
        return generate_latest(self.registry)
