"""Who proposes the draft tokens: the Draft a proposal is, the Drafter interface, the draft model,
prompt lookup, and the hybrid of both.

A drafter proposes up to k tokens after the committed ones, as a :class:`Draft`; the engine's step
(step.py) verifies them. Its lifecycle within a generation: ``reset(prompt)`` once, then per step
``room`` / ``propose``, then ``rollback`` to what was committed. ``resync`` puts it back after
another generation used the shared draft context in between (an interleaved stream).

Glossary (engine.py): committed = the prompt plus every emitted token; pending = committed tokens a
context has not decoded yet (usually just the newest one). k = draft length, V = the verifier's
vocabulary size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from ..llama import Context
from ..sampling import EmptyMaskError, NativeSampler
from ..sampling.constraints import Constraint
from .policy import DraftPolicy

__all__ = ["Draft", "Drafter", "ModelDrafter", "NgramDrafter", "HybridDrafter", "SOURCES"]

# Who proposed a drafted token: the draft model (sampled from its warped distribution p) or prompt
# lookup (``ngram``: a token copied from the history, p one-hot there).
SOURCES = ("model", "ngram")

_NO_TOKENS = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, eq=False)
class Draft:
    """One step's proposal d_1 .. d_k (k = 0: nothing proposed).

    tokens: int32 [k], the drafted ids. probs: float32 [k, V], the warped draft distributions p_i
    each token was sampled from, or None when there are none (a prompt-lookup proposal, p one-hot
    at each drafted token, or k = 0): what the acceptance test is given. sources: [k], each
    token's proposer, one of ``SOURCES``. p: float32 [k], p_i[d_i], the drafted tokens' own draft
    probabilities (None with ``probs``). n_forwards: draft-model forward passes (``llama_decode``
    calls) the proposal took. ``probs`` may view a drafter's buffer: valid until its next
    ``propose``.
    """

    tokens: np.ndarray
    probs: np.ndarray | None = None
    sources: tuple[str, ...] = ()
    p: np.ndarray | None = None
    n_forwards: int = 0

    @classmethod
    def empty(cls, n_forwards: int = 0) -> "Draft":
        """Nothing proposed (after ``n_forwards`` draft-model decodes, e.g. of pending tokens)."""
        return cls(_NO_TOKENS, n_forwards=n_forwards)

    def __len__(self) -> int:
        return len(self.tokens)

    def prefix(self, n: int) -> "Draft":
        """The first ``n`` drafted tokens (0 <= n <= k) as a Draft of their own (same
        ``n_forwards``)."""
        if n == len(self):
            return self
        if n == 0:
            return Draft.empty(self.n_forwards)
        return Draft(self.tokens[:n], None if self.probs is None else self.probs[:n],
                     self.sources[:n], None if self.p is None else self.p[:n], self.n_forwards)

    @property
    def lookup(self) -> bool:
        """Prompt lookup proposed it (not empty, every token ``ngram``)."""
        return bool(self.sources) and self.sources[0] == "ngram"

    @property
    def deterministic(self) -> bool:
        """Tokens without distributions (p one-hot): prompt lookup, or a draft's text re-tokenised
        by the verifier; not sampled under a grammar's mask, so the grammar checks them after."""
        return len(self) > 0 and self.probs is None


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

    def propose(self, committed: list[int], k: int, sampler: NativeSampler, policy: DraftPolicy,
                grammar: Constraint | None = None) -> Draft:
        """Draft up to ``k`` tokens after ``committed``; an empty Draft when ``policy.uses``
        forbids its kind of proposal this step. ``grammar``: a sampling drafter samples each
        token under the grammar's current mask and pushes it (so p is over the legal tokens, as q
        will be); the engine checks a prompt-lookup proposal afterwards. Only reads ``policy``.
        Raises what NativeSampler.draft and Context.decode raise (EngineError)."""

    def rollback(self, n_keep: int) -> None:
        """Forget state past the first ``n_keep`` committed tokens."""


class ModelDrafter:
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
        self._probs = np.zeros((0, n_vocab), dtype=np.float32)  # grown by _buffer

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

    def _buffer(self, k: int) -> np.ndarray:
        """The rows p_1 .. p_k are sampled into: float32 [k, V], grown on demand. Columns past the
        draft's vocabulary stay 0 (it never proposes those ids)."""
        if k > len(self._probs):
            self._probs = np.zeros((k, self.n_vocab), dtype=np.float32)
        return self._probs

    def propose(self, committed: list[int], k: int, sampler: NativeSampler, policy: DraftPolicy,
                grammar: Constraint | None = None) -> Draft:
        if not policy.uses("model"):
            return Draft.empty()  # the pending tokens wait: the next step that drafts decodes them
        probs, tokens, p = self._buffer(k), np.zeros(k, np.int32), np.zeros(k, np.float32)
        row = self.ctx.decode(self._pending(committed, self.ctx.n_past), n_logits=1)[0]
        n_forwards, n = 1, 0
        for i in range(k):
            try:
                d = sampler.draft(row[:self.n_logits], probs[i],
                                  allowed=grammar.allowed() if grammar is not None else None)
            except EmptyMaskError:  # the grammar allows only ids the draft's vocabulary lacks
                break
            if policy.too_unsure(probs[i]):
                break  # the draft is unsure: verify what we have
            if grammar is not None and not grammar.push(d):
                break  # (never: d was sampled under the grammar's mask)
            tokens[i], p[i] = d, probs[i, d]
            n += 1
            if i == k - 1 or self.ctx.model.is_eog(d) or not policy.more(p[:n]):
                break  # nothing to propose after the last draft or an end-of-generation token
            row = self.ctx.decode([d], n_logits=1, may_drop=n)[0]  # d_1 .. d_n may go
            n_forwards += 1
        if n == 0:
            return Draft.empty(n_forwards)
        return Draft(tokens[:n], probs[:n], ("model",) * n, p[:n], n_forwards)

    def rollback(self, n_keep: int) -> None:
        """Forget committed tokens past ``n_keep`` (a count of committed tokens, window included;
        a recurrent draft may keep fewer: the next ``propose`` decodes the rest)."""
        self.ctx.forget(max(0, min(self.ctx.n_past, n_keep - self.offset)))


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

    def propose(self, committed: list[int], k: int, sampler: NativeSampler | None,
                policy: DraftPolicy, grammar: Constraint | None = None) -> Draft:
        if not policy.uses("ngram"):
            return Draft.empty()
        L = len(committed)
        for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
            pattern = committed[L - n:]
            for start in range(L - n - 1, -1, -1):
                if committed[start:start + n] == pattern:
                    follow = committed[start + n:start + n + k]
                    return Draft(np.array(follow, dtype=np.int32), sources=("ngram",) * len(follow))
        return Draft.empty()

    def rollback(self, n_keep: int) -> None:
        pass


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

    def propose(self, committed: list[int], k: int, sampler: NativeSampler, policy: DraftPolicy,
                grammar: Constraint | None = None) -> Draft:
        draft = self.lookup.propose(committed, k, sampler, policy, grammar)
        if len(draft):
            return draft
        return self.model.propose(committed, k, sampler, policy, grammar)

    def rollback(self, n_keep: int) -> None:
        self.model.rollback(n_keep)
