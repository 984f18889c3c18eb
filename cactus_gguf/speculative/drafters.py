"""Who proposes the draft tokens: the Drafter interface, the draft model, prompt lookup, and the
hybrid of both (the verifier's MTP head: mtp.py; a draft with another vocabulary: foreign.py), and
llama-server's synthetic acceptance around any of them (benchmarking only).

A drafter proposes up to k tokens after the committed ones, as a Draft (draft.py), within the
step's DraftPlan; the models draft through draft.py's one loop (SamplingDrafter); the engine's step
(step.py) verifies them. Its lifecycle within a generation: ``reset(prompt)`` once, then per step
``room`` / ``propose``, then ``rollback`` to what was committed. ``resync`` puts it back after
another generation used the shared draft context in between (an interleaved stream).

Glossary (engine.py): committed = the prompt plus every emitted token; pending = committed tokens a
context has not decoded yet (usually just the newest one). k = draft length, V = the verifier's
vocabulary size.
"""
from __future__ import annotations

import logging
from typing import Callable, Protocol, Sequence

import numpy as np

from ..llama import Context
from ..sampling import NativeSampler
from ..sampling.constraints import Constraint
from ..sampling.rng import Rng
from .draft import Draft, DraftPlan, SamplingDrafter

__all__ = ["Drafter", "ModelDrafter", "NgramDrafter", "HybridDrafter", "SynthDrafter",
           "synth_rates"]

log = logging.getLogger("cactus_gguf.speculative.engine")


class Drafter(Protocol):
    """Proposes draft tokens (see :class:`Draft`)."""

    # How its tokens reach the verifier (the request's ``draft_vocab`` resolved: ``same``, ``map``,
    # ``intersect``, ``text``; None for prompt lookup), and the verifier ids it can ever propose
    # (bool [V], None when every id: the coverage Σ q over them is measured per step)
    vocab_method: str | None
    shared_v: np.ndarray | None

    def reset(self, prompt: Sequence[int], *, reuse: bool, lazy: bool = False) -> int | None:
        """Prepare to draft after ``prompt``. Returns the prompt tokens reused from an earlier
        generation's state (0 if none), or None when this drafter cannot draft for this prompt
        (the verifier then decodes alone)."""

    def resync(self, committed: Sequence[int]) -> bool:
        """Restore the state for ``committed`` after another generation changed it; False when it
        can no longer follow them."""

    def room(self, committed: Sequence[int]) -> int:
        """Most tokens it can draft now (0: it can no longer follow the generation)."""

    def why_no_room(self, committed: Sequence[int]) -> str:
        """Why ``room`` is 0, in a few words (for the statistics)."""

    def propose(self, committed: list[int], plan: DraftPlan, sampler: NativeSampler,
                grammar: Constraint | None = None) -> Draft:
        """Draft up to ``plan.k`` tokens after ``committed``; an empty Draft when the plan does
        not allow its kind of proposal this step. ``grammar``: a sampling drafter samples each
        token under the grammar's current mask and pushes it (so p is over the legal tokens, as q
        will be); the engine checks a prompt-lookup proposal afterwards. Raises what
        NativeSampler.draft and Context.decode raise (EngineError)."""

    def rollback(self, n_keep: int) -> None:
        """Forget state past the first ``n_keep`` committed tokens."""

    # shift(n_keep, n_discard) -> bool, where a drafter has one: follow a context shift that
    # dropped committed tokens n_keep .. n_keep + n_discard - 1 (step.py); False, or none, when it
    # cannot (the verifier then decodes alone)


class ModelDrafter(SamplingDrafter):
    """Drafts by sampling the draft GGUF autoregressively from its warped distribution p.

    Its KV cache holds committed tokens ``offset ..`` (a prefix of them past the offset);
    ``propose`` first decodes the pending ones (one, or two after an all-accepted step, where the
    last draft was never decoded). ``window`` > 0 bounds the prompt the draft prefills to its
    last ``window`` tokens (``offset`` = the tokens left out; they are never decoded by the draft,
    which then sees positions 0 .. from the window's start): less prompt processing for long
    prompts, at some acceptance.
    """

    vocab_method, shared_v = "same", None

    def __init__(self, ctx: Context, n_vocab: int, window: int = 0) -> None:
        self.ctx = ctx
        self.n_vocab = n_vocab  # the verifier's V: the width of p
        self.n_logits = min(n_vocab, ctx.n_vocab)  # never propose an id the verifier lacks
        self.window = window
        self.offset = 0
        self._rows_d = np.zeros((0, n_vocab), dtype=np.float32)  # p_1 .. p_k: SamplingDrafter._rows

    @property
    def device_rows(self) -> bool:
        """Its rows may come from the device's top-K (device.py): a context that can sample on
        the device, and no id the verifier lacks."""
        return self.ctx.can_sample_on_device and self.ctx.n_vocab <= self.n_vocab

    def reset(self, prompt: Sequence[int], *, reuse: bool, lazy: bool = False) -> int | None:
        """Hold the prompt but its last token (the last ``window`` of them when a window is set;
        or, ``lazy``, only what the cache already shares with that: ``propose`` decodes the rest
        when a step first drafts). The tokens reused, or None when the prompt does not fit the
        draft's context."""
        self.offset = max(0, len(prompt) - 1 - self.window) if self.window > 0 else 0
        if self._room_for(prompt, 0) < 1:
            self.ctx.clear()
            return None
        held = prompt[self.offset:-1]
        self.deferred_prompt = len(held) if lazy else 0
        if lazy:
            n = self.ctx.shared_prefix(held) if reuse else 0
            return self.ctx.sync(held[:n], reuse=True)
        return self.ctx.sync(held, reuse=reuse)

    def resync(self, committed: Sequence[int]) -> bool:
        if self._room_for(committed, 0) < 1:
            return False
        self.ctx.sync(committed[self.offset:-1])
        return True

    def _pending(self, committed: Sequence[int], n_held: int) -> Sequence[int]:
        return committed[self.offset + n_held:]

    def _room_for(self, committed: Sequence[int], n_held: int) -> int:
        # 0 when a pending token is an id its vocabulary lacks (an unused padding id of a longer
        # verifier vocabulary, sampled by the verifier): it cannot follow from there
        if max(self._pending(committed, n_held), default=0) >= self.ctx.n_vocab:
            return 0
        # it decodes the pending tokens plus d_1 .. d_{k-1}
        return self.ctx.n_ctx - (len(committed) - self.offset) + 1

    def room(self, committed: Sequence[int]) -> int:
        return self._room_for(committed, self.ctx.n_past)

    def why_no_room(self, committed: Sequence[int]) -> str:
        if max(self._pending(committed, self.ctx.n_past), default=0) >= self.ctx.n_vocab:
            return "a token the draft's vocabulary lacks"
        return "draft context full"

    # -- the draft loop's model (SamplingDrafter): columns past the draft's vocabulary stay 0

    def _start(self, committed: Sequence[int]) -> np.ndarray:
        return self.ctx.decode(self._pending(committed, self.ctx.n_past), n_logits=1)[0]

    def _start_asks(self, committed: Sequence[int]):
        if self.ctx.n_past < self.deferred_prompt:  # a deferred prompt: decoded here, in chunks
            return self._start(committed)
        return (yield (self.ctx, self._pending(committed, self.ctx.n_past), 0))

    def rollback(self, n_keep: int) -> None:
        """Forget committed tokens past ``n_keep`` (a count of committed tokens, window included;
        a recurrent draft may keep fewer: the next ``propose`` decodes the rest)."""
        self.ctx.forget(max(0, min(self.ctx.n_past, n_keep - self.offset)))

    def shift(self, n_keep: int, n_discard: int) -> bool:
        """The verifier's context shift on the draft's cache (the same positions; what it does
        not hold yet it decodes later, as ever). False with a window (other positions)."""
        if self.offset or not self.ctx.can_shift:
            return False
        if self.ctx.n_past >= n_keep + n_discard:
            self.ctx.shift(n_keep, n_discard)
        else:
            self.ctx.forget(min(self.ctx.n_past, n_keep))
        return True


class NgramDrafter:
    """Prompt-lookup drafting: find the latest earlier occurrence of the last n committed tokens
    (n from ``n_max`` down to ``n_min``) and propose the tokens that followed it.

    Its proposals have no draft distributions: p is one-hot at each drafted token, so Cactus
    accepts with probability h[n] and SpS with q[n].
    """

    vocab_method, shared_v = None, None

    def __init__(self, n_max: int, n_min: int) -> None:
        self.n_max, self.n_min = n_max, n_min

    def reset(self, prompt: Sequence[int], *, reuse: bool, lazy: bool = False) -> int | None:
        return 0

    def resync(self, committed: Sequence[int]) -> bool:
        return True

    def room(self, committed: Sequence[int]) -> int:
        return 1 << 30  # no context of its own

    def why_no_room(self, committed: Sequence[int]) -> str:
        return ""  # it always has room

    def propose(self, committed: list[int], plan: DraftPlan, sampler: NativeSampler | None,
                grammar: Constraint | None = None) -> Draft:
        if not plan.uses("ngram"):
            return Draft.empty()
        L, k = len(committed), plan.k
        for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
            pattern = committed[L - n:]
            for start in range(L - n - 1, -1, -1):
                if committed[start:start + n] == pattern:
                    follow = committed[start + n:start + n + k]
                    return Draft(np.array(follow, dtype=np.int32), sources=("ngram",) * len(follow))
        return Draft.empty()

    def rollback(self, n_keep: int) -> None:
        pass

    def shift(self, n_keep: int, n_discard: int) -> bool:
        return True  # it reads the committed tokens as they are


class HybridDrafter:
    """Prompt lookup when the history holds a long enough match, the draft model otherwise (as
    llama.cpp chains its speculative drafters).

    Each step first looks for the last ``n_match`` committed tokens earlier in the history
    (``n_match`` = ``--ngram-max``: a full-length match, since a 1-token match mostly proposes
    noise); if found, the tokens that followed are proposed (no draft distributions: p one-hot)
    and the draft model does not run; else the model drafts (p its warped distribution). The
    model's KV cache catches up on the tokens committed during lookup steps the next time it
    drafts (one batched decode). Each Draft's ``sources`` say which one proposed it.
    """

    def __init__(self, model: Drafter, n_match: int) -> None:
        self.model = model
        self.lookup = NgramDrafter(n_match, n_match)
        self.vocab_method, self.shared_v = model.vocab_method, model.shared_v

    def reset(self, prompt: Sequence[int], *, reuse: bool, lazy: bool = False) -> int | None:
        return self.model.reset(prompt, reuse=reuse, lazy=lazy)

    def resync(self, committed: Sequence[int]) -> bool:
        return self.model.resync(committed)

    def room(self, committed: Sequence[int]) -> int:
        return self.model.room(committed)

    def why_no_room(self, committed: Sequence[int]) -> str:
        return self.model.why_no_room(committed)

    def propose(self, committed: list[int], plan: DraftPlan, sampler: NativeSampler,
                grammar: Constraint | None = None) -> Draft:
        draft = self.lookup.propose(committed, plan, sampler, grammar)
        if len(draft):
            return draft
        return self.model.propose(committed, plan, sampler, grammar)

    def rollback(self, n_keep: int) -> None:
        self.model.rollback(n_keep)

    def shift(self, n_keep: int, n_discard: int) -> bool:
        return getattr(self.model, "shift", lambda *_: False)(n_keep, n_discard)


def synth_rates(rates: str | None, length: float | None, n_max: int) -> tuple[float, ...]:
    """The unconditional acceptance rates r_0 .. r_{n_max-1} of synthetic acceptance (llama-server's
    ``--spec-synth-rates`` / ``--spec-synth-len``; options/records.py checked them): the rates as
    given, or, for a mean acceptance length L (the verifier's token included), the geometric rates
    r_i = p^(i+1) with p in [0, 1] solving  sum_{i=1..n_max} p^i = L - 1  (bisection: the sum
    grows with p). () when neither is set."""
    if rates is not None:
        return tuple(float(r) for r in rates.split(","))
    if length is None:
        return ()
    target = length - 1.0
    if target >= n_max:  # L = n_max + 1: every draft accepted (p = 1; the sum's top)
        p = 1.0
    else:
        lo, hi = 0.0, 1.0
        for _ in range(64):  # 64 halvings: well below a float64 ulp of [0, 1]
            mid = 0.5 * (lo + hi)
            if sum(mid ** i for i in range(1, n_max + 1)) < target:
                lo = mid
            else:
                hi = mid
        p = 0.5 * (lo + hi) if target > 0.0 else 0.0  # L = 1: nothing accepted
    return tuple(p ** (i + 1) for i in range(n_max))


class SynthDrafter:
    """llama-server's synthetic acceptance, for benchmarking the engine at chosen acceptance
    rates: the wrapped drafter proposes as usual, and instead of the acceptance rule, seeded
    coins decide how many drafts are accepted, whatever the verifier's rows say.

    With rates r_0 .. r_{n-1} (``synth_rates``), draft position i is accepted, given that
    position i - 1 was, with probability c_i = r_i / r_{i-1} (r_{-1} = 1; c_i = 0 once a rate is
    0), so position i is reached with probability r_i. The coins stop at the first refusal, and
    a drafted end-of-generation token is never accepted (it would end the answer early). The
    step then emits the verifier's own sample at the first position not accepted (step.py), and
    the drafts draw from their own stream (engine.py), so with every rate 0 the output is the
    verifier alone's for the same seed; otherwise it is not the verifier's output at all: a
    benchmark of speed, never of text.

    The coins draw from a stream of their own (the request's seed, ``STREAM`` apart from the
    verifier's), so the same seed gives the same acceptances.
    """

    STREAM = 0x5EC5_7A7E  # added to the seed: the coins' stream, apart from the samplers'

    def __init__(self, inner: Drafter, rates: Sequence[float], seed: int) -> None:
        self.inner = inner
        self.rates = tuple(rates)
        self.vocab_method, self.shared_v = inner.vocab_method, inner.shared_v
        self.model = getattr(inner, "model", inner)  # what the step reads the draft's state from
        prev, conditional = 1.0, []
        for r in self.rates:
            conditional.append(r / prev if prev > 0.0 else 0.0)
            prev = r
        self.conditional = tuple(conditional)  # c_i, float [n]
        self._rng = Rng((seed + self.STREAM) % 2**64)
        log.debug("synthetic acceptance (benchmarking only: the output is not the verifier's): "
                    "rates %s", ", ".join(f"{r:.6g}" for r in self.rates))

    def accepted(self, tokens: np.ndarray, is_eog: Callable[[int], bool]) -> int:
        """How many of the drafted ``tokens`` (int32 [k], k <= len(rates)) the coins accept: the
        first refused position, or k."""
        for i, token in enumerate(tokens.tolist()):
            if not self._rng.uniform() < self.conditional[i] or is_eog(token):
                return i
        return len(tokens)

    def reset(self, prompt: Sequence[int], *, reuse: bool, lazy: bool = False) -> int | None:
        return self.inner.reset(prompt, reuse=reuse, lazy=lazy)

    def resync(self, committed: Sequence[int]) -> bool:
        return self.inner.resync(committed)

    def room(self, committed: Sequence[int]) -> int:
        return self.inner.room(committed)

    def why_no_room(self, committed: Sequence[int]) -> str:
        return self.inner.why_no_room(committed)

    def propose(self, committed: list[int], plan: DraftPlan, sampler: NativeSampler,
                grammar: Constraint | None = None) -> Draft:
        return self.inner.propose(committed, plan, sampler, grammar)

    def rollback(self, n_keep: int) -> None:
        self.inner.rollback(n_keep)

    def shift(self, n_keep: int, n_discard: int) -> bool:
        return getattr(self.inner, "shift", lambda *_: False)(n_keep, n_discard)
