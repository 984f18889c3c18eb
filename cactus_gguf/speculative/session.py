"""One generation's state: the request, the committed token ids, the sampler (its RNG), the
drafter and draft-length policy, the text released so far, and the statistics.

The engine (engine.py) runs the steps (step.py); a session only records what they emit.
Sessions are independent: two of them never share an RNG, a drafter or text state, so generations
may interleave on one engine (the engine restores its caches to a session's committed tokens when
it resumes another one).
"""
from __future__ import annotations

import codecs
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ..stats import GenerationResult, GenerationStats
from ..prompting.text import TextStream
from .drafters import Drafter
from .policy import DraftPolicy

__all__ = ["Session", "Chunk", "Progress", "tokens_within"]

log = logging.getLogger(__name__)

# Where an emitted token came from (Chunk.segments): an accepted draft, the verifier's token at the
# first rejection (residual), after all k drafts were accepted (bonus), or in a step with no draft.
SOURCES = ("draft", "residual", "bonus", "verifier")


def tokens_within(pieces: Iterable[bytes], n_chars: int) -> int:
    """How many of the leading tokens (``pieces``: each one's bytes, in order) lie wholly within
    the first ``n_chars`` characters of their text (UTF-8, a bad byte U+FFFD, as TextStream
    decodes): the tokens of that text when it is cut there (before a stop string, at an early
    stop). A token holding the first bytes of a character counts only with the token that
    completes it; a token whose text straddles the cut does not count."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    chars = n = 0
    for i, data in enumerate(pieces):
        chars += len(decoder.decode(data))
        if chars > n_chars:
            break
        if not decoder.getstate()[0]:  # no character left unfinished
            n = i + 1
    return n


@dataclass(frozen=True)
class Chunk:
    """Text one step released: ``text`` (whole UTF-8 characters, never part of a stop string) and
    ``segments``, the same text as (text, source) runs, each character attributed to the token that
    completed it, source one of ``SOURCES``. ``tokens``: the ids emitted since the previous chunk
    (a token whose text was held back comes with the chunk that releases it); ``logprobs``: theirs
    (logprobs.TokenLogprob, one per token) when the request asked (``n_probs``), else (); after a
    stop string, only the tokens of the text before it have theirs (``Session.n_text_tokens``)."""

    text: str
    segments: tuple[tuple[str, str], ...]
    tokens: tuple[int, ...] = ()
    logprobs: tuple = ()
    #: the generation's statistics as of this chunk (:meth:`Session.stats_so_far`), when the
    #: caller asked for them (the server's ``timings_per_token``), else None
    stats: GenerationStats | None = None


@dataclass(frozen=True)
class Progress:
    """Prompt processing so far (llama-server's ``prompt_progress``): of the prompt's ``total``
    tokens, ``cache`` were reused from the KV cache and ``processed`` (reused included) are in
    it; ``seconds`` since prompt processing began. The last report has ``processed`` =
    ``total``: the prompt's last token, which the first verification batch decodes, counts as
    processed once the rest is (the draft's prompt included)."""

    total: int
    cache: int
    processed: int
    seconds: float


class Session:
    """State of one generation.

    prompt / committed: token ids (committed = prompt + every emitted token); out_tokens: the
    emitted ids. sampler: the NativeSampler (owns this generation's RNG). drafter: None when the
    verifier decodes alone (method none, or the draft cannot follow any more). constraint: the
    grammar state of a constrained request (sampling/constraints.py), or None.
    """

    def __init__(self, prompt: Sequence[int], request, seed: int, sampler, drafter: Drafter | None,
                 policy: DraftPolicy, n_ctx: int = 0, constraint=None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        self.request = request
        self.should_stop = should_stop  # the caller's cancel check (between prefill chunks)
        self.n_ctx = n_ctx
        self.seed = seed
        self.prompt = list(prompt)
        self.committed = list(prompt)
        self.out_tokens: list[int] = []
        self.sampler = sampler
        self.drafter = drafter
        self.policy = policy
        self.constraint = constraint  # the grammar state (sampling/constraints.py), or None
        self.stats = GenerationStats(n_prompt_tokens=len(prompt))
        self.text = TextStream(request.stop)
        self.stop_reason, self.message = "length", ""
        self.started = False  # prompt processed
        self.finished = False
        self.result: GenerationResult | None = None
        self.t_prefill = 0.0  # when prompt processing began
        self.t_start = 0.0    # when decoding began (after it)
        self.q_buffer = None  # float32 [V]: a foreign draft's coverage measurement (step.py)
        #: the request's top-K when its rows come from the device (speculative/device.py), else 0
        #: (the steps that used them: stats.n_device_steps, n_device_fallbacks)
        self.device_top_k = 0
        self.logprobs = None  # a LogprobReader when the request asks for n_probs (logprobs.py)
        self.token_logprobs: list = []  # one TokenLogprob per emitted token (when asked)
        #: the emitted tokens the returned text holds: all of them, except after a stop string
        #: (then those wholly before it: ``tokens_within``); what the log-probabilities cover
        self.n_text_tokens: int | None = None
        #: the draft's prompt decoded late (``reset(lazy=True)``: at the first step that drafts),
        #: seconds: prompt processing, not decoding (step.py moves it out of the step's time)
        self.late_prefill_seconds = 0.0
        self.scope = None  # a CodeScope when the top gap applies to code only (scope.py)
        self.context_shift = False  # shift a full context instead of stopping (step.py _shift)
        #: called with a Progress before each n_batch chunk of the prompt and once it is
        #: processed (prefill.py), when the caller asked (the server's return_progress)
        self.progress: Callable[[Progress], None] | None = None
        self.progress_reported: list[int] = []  # the reports made so far (prefill.py)
        self._chunked = 0  # emitted tokens handed out in chunks

    @property
    def remaining(self) -> int:
        """Tokens still allowed before n_predict (n_predict -1: only the context limits them)."""
        if self.request.n_predict < 0:
            return max(1, self.n_ctx - len(self.committed) + 1)
        return self.request.n_predict - len(self.out_tokens)

    @property
    def limit_reached(self) -> bool:
        n_predict = self.request.n_predict
        return 0 <= n_predict <= len(self.out_tokens)

    def emit(self, tokens: Sequence[int], sources: Sequence[str], is_eog: Callable[[int], bool],
             piece: Callable[[int], bytes]) -> list[str]:
        """Commit the step's emitted tokens in order (``sources``: where each came from, see
        SOURCES), stopping at the first end-of-generation token (not committed), stop string or
        the n_predict limit. Returns the text released."""
        out = []
        if not self.out_tokens and not self.stats.first_token_seconds:
            self.stats.first_token_seconds = time.perf_counter() - self.t_prefill
        for tok, source in zip(tokens, sources):
            if is_eog(tok):
                self.stop_reason, self.finished = "eos", True
                self.stats.n_end_tokens = 1
                break
            self.committed.append(tok)
            self.out_tokens.append(tok)
            data = piece(tok)
            if self.scope is not None:
                self.scope.feed(data)
            text = self.text.feed(data, source)
            if text:
                out.append(text)
            if self.text.stopped:
                self.stop_reason, self.finished = "stop", True
                self.message = f"stop string {self.text.matched_stop!r}"
                self.n_text_tokens = tokens_within(map(piece, self.out_tokens),
                                                   len(self.text.text))
                break
            if self.limit_reached:
                self.stop_reason, self.finished = "length", True
                break
        return out

    def stop_drafting(self, reason: str) -> None:
        """The draft model cannot go on: the verifier decodes alone from here (recorded)."""
        log.debug("drafting stopped after %d tokens: %s", len(self.out_tokens), reason)
        self.drafter = None
        self.stats.draft_stopped_at = len(self.out_tokens)
        self.stats.draft_stop_reason = reason

    def stop(self, reason: str, message: str) -> None:
        self.stop_reason, self.message, self.finished = reason, message, True

    def chunk(self, pieces: Sequence[str]) -> Chunk | None:
        """The released ``pieces`` as one Chunk with their sources (None when empty)."""
        text = "".join(pieces)
        if not text:
            return None
        done, self._chunked = self._chunked, len(self.out_tokens)
        return Chunk(text, tuple(self.text.take_segments()), tuple(self.out_tokens[done:]),
                     tuple(self.token_logprobs[done:self.n_text_tokens]))

    def stats_so_far(self) -> GenerationStats:
        """A copy of the statistics as they stand between two steps: the tokens emitted so far
        and the decoding time until now (what :meth:`finish` sets at the end; once it has run,
        the final figures)."""
        stats = dataclasses.replace(self.stats, n_tokens=len(self.out_tokens))
        if self.started and self.result is None:
            stats.decode_seconds = time.perf_counter() - self.t_start - self.late_prefill_seconds
        return stats

    def finish(self) -> list[str]:
        """Close the generation: release the held text and build ``result``."""
        tail = self.text.finish() if self.stop_reason != "interrupted" else ""
        now = time.perf_counter()
        if self.started:
            self.stats.decode_seconds = now - self.t_start - self.late_prefill_seconds
        else:  # cut short while the prompt was processed (or before): no decoding yet
            self.stats.prefill_seconds = now - self.t_prefill if self.t_prefill else 0.0
            self.stats.decode_seconds = 0.0
        if self.constraint is not None:
            self.stats.grammar_seconds = self.constraint.seconds
        self.stats.n_tokens = len(self.out_tokens)
        if self.stop_reason == "length" and not self.message:
            n_predict = self.request.n_predict
            self.message = f"n_predict={n_predict} reached" if self.limit_reached else ""
        self.result = GenerationResult(text=self.text.text, tokens=self.out_tokens,
                                       stop_reason=self.stop_reason, stats=self.stats,
                                       seed=self.seed, message=self.message, n_ctx=self.n_ctx,
                                       logprobs=self.token_logprobs[:self.n_text_tokens]
                                       if self.logprobs is not None else None)
        return [tail] if tail else []
