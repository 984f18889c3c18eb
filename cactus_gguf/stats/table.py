"""The statistics table: every result field of a generation, declared once (``FIELDS``), and the
outputs generated from it.

A field has a name (``GenerationStats``' attribute, the ``--json`` key), a unit, a meaning, the
outputs that show it (``OUTPUTS``: ``json`` = ``run --json`` and the bench's run records,
``summary`` = run's line on stderr, ``speculative`` = the server's ``speculative`` block,
``timings`` = llama-server's ``timings``, ``metrics`` = ``GET /metrics``, ``bench`` = what the
benchmark's summary reads off each run record: it pools the counters itself, so AL and the
acceptance rate of its tables are computed there from ``n_accepted`` / ``n_drafted`` /
``n_steps``) and, where llama-server has the figure, its name (``timings`` key, ``llamacpp:*``
metric). A few fields exist for one output only: llama-server's
``timings`` figures that are not ours (``prompt_n``, ``predicted_ms``: their own rows, named by
llama-server), and the server's state on ``/metrics`` (``source="server"``: not a generation's).

Generated here: :func:`json_fields` (``GenerationStats.as_dict``), :func:`speculative_fields`
(server/report.py ``speculative_block``), :func:`timings`, the metric declarations
(server/metrics.py builds its registry from :data:`METRICS` and :data:`LLAMA_METRICS`) and
:func:`markdown_table` (docs/statistics.md). The summary line (cli/run.py) formats each figure with
the field's ``fmt``; tests/test_stats_table.py checks that every output shows exactly its fields.
Imports nothing of the package.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["OUTPUTS", "Metric", "LlamaMetric", "Field", "FIELDS", "BY_NAME", "fields_of",
           "value_of", "fmt", "json_fields", "speculative_fields", "timings", "METRICS",
           "LLAMA_METRICS", "markdown_table"]

OUTPUTS = ("json", "summary", "speculative", "timings", "metrics", "bench")

_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_RATE = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


@dataclass(frozen=True)
class Metric:
    """One of our Prometheus metrics (``cactus_*``) fed by a field.

    kind: ``counter`` (incremented by the field's value per generation), ``histogram`` (observes
    it, ``buckets``), ``gauge`` (set by the server) or ``by_value`` (a counter labelled by the
    field's value, ``labels``: one per generation). when: observe only when ``nonzero`` (the
    value), ``drafted`` (the generation drafted tokens), ``given`` (the value is not None), or
    always (""). labels: a server field's label names (``requests``: endpoint, status).
    """

    name: str
    kind: str
    help: str
    buckets: tuple = ()
    when: str = ""
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class LlamaMetric:
    """One of llama-server's ``/metrics`` (``llamacpp:NAME``, its own help and type), fed by a
    field: ``fold`` ``sum`` (a counter: the values summed over generations), ``max`` (the largest
    value), ``rate`` (the field's ``value`` gives (numerator, denominator) per generation; the
    gauge is Σ numerator / Σ denominator, 0 before any), ``window`` (the same over the
    generations since the last read of ``/metrics``: llama-server's throughput gauges) or
    ``state`` (a server field, set when ``/metrics`` is read). ``value``: what one generation
    adds, when it is not the field's own value."""

    name: str
    kind: str
    help: str
    fold: str = "sum"
    value: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Field:
    """One result field.

    name: our name (a GenerationStats attribute or property, the ``--json`` key), or
        llama-server's for a ``timings``-only figure. unit / meaning: for the docs.
    outputs: which outputs show it (``OUTPUTS``).
    value: how to read it off a GenerationStats (None: the attribute ``name``).
    fmt: the number format of the summary line (``.2f``, ``.1%``).
    speculative: its key in the ``speculative`` block when it is not ``name``;
        speculating: shown there only when the request speculates (else null).
    timings: llama-server's ``timings`` key; only_drafted: present only when tokens were drafted
        (llama-server's rule for draft_n / draft_n_accepted).
    metrics: our Prometheus metrics of it; llama_metrics: llama-server's.
    source: ``stats`` (a generation's) or ``server`` (the server's state, /metrics only).
    """

    name: str
    unit: str
    meaning: str
    outputs: tuple[str, ...]
    value: Callable[[Any], Any] | None = None
    fmt: str = ""
    speculative: str | None = None
    speculating: bool = False
    timings: str | None = None
    only_drafted: bool = False
    metrics: tuple[Metric, ...] = ()
    llama_metrics: tuple[LlamaMetric, ...] = ()
    source: str = "stats"


# ------------------------------------------------------------------------------------------------
# llama-server's timings figures that are not ours (server-common.cpp server_slot_stats::to_json)
# ------------------------------------------------------------------------------------------------

def _prompt_n(s) -> int:
    return s.n_prompt_tokens - s.n_prompt_tokens_reused


def _first_token_step(s) -> float:
    """Seconds from the end of prompt processing to the first token (the first verification
    batch opens with the prompt's last token: llama-server counts this time in ``prompt_ms``)."""
    return max(0.0, s.first_token_seconds - s.prefill_seconds) if s.first_token_seconds else 0.0


def _predicted_ms(s) -> float:
    return max(0.0, s.decode_seconds - _first_token_step(s)) * 1e3


def _predicted_steps(n: int) -> int:
    return max(0, n - 1)  # llama-server's n_gen_steps: the first token is not counted


J, SU, SP, T, M, B = OUTPUTS  # json, summary, speculative, timings, metrics, bench

FIELDS: tuple[Field, ...] = (
    # --- the prompt ---------------------------------------------------------------------------
    Field("n_prompt_tokens", "tokens", "prompt length (reused tokens included)", (J, SU, M),
          fmt="d", metrics=(Metric("cactus_prompt_tokens", "counter",
                                   "prompt tokens of finished requests"),)),
    Field("n_prompt_tokens_reused", "tokens",
          "prompt tokens the verifier's KV cache already held from an earlier request (prefix "
          "reuse): not decoded again", (J, SP, T, M), speculative="prompt_tokens_reused",
          timings="cache_n",
          metrics=(Metric("cactus_prompt_tokens_reused", "counter",
                          "prompt tokens the verifier's KV cache already held"),),
          llama_metrics=(LlamaMetric("prompt_tokens_cached_total", "counter",
                                     "Number of prompt tokens reused from the cache"),)),
    Field("n_draft_prompt_tokens_reused", "tokens",
          "the same for the draft model's cache", (J,)),
    Field("prompt_n", "tokens", "prompt tokens decoded: n_prompt_tokens - n_prompt_tokens_reused",
          (T, M), value=_prompt_n, timings="prompt_n",
          llama_metrics=(LlamaMetric("prompt_tokens_total", "counter",
                                     "Number of prompt tokens processed, excluding cached "
                                     "tokens"),)),
    Field("prefill_seconds", "s",
          "prompt processing: both models' prompt decodes (a draft's deferred to its first "
          "drafting step included: -k auto); the prompt's last token is decoded by the first "
          "step, not here", (J, SU, SP, M, B), fmt=".2f",
          llama_metrics=(LlamaMetric("prompt_seconds_total", "counter",
                                     "Total time spent processing prompts"),)),
    Field("prompt_ms", "ms", "prefill_seconds in milliseconds", (T,),
          value=lambda s: s.prefill_seconds * 1e3, timings="prompt_ms"),
    Field("prompt_per_token_ms", "ms/token", "prompt_ms / prompt_n (0 without prompt tokens)",
          (T,), value=lambda s: s.prefill_seconds * 1e3 / max(_prompt_n(s), 1),
          timings="prompt_per_token_ms"),
    Field("prompt_per_second", "tokens/s", "prompt_n / prefill_seconds (0 without time); "
          "llamacpp:prompt_tokens_seconds: the same over the generations since the last read "
          "of /metrics",
          (T, M), value=lambda s: _prompt_n(s) / s.prefill_seconds if s.prefill_seconds else 0.0,
          timings="prompt_per_second",
          llama_metrics=(LlamaMetric("prompt_tokens_seconds", "gauge",
                                     "Average prompt throughput in tokens/s", fold="window",
                                     value=lambda s: (_prompt_n(s), s.prefill_seconds)),)),
    # --- the output ---------------------------------------------------------------------------
    Field("n_tokens", "tokens", "emitted tokens (an end-of-generation token is not emitted)",
          (J, SU, T, M, B), fmt="d", timings="predicted_n",
          metrics=(Metric("cactus_completion_tokens", "counter", "generated tokens"),
                   Metric("cactus_answer_tokens", "histogram", "tokens of one answer",
                          buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 4000))),
          llama_metrics=(LlamaMetric("tokens_predicted_total", "counter",
                                     "Number of generation tokens processed"),)),
    Field("predicted_ms", "ms", "decoding after the first token, ms: decode_seconds less the "
          "first step's time to the first token (llama-server's t_token_generation starts "
          "after the first token, whose logits come from the prompt batch)", (T, M),
          value=_predicted_ms, timings="predicted_ms",
          llama_metrics=(LlamaMetric("tokens_predicted_seconds_total", "counter",
                                     "Total time spent generating tokens",
                                     value=lambda s: _predicted_ms(s) / 1e3),)),
    Field("predicted_per_token_ms", "ms/token", "predicted_ms / (predicted_n - 1): the first "
          "token left out, as llama-server does (0 for one token)", (T,),
          value=lambda s: _predicted_ms(s) / _predicted_steps(s.n_tokens)
          if _predicted_steps(s.n_tokens) else 0.0, timings="predicted_per_token_ms"),
    Field("predicted_per_second", "tokens/s", "(predicted_n - 1) / predicted_ms: the first "
          "token's count and time left out, as llama-server does (tokens_per_second counts every "
          "token over decode_seconds); llamacpp:predicted_tokens_seconds: the same over the "
          "generations since the last read of /metrics", (T, M),
          value=lambda s: _predicted_steps(s.n_tokens) * 1e3 / _predicted_ms(s)
          if _predicted_ms(s) > 0 else 0.0, timings="predicted_per_second",
          llama_metrics=(LlamaMetric("predicted_tokens_seconds", "gauge",
                                     "Average generation throughput in tokens/s",
                                     fold="window",
                                     value=lambda s: (_predicted_steps(s.n_tokens),
                                                      _predicted_ms(s) / 1e3)),)),
    Field("n_end_tokens", "tokens", "1 when an end-of-generation token ended the output, else 0",
          (J,)),
    Field("n_context_tokens", "tokens", "the sequence at the end: prompt plus emitted tokens",
          (M,), value=lambda s: s.n_prompt_tokens + s.n_tokens,
          llama_metrics=(LlamaMetric("n_tokens_max", "counter",
                                     "Largest observed sequence length (prompt + generation)",
                                     fold="max"),)),
    # --- steps and drafts ---------------------------------------------------------------------
    Field("n_steps", "calls", "verifier calls while generating: verification batches, or "
          "verifier-alone decodes (for method none); llamacpp:n_decode_total counts them (the "
          "prompt's decodes not counted; llama-server counts its prompt batches too)",
          (J, SU, M, B), fmt="d",
          metrics=(Metric("cactus_verifier_calls", "counter",
                          "verifier forward passes of generations (steps)"),
                   Metric("cactus_answer_verifier_calls", "histogram",
                          "verifier calls of one answer",
                          buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000))),
          llama_metrics=(
              LlamaMetric("n_decode_total", "counter",
                          "Total number of llama_decode() calls, excluding speculative decoding "
                          "and multimodal decoding"),
              LlamaMetric("spec_decode_num_drafts_total", "counter",
                          "Speculative: Total speculative decoding verification steps",
                          value=lambda s: s.n_steps if s.n_drafted else 0),
              LlamaMetric("n_busy_slots_per_decode", "gauge",
                          "Average number of busy slots per llama_decode() call", fold="rate",
                          value=lambda s: (s.n_steps, s.n_steps)))),
    Field("n_drafted", "tokens", "draft tokens verified over all steps", (J, SU, T, M, B),
          fmt="d", timings="draft_n", only_drafted=True,
          metrics=(Metric("cactus_drafted_tokens", "counter", "draft tokens proposed"),),
          llama_metrics=(LlamaMetric("spec_decode_num_draft_tokens_total", "counter",
                                     "Speculative: Total draft tokens generated"),)),
    Field("n_accepted", "tokens", "draft tokens the acceptance rule kept (Σ over steps)",
          (J, T, M, B), fmt="d", timings="draft_n_accepted", only_drafted=True,
          metrics=(Metric("cactus_accepted_tokens", "counter", "draft tokens accepted"),),
          llama_metrics=(LlamaMetric("spec_decode_num_accepted_tokens_total", "counter",
                                     "Speculative: Total draft tokens accepted by the target "
                                     "model"),)),
    Field("n_drafts_used", "tokens", "accepted drafts the output used (not those after a "
          "completed stop string or past n_predict)", (J,)),
    Field("n_evaluated", "positions", "draft positions the rule evaluated (the KL means' count)",
          (J, B)),
    Field("n_lookup_steps", "steps", "steps whose drafts came from prompt lookup", (J,)),
    Field("n_draft_forwards", "calls", "draft-model forward passes while generating (prompt "
          "processing excluded)", (J, SU, M, B), fmt="d",
          metrics=(Metric("cactus_draft_forwards", "counter",
                          "draft-model forward passes of generations"),)),
    Field("draft_stopped_at", "tokens", "emitted tokens when the draft stopped drafting for the "
          "rest of the generation (null: it never did)", (J, SU, SP), fmt="d"),
    Field("draft_stop_reason", "", "why the draft stopped (empty: it did not)", (J, SU)),
    Field("n_context_shifts", "", "context shifts (`--context-shift`): times the context filled "
          "and the older half after the kept tokens was discarded (llama-server's `truncated`)",
          (J,), fmt="d"),
    # --- divergences --------------------------------------------------------------------------
    Field("kl_sum", "nats", "Σ KL(h || q) over evaluated draft positions", (J, B)),
    Field("kl_max", "nats", "largest KL(h || q) of a draft position", (J, SP, B)),
    Field("output_kl_sum", "nats", "Σ KL(P || q) over the tokens the steps produced: bounds the "
          "KL of the output from the verifier's", (J, SU, SP, B), fmt=".2f"),
    Field("output_kl_max", "nats", "largest KL(P || q) of a produced token", (J, SU, SP, B),
          fmt=".3f"),
    Field("delta_sum", "nats", "Cactus: Σ per-draft budget over evaluated positions", (J,)),
    # --- time ---------------------------------------------------------------------------------
    Field("first_token_seconds", "s", "time to the first token, prompt processing included",
          (J, SP, M, B), fmt=".2f",
          metrics=(Metric("cactus_time_to_first_token_seconds", "histogram",
                          "time to the first token, prompt processing included",
                          buckets=_SECONDS, when="nonzero"),)),
    Field("draft_seconds", "s", "drafting (with the draft-length policy)", (J, SU, SP, B),
          fmt=".2f"),
    Field("verify_seconds", "s", "the verifier's decodes", (J, SU, SP, B), fmt=".2f"),
    Field("accept_seconds", "s", "acceptance: reading the verifier's rows and the rule",
          (J, B)),
    Field("decode_seconds", "s", "decoding: prompt processing excluded", (J, SU, B), fmt=".2f"),
    Field("grammar_seconds", "s", "time in the grammar engine of a constrained generation "
          "(inside draft and accept time)", (J, B)),
    # --- a foreign draft, the device ----------------------------------------------------------
    Field("draft_vocab", "", "how the draft's tokens reached the verifier (same, map, intersect, "
          "text; null without a draft model)", (J, SU, SP, M), speculating=True,
          metrics=(Metric("cactus_draft_vocab_generations", "by_value",
                          "finished generations with a draft model, by how its tokens reached "
                          "the verifier (same, map, intersect, text)", when="given",
                          labels=("draft_vocab",)),)),
    Field("coverage_sum", "", "Σ over steps of vocab_coverage's mass", (J,)),
    Field("n_coverage", "steps", "steps vocab_coverage was measured at", (J,)),
    Field("n_shared_steps", "steps", "steps whose verification shared one decode with other "
          "slots' (`--parallel`: their rows in one batch)", (J, SP)),
    Field("n_device_steps", "steps", "steps whose rows came from the device's top-K "
          "(backend_sampling)", (J,)),
    Field("n_device_fallbacks", "steps", "of those, steps decoded again in full (a tie at the "
          "K-th logit)", (J,)),
    # --- derived ------------------------------------------------------------------------------
    Field("mean_accepted_length", "tokens/step", "AL: accepted drafts per step (the residual / "
          "bonus token not counted: vLLM's mean acceptance length is AL + 1)",
          (J, SU, SP, M), fmt=".2f", speculative="acceptance_length",
          metrics=(Metric("cactus_acceptance_length", "histogram",
                          "accepted drafts per verification step (AL; the residual / bonus "
                          "token not counted: vLLM's mean acceptance length is AL + 1)",
                          buckets=(0.5, 1, 1.5, 2, 3, 4, 6, 8, 12, 16), when="drafted"),)),
    Field("acceptance_rate", "ratio", "accepted / drafted tokens, in [0, 1] (llama.cpp's draft "
          "acceptance rate)", (J, SU, SP, M), fmt=".1%",
          metrics=(Metric("cactus_acceptance_rate", "histogram", "accepted / drafted tokens",
                          buckets=_RATE, when="drafted"),)),
    Field("mean_drafted_length", "tokens/step", "drafted tokens per step", (J, SU), fmt=".2f"),
    Field("tokens_per_verifier_call", "tokens/call", "tokens each verifier call produced: the "
          "emitted ones and an ending end-of-generation token", (J, SU, SP), fmt=".2f"),
    Field("tokens_per_second", "tokens/s", "emitted tokens per second of decoding (prompt "
          "processing excluded; every token counted)", (J, SU, SP, M, B), fmt=".2f",
          metrics=(Metric("cactus_tokens_per_second", "histogram",
                          "decode speed of a generation",
                          buckets=(1, 2, 5, 10, 15, 20, 30, 50, 100, 200, 500),
                          when="nonzero"),)),
    Field("answer_seconds", "s", "the whole answer end to end: prefill_seconds + "
          "decode_seconds", (J, SU, M), fmt=".2f",
          metrics=(Metric("cactus_answer_seconds", "histogram",
                          "one answer end to end: prompt processing plus decoding",
                          buckets=_SECONDS),)),
    Field("kl_mean", "nats", "mean KL(h || q) over evaluated draft positions: the divergence of "
          "each drafted token's acceptance target", (J, SU, SP, M), fmt=".3f",
          metrics=(Metric("cactus_kl_mean_nats", "histogram",
                          "mean KL(h || q) of the acceptance target",
                          buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4), when="drafted"),)),
    Field("output_kl_mean", "nats", "mean KL(P || q) over the tokens the steps produced, P the "
          "law of the emitted token", (J, SU, SP, M), fmt=".3f",
          metrics=(Metric("cactus_output_kl_mean_nats", "histogram",
                          "mean KL(P || q) of the emitted tokens' law, per token",
                          buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4),
                          when="drafted"),)),
    Field("delta_mean", "nats", "Cactus: mean per-draft budget used over evaluated positions",
          (J,)),
    Field("vocab_coverage", "ratio", "a foreign draft: the verifier's mean probability mass on "
          "the tokens the draft can propose (null when not measured)", (J, SU, SP, M),
          fmt=".1%", speculating=True,
          metrics=(Metric("cactus_vocab_coverage", "histogram",
                          "a draft of another vocabulary: the verifier's mean probability mass "
                          "on the tokens the draft can propose, per generation",
                          buckets=_RATE, when="given"),)),
    Field("grammar_ms_per_token", "ms/token", "grammar-engine milliseconds per emitted token "
          "(0 unconstrained)", (J, SU), fmt=".3f"),
    Field("host_ms_per_step", "ms/step", "host milliseconds per step: accept_seconds / n_steps",
          (J, SU, SP), fmt=".2f"),
    Field("backend_sampling_used", "", "whether the device's top-K rows decided a step", (J,)),
    Field("other_seconds", "s", "decode time outside the model calls and the acceptance step",
          (J, B)),
    # --- the server's state (GET /metrics) ----------------------------------------------------
    Field("requests", "requests", "HTTP requests by endpoint and status", (M,), source="server",
          metrics=(Metric("cactus_requests", "counter", "HTTP requests by endpoint and status",
                          labels=("endpoint", "status")),)),
    Field("queue_depth", "requests", "requests waiting for a slot behind the running ones",
          (M,), source="server",
          metrics=(Metric("cactus_queue_depth", "gauge", "requests waiting for the engine"),),
          llama_metrics=(LlamaMetric("requests_deferred", "gauge",
                                     "Number of requests deferred", fold="state"),)),
    Field("requests_processing", "requests", "requests the engine is running (at most the "
          "slots, `--parallel`)", (M,), source="server",
          llama_metrics=(LlamaMetric("requests_processing", "gauge",
                                     "Number of requests processing", fold="state"),)),
    Field("slot_processing", "requests", "per slot: 1 while a request runs on it, else 0",
          (M,), source="server",
          metrics=(Metric("cactus_slot_processing", "gauge",
                          "1 while a request runs on the slot, else 0", labels=("slot",)),)),
    Field("slot_cached_tokens", "tokens", "per slot: the tokens its verifier cache holds "
          "(what the next request's prefix reuse reads)", (M,), source="server",
          metrics=(Metric("cactus_slot_cached_tokens", "gauge",
                          "tokens the slot's verifier KV cache holds", labels=("slot",)),)),
)

BY_NAME = {f.name: f for f in FIELDS}
assert len(BY_NAME) == len(FIELDS), "a field declared twice"

#: our metrics and llama-server's, each with the field that feeds it, in the table's order
METRICS: tuple[tuple[Field, Metric], ...] = tuple((f, m) for f in FIELDS for m in f.metrics)
LLAMA_METRICS: tuple[tuple[Field, LlamaMetric], ...] = tuple(
    (f, m) for f in FIELDS for m in f.llama_metrics)


def fields_of(output: str) -> tuple[Field, ...]:
    """The fields ``output`` (one of OUTPUTS) shows, in the table's order."""
    return tuple(f for f in FIELDS if output in f.outputs)


def value_of(field: Field | str, stats) -> Any:
    """A field's value for a GenerationStats."""
    f = BY_NAME[field] if isinstance(field, str) else field
    return f.value(stats) if f.value is not None else getattr(stats, f.name)


def fmt(stats, name: str) -> str:
    """A field's value with its number format (the summary line's figures)."""
    return format(value_of(name, stats), BY_NAME[name].fmt)


def json_fields(stats) -> dict:
    """``--json``'s statistics (``GenerationStats.as_dict``): every ``json`` field."""
    return {f.name: value_of(f, stats) for f in fields_of("json")}


def speculative_fields(stats, speculates: bool) -> dict:
    """The ``speculative`` block's statistics (after the rule, before the seed): its name of each
    ``speculative`` field; a ``speculating`` one null when the request does not speculate."""
    return {f.speculative or f.name: (value_of(f, stats) if speculates or not f.speculating
                                      else None) for f in fields_of("speculative")}


def timings(stats, n_predicted: int | None = None) -> dict:
    """llama-server's ``timings`` (server-common.cpp ``server_slot_stats::to_json``): prompt the
    tokens decoded (those reused: ``cache_n``), predicted the emitted tokens, the first left out
    of the per-token figures; draft_n / draft_n_accepted only when tokens were drafted. Times in
    milliseconds. ``n_predicted``: the tokens returned when a cut dropped the rest of a step's
    (``/infill``), in place of ``n_tokens``."""
    if n_predicted is not None:
        stats = _Predicted(stats, n_predicted)
    return {f.timings: value_of(f, stats) for f in fields_of("timings")
            if not (f.only_drafted and not stats.n_drafted)}


class _Predicted:
    """A GenerationStats read with another ``n_tokens``."""

    def __init__(self, stats, n_tokens: int) -> None:
        self._stats, self.n_tokens = stats, n_tokens

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stats, name)


def _names(f: Field) -> list[str]:
    """Where each output shows ``f``: its names outside json / summary / bench."""
    out = []
    if "speculative" in f.outputs and f.speculative:
        out.append(f"speculative.{f.speculative}")
    if f.timings and f.timings != f.name:
        out.append(f"timings.{f.timings}")
    out += [f"`{m.name}`" for m in f.metrics]
    out += [f"`llamacpp:{m.name}`" for m in f.llama_metrics]
    return out


def markdown_table() -> str:
    """docs/statistics.md's table: one row per field."""
    rows = ["| field | unit | meaning | " + " | ".join(OUTPUTS) + " | other names |",
            "|---|---|---|" + "---|" * len(OUTPUTS) + "---|"]
    for f in FIELDS:
        marks = ["✓" if o in f.outputs else "" for o in OUTPUTS]
        meaning = f.meaning.replace("|", "\\|")
        if f.source == "server":
            meaning += " (the server's state)"
        rows.append(f"| `{f.name}` | {f.unit} | {meaning} | " + " | ".join(marks)
                    + f" | {', '.join(_names(f))} |")
    return "\n".join(rows) + "\n"
