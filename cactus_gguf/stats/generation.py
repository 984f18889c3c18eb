"""What a generation reports: counters, timings and divergences, and the result record.

Glossary: a *step* is one verifier call (a verification batch, or one verifier-alone decode);
drafted / accepted count draft tokens over all steps (accepted: what the acceptance rule kept,
the sum of the steps' StepResult.n_accepted); *used* drafts are the accepted ones the generation
emitted (it can end inside a step). AL (mean acceptance length) = accepted drafts per step: the
token the verifier adds after them (residual or bonus) is not counted, so AL + 1 is the mean
acceptance length as vLLM reports it (1 + accepted / drafting steps) and about the tokens per
verifier call (emitted tokens per step); llama.cpp reports the acceptance rate (accepted /
drafted), ``acceptance_rate`` here. An *answer* is one whole
generation: what a user waits for, so per-answer figures (``answer_seconds``, ``n_steps`` =
verifier calls, ``n_draft_forwards``, ``n_tokens``) are the headline speed figures; tokens per
second alone hides a rule that makes answers longer. Times are wall-clock seconds;
KL values are nats: ``kl_*`` of each drafted token's acceptance target h (what the paper's delta
bounds), ``output_kl_*`` of the law P of the token each draft position emits (what the output
actually diverges; docs/maths.md, "The emitted law"). See docs/run.md "What a run prints".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .table import json_fields

if TYPE_CHECKING:
    from ..sampling.native import StepResult

__all__ = ["StepOutcome", "GenerationStats", "GenerationResult"]


@dataclass(frozen=True)
class StepOutcome:
    """What one step did (speculative/step.py): what :meth:`GenerationStats.add_step` folds in and the
    draft-length policy learns from.

    lookup: prompt lookup proposed the step's draft (counted before the grammar and the policy
    shortened it); n_draft_forwards: draft-model forward passes the proposal took; n_drafted: the
    drafts verified (the prefix the policy kept); verdict: the native helper's StepResult (AL,
    the residual / bonus token, positions evaluated, KL figures; for a verifier-only step of a
    request that does not speculate, AL 0 and the sampled token, no positions); n_drafts_used:
    the accepted drafts the generation used (<= AL: an ending end-of-generation token counts,
    drafts after a completed stop string or past ``n_predict`` do not). Seconds: drafting (with
    the policy's ``keep``), the verifier's decode, acceptance and the grammar's commit, and the
    draft model's catch-up on the prompt it deferred (``catch_up_seconds``: counted as prompt
    processing in the statistics, not in ``draft_seconds``).
    """

    lookup: bool
    n_draft_forwards: int
    n_drafted: int
    verdict: StepResult
    n_drafts_used: int
    draft_seconds: float
    verify_seconds: float
    accept_seconds: float
    catch_up_seconds: float = 0.0


@dataclass
class GenerationStats:
    """Counters and timings of one generation.

    n_prompt_tokens: prompt length, tokens; n_prompt_tokens_reused: how many of them the
    verifier's KV cache already held from an earlier request (prefix reuse), so were not decoded
    again; n_draft_prompt_tokens_reused: the same for the draft model.
    n_steps: verification steps (for ``none``: verifier decodes); n_drafted / n_accepted: draft
    tokens verified / accepted by the rule over all steps (Σ StepResult.n_accepted);
    n_drafts_used: the accepted drafts the generation used: an accepted end-of-generation token
    is (it ended the output), drafts accepted after the token that completed a stop string, or
    past ``n_predict``, are not. n_tokens: emitted tokens (an end-of-generation token is not
    emitted); ``tokens_per_verifier_call`` counts an ending end-of-generation token too, so it is
    (n_drafts_used + the residual / bonus tokens used) / n_steps.
    n_lookup_steps: steps whose drafts came from prompt lookup (the hybrid drafter; the n-gram
    drafter's are all of its steps that drafted).
    n_draft_forwards: forward passes of the draft model while generating (``llama_decode`` calls
    on the draft context; prompt processing excluded): with ``n_steps`` (verifier calls) what an
    answer cost in model calls, whatever the hardware.
    draft_stopped_at: emitted tokens when the draft model stopped drafting for the rest of the
    generation (None: it never did), for ``draft_stop_reason`` ("prompt does not fit the draft's
    context", "draft context full", "a token the draft's vocabulary lacks").
    draft_vocab: how the draft's tokens reached the verifier (``same``, ``map``, ``intersect``,
    ``text``; None without a draft model); coverage_sum / n_coverage: see ``vocab_coverage``.
    n_shared_steps: steps whose verification shared one decode with other slots' (slots).
    n_device_steps: verification steps whose rows came from the device's top-K
    (``backend_sampling``, speculative/device.py), of which n_device_fallbacks were decoded again
    in full (a tie at the K-th logit); ``backend_sampling_used`` says whether any step used them.
    ``decode_seconds`` excludes prompt processing (``prefill_seconds``: both models' prompt
    decodes, a draft's deferred to its first drafting step included: ``-k auto``).
    ``grammar_seconds``: time in the grammar engine (masks, advances, rollbacks) of a
    constrained generation, inside draft and accept time; ``grammar_ms_per_token`` per emitted token.
    """

    n_prompt_tokens: int = 0
    n_prompt_tokens_reused: int = 0
    n_draft_prompt_tokens_reused: int = 0
    n_tokens: int = 0
    n_steps: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    n_drafts_used: int = 0
    n_evaluated: int = 0
    n_end_tokens: int = 0
    n_lookup_steps: int = 0
    n_draft_forwards: int = 0
    draft_stopped_at: int | None = None
    n_context_shifts: int = 0
    draft_stop_reason: str = ""
    kl_sum: float = 0.0
    kl_max: float = 0.0
    output_kl_sum: float = 0.0
    output_kl_max: float = 0.0
    delta_sum: float = 0.0
    prefill_seconds: float = 0.0
    first_token_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    accept_seconds: float = 0.0
    decode_seconds: float = 0.0
    grammar_seconds: float = 0.0
    draft_vocab: str | None = None
    coverage_sum: float = 0.0
    n_coverage: int = 0
    n_device_steps: int = 0
    n_device_fallbacks: int = 0
    n_shared_steps: int = 0

    def add_coverage(self, mass: float) -> None:
        """One step's Σ q over the verifier ids a foreign draft can propose."""
        self.coverage_sum += mass
        self.n_coverage += 1

    def add_step(self, step: StepOutcome) -> None:
        """Fold one step into the counters, timings and divergences."""
        v = step.verdict
        self.n_steps += 1
        self.n_drafted += step.n_drafted
        self.n_accepted += v.n_accepted
        self.n_drafts_used += step.n_drafts_used
        self.n_lookup_steps += step.lookup
        self.n_draft_forwards += step.n_draft_forwards
        self.n_evaluated += v.n_evaluated
        self.kl_sum += v.kl_sum
        self.kl_max = max(self.kl_max, v.kl_max)
        self.output_kl_sum += v.output_kl_sum
        self.output_kl_max = max(self.output_kl_max, v.output_kl_max)
        self.delta_sum += v.delta_sum
        self.draft_seconds += step.draft_seconds
        self.verify_seconds += step.verify_seconds
        self.accept_seconds += step.accept_seconds

    @property
    def mean_accepted_length(self) -> float:
        """AL: accepted drafts per verification step, tokens; the residual / bonus token is not
        counted (vLLM's mean acceptance length, which counts it, is AL + 1)."""
        return self.n_accepted / self.n_steps if self.n_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens, in [0, 1] (llama.cpp's draft acceptance rate)."""
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_drafted_length(self) -> float:
        return self.n_drafted / self.n_steps if self.n_steps else 0.0

    @property
    def tokens_per_verifier_call(self) -> float:
        """Tokens each verifier call produced: the emitted ones and an ending end-of-generation
        token."""
        return (self.n_tokens + self.n_end_tokens) / self.n_steps if self.n_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of decoding (prompt processing excluded)."""
        return self.n_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def answer_seconds(self) -> float:
        """The whole answer, end to end: prompt processing plus decoding, seconds."""
        return self.prefill_seconds + self.decode_seconds

    @property
    def kl_mean(self) -> float:
        """Mean over evaluated draft positions of KL(h || q), nats: the divergence of each drafted
        token's acceptance *target* (what the paper's delta bounds), not of the tokens emitted."""
        return self.kl_sum / self.n_evaluated if self.n_evaluated else 0.0

    @property
    def output_kl_mean(self) -> float:
        """Mean over the tokens the steps produced of KL(P || q), nats, P the law of the token
        emitted there (bonus and verifier-only tokens count 0: they are drawn from q). The sum,
        ``output_kl_sum``, bounds the KL of the whole output from the verifier's (in expectation;
        docs/maths.md, "The emitted law")."""
        produced = self.n_accepted + self.n_steps
        return self.output_kl_sum / produced if produced else 0.0

    @property
    def delta_mean(self) -> float:
        """Cactus: mean per-draft budget used over evaluated positions, nats (delta itself with
        ``--budget target``; what the output budget chose with ``output``)."""
        return self.delta_sum / self.n_evaluated if self.n_evaluated else 0.0

    @property
    def vocab_coverage(self) -> float | None:
        """A foreign draft (``draft_vocab`` map / intersect / text): the mean over steps of the
        verifier's probability mass on the tokens the draft can propose (Σ q over the
        vocabularies' intersection at each step's first position), in [0, 1]; None when not
        measured (a draft of the verifier's own vocabulary, or none)."""
        if not self.n_coverage:
            return None
        # a mean of float32 sums of q can round past 1 (1.000000004): a mass, at most 1
        return min(1.0, self.coverage_sum / self.n_coverage)

    @property
    def grammar_ms_per_token(self) -> float:
        """Grammar-engine milliseconds per emitted token (0 unconstrained)."""
        return 1e3 * self.grammar_seconds / self.n_tokens if self.n_tokens else 0.0

    @property
    def host_ms_per_step(self) -> float:
        """Host milliseconds per verification step (``accept_seconds`` / ``n_steps``): from the
        verifier's decode returning to the step's verdict (reading its rows and the acceptance
        test; a row tied at the top-K's edge under ``backend_sampling`` adds its decode again)."""
        return 1e3 * self.accept_seconds / self.n_steps if self.n_steps else 0.0

    @property
    def backend_sampling_used(self) -> bool:
        """Whether the device's top-K rows decided a step (``backend_sampling``: at least one
        verification step read them, not decoded again in full); False when every step read the
        full rows (backend sampling off, or not applicable: docs/run.md "Warps on the device")."""
        return self.n_device_steps > self.n_device_fallbacks

    @property
    def other_seconds(self) -> float:
        """Decode time outside the model calls and the native acceptance step: loop overhead."""
        return max(0.0, self.decode_seconds - self.draft_seconds - self.verify_seconds
                   - self.accept_seconds)

    def as_dict(self) -> dict:
        """Every counter and derived figure, JSON-ready: the statistics table's ``json`` fields
        (stats/table.py)."""
        return json_fields(self)


@dataclass
class GenerationResult:
    """What one call produced.

    text: the output (before any stop string); tokens: the emitted ids (an accepted
    end-of-generation token is not among them; the token that completed a stop string is).
    stop_reason: "eos", "length" (n_predict reached, or the context full: see ``message``) or
    "stop" ("interrupted" for a partial result). seed: the seed used (drawn when the request gave
    none). logprobs: one speculative.logprobs.TokenLogprob per token of ``text`` when the request
    asked (``n_probs``), else None: every token of ``tokens``, but after a stop string only those
    wholly before it (the text returned; speculative/session.py ``tokens_within``).
    """

    text: str
    tokens: list[int]
    stop_reason: str
    stats: GenerationStats
    seed: int
    message: str = ""  # human-readable detail for the stop, e.g. "context full (n_ctx=4096)"
    n_ctx: int = 0  # the verifier's context size, tokens (as llama.cpp rounded it)
    # where each model's layers went ("verifier", "draft": llama/placement.py LayerPlacement);
    # filled by the run planner (plan.execute_run), None elsewhere
    placement: dict | None = None
    logprobs: list | None = None
