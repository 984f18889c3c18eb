"""A step's proposal: what the policy allows (:class:`DraftPlan`), what a drafter proposes
(:class:`Draft`), and the one loop every sampling drafter drafts with (:class:`SamplingDrafter`).

The policy (policy.py) decides a plan per step; the drafters (drafters.py, foreign.py, mtp.py) read
it and never call back into the policy; the step (step.py) verifies the Draft. Dimension letters:
V = the verifier's vocabulary size, V_d = a draft's (its rows), k = draft length.

The draft loop can hand its model's decodes to its caller (:meth:`SamplingDrafter.propose_asks`:
a generator that yields each decode it needs as a :data:`DecodeAsk` and is sent the row), so
several slots' drafters decode their draft positions in one batch (together.py); ``propose``
answers the asks itself, one decode each (:func:`answer_asks`).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from ..sampling import EmptyMaskError, NativeSampler
from ..sampling.constraints import Constraint
from .device import read_rows

if TYPE_CHECKING:
    from ..llama import Context

__all__ = ["SOURCES", "Draft", "DraftPlan", "SamplingDrafter", "DecodeAsk", "answer_asks",
           "asks_of"]

#: a decode the draft loop asks for: (context, tokens appended, how many of them the caller may
#: roll back after it); answered with the logits of its last row (float32 [>= n_logits]).
DecodeAsk = tuple

# Who proposed a drafted token: a model (sampled from its warped distribution p: the draft GGUF, a
# foreign draft, the verifier's MTP head) or prompt lookup (``ngram``: a token copied from the
# history, p one-hot there).
SOURCES = ("model", "ngram")

_NO_TOKENS = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True, eq=False)
class Draft:
    """One step's proposal d_1 .. d_k (k = 0: nothing proposed).

    tokens: int32 [k], the drafted ids. probs: float32 [k, V], the warped draft distributions p_i
    each token was sampled from, or None when there are none (a prompt-lookup proposal, p one-hot
    at each drafted token, or k = 0): what the acceptance test is given. sources: [k], each
    token's proposer, one of ``SOURCES``. p: float32 [k], the draft's confidence in each drafted
    token, what the policy learns acceptance from: p_i[d_i], or, when the draft samples at its own
    temperature (``--draft-temp``) and the plan reads it, the token's probability in the draft's
    row under the request's warps (a greedy draft's p_i is one-hot: it says nothing); None with
    ``probs``. n_forwards: draft-model forward passes (``llama_decode`` calls) the proposal took.
    ``probs`` may view a drafter's buffer: valid until its next ``propose``. compact: instead of
    ``probs`` (then None), when the draft's rows came from the device's top-K (device.py): (ids
    int32 [k, K + 1], probs float32 [k, K + 1]), row i p_i over its ids (ascending; -1 pads a row
    of fewer ids; p_i is 0 elsewhere); None otherwise.
    """

    tokens: np.ndarray
    probs: np.ndarray | None = None
    sources: tuple[str, ...] = ()
    p: np.ndarray | None = None
    n_forwards: int = 0
    compact: tuple[np.ndarray, np.ndarray] | None = None

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
                     self.sources[:n], None if self.p is None else self.p[:n], self.n_forwards,
                     None if self.compact is None else (self.compact[0][:n],
                                                        self.compact[1][:n]))

    @property
    def lookup(self) -> bool:
        """Prompt lookup proposed it (not empty, every token ``ngram``)."""
        return bool(self.sources) and self.sources[0] == "ngram"

    @property
    def deterministic(self) -> bool:
        """Tokens without distributions (p one-hot): prompt lookup, or a draft's text re-tokenised
        by the verifier; not sampled under a grammar's mask, so the grammar checks them after."""
        return len(self) > 0 and self.probs is None and self.compact is None


@dataclass(frozen=True)
class DraftPlan:
    """What one step may draft: a value the policy hands the drafter (it reads it; the policy is
    not called back while drafting).

    k: the most tokens to draft (0: a verifier-only step). sources: the proposers allowed this
    step (a subset of ``SOURCES``). p_min: a sampled token whose warped row's largest probability
    is below it is dropped and drafting stops (llama.cpp's ``--draft-p-min``; 0: never).
    worth_more: given the drafted tokens' confidences p (float32 [j], Draft.p), whether drafting
    another still pays (a snapshot of the cost-aware rule, policy.py); None: always, up to k.
    Both read the draft's row under the request's warps (its confidence), whatever temperature
    the draft samples at.
    """

    k: int
    sources: frozenset[str] = frozenset(SOURCES)
    p_min: float = 0.0
    worth_more: Callable[[np.ndarray], bool] | None = None

    def uses(self, source: str) -> bool:
        return self.k > 0 and source in self.sources

    def too_unsure(self, probs: np.ndarray) -> bool:
        # compared in float32, as the row (NumPy's rule for a Python float against float32)
        return self.p_min > 0.0 and bool(probs.max() < self.p_min)

    def more(self, p: np.ndarray) -> bool:
        return self.worth_more is None or self.worth_more(p)

    @property
    def reads_confidence(self) -> bool:
        """Whether the plan looks at the draft's confidence (``too_unsure`` or ``more``)."""
        return self.p_min > 0.0 or self.worth_more is not None

    def at_most(self, k: int) -> "DraftPlan":
        """The same plan with at most ``k`` tokens (a drafter's room)."""
        return self if k >= self.k else replace(self, k=max(0, k))


class SamplingDrafter:
    """The one draft loop of every drafter that samples a model token by token (the draft GGUF,
    a foreign draft, the verifier's MTP head): d_i is drawn from the warped row p_i under the
    grammar's mask, dropped when the plan finds the row too unsure, mapped to the verifier's id,
    pushed to the grammar; drafting stops after the k-th token, an end-of-generation token, or
    when the plan says another would not pay; otherwise the model decodes d_i for the next row.

    A subclass says how its model reaches the first row (``_start``), and, for a vocabulary that
    is not the verifier's, how an id and its row become the verifier's (``_to_verifier``,
    ``_proposal``); a model that is not a plain context (the MTP head) also how the next row is
    reached (``_advance``, ``_finish``, ``_is_eog``). Attributes it sets: ``ctx`` (the model's
    Context), ``n_logits`` (the ids its rows may propose: a prefix of the row) and ``_rows_d``
    (grown by ``_rows``: float32 [>= k, W], the rows p_i are sampled into, W its sampler's
    vocabulary).
    """

    ctx: Context
    n_logits: int
    _rows_d: np.ndarray
    _confidence: np.ndarray | None = None  # float32 [W]: a row under the request's warps
    #: the request's top-K when this step's rows come from the device (device.py; set by the
    #: step, only for a drafter whose ``device_rows`` is true), else 0
    device_k: int = 0
    device_rows = False  # whether its rows may come from the device: same ids as the verifier
    #: the prompt tokens (in the model's context) a lazy ``reset`` left to the first ``_start``,
    #: and the seconds that decode took (prompt processing: the step moves them there, step.py)
    deferred_prompt = 0
    late_prefill_seconds = 0.0
    # -- what a subclass provides --------------------------------------------------------------

    def _start(self, committed: Sequence[int]) -> np.ndarray | None:
        """Bring the model up to ``committed``; the logits of its first draft position (float32
        [>= n_logits], valid until the next decode), or None when it cannot draft this step."""
        raise NotImplementedError

    def _advance(self, token: int, n: int) -> np.ndarray:
        """Decode the drafted ``token`` (the n-th; d_1 .. d_n may be rolled back); the next
        row's logits."""
        return self.ctx.decode([token], n_logits=1, may_drop=n)[0]

    def _finish(self) -> None:
        """After drafting (also on an error), once ``_start`` returned a row."""

    def _is_eog(self, token: int) -> bool:
        return self.ctx.model.is_eog(token)

    def _sampler(self, sampler: NativeSampler) -> NativeSampler:
        """The sampler its rows are drawn with (the request's, unless it has its own)."""
        return sampler

    def _allowed(self, grammar: Constraint | None) -> np.ndarray | None:
        """The packed mask of ids its rows may draw now (None: every id)."""
        return grammar.allowed() if grammar is not None else None

    def _to_verifier(self, i: int, token: int) -> tuple[int, float] | None:
        """Draft ``i``'s verifier id and its own draft probability p_i[d_i] (row i of
        ``_rows_d`` holds the law it was drawn from); None ends the draft before it. The same
        vocabulary: the id itself."""
        return token, float(self._rows_d[i, token])

    def _proposal(self, n: int) -> np.ndarray | None:
        """The n drafts' laws over the verifier's ids: float32 [n, V] (None: one-hot)."""
        return self._rows_d[:n]

    def _start_asks(self, committed: Sequence[int]):
        """``_start`` as a generator of the decodes it needs (:data:`DecodeAsk`; a subclass whose
        first row is one plain decode of its context asks for it, the others decode it
        themselves); returns the row."""
        return self._start(committed)
        yield  # (a generator)

    def _advance_asks(self, token: int, n: int):
        """``_advance`` as a generator: the plain decode of ``token`` is asked for; a subclass
        that reaches its next row otherwise (the MTP head) does it itself."""
        if type(self)._advance is SamplingDrafter._advance:
            return (yield (self.ctx, [token], n))
        return self._advance(token, n)

    # -- the loop ----------------------------------------------------------------------------------

    def _rows(self, k: int, width: int) -> np.ndarray:
        """``_rows_d`` with at least ``k`` rows of ``width`` (grown on demand, zero-filled: a
        narrower model's rows stay 0 past its ids)."""
        if k > len(self._rows_d):
            self._rows_d = np.zeros((k, width), dtype=np.float32)
        return self._rows_d

    def _confidence_row(self, sampler: NativeSampler, plan: DraftPlan) -> np.ndarray | None:
        """The buffer the draft's row is warped into under the request's warps (the draft's
        confidence), when the draft samples at another temperature and the plan reads it; None
        otherwise (the sampled row is the confidence: no second warp)."""
        if not plan.reads_confidence or sampler.draft_sampling == sampler.sampling:
            return None
        if self._confidence is None or len(self._confidence) != sampler.n_vocab:
            self._confidence = np.zeros(sampler.n_vocab, dtype=np.float32)
        return self._confidence

    def propose(self, committed: list[int], plan: DraftPlan, sampler: NativeSampler,
                grammar: Constraint | None = None) -> Draft:
        """Draft up to ``plan.k`` tokens after ``committed`` (the Drafter protocol, drafters.py).
        Raises what NativeSampler.draft and the model's decodes raise (EngineError)."""
        return answer_asks(self.propose_asks(committed, plan, sampler, grammar))

    def propose_asks(self, committed: list[int], plan: DraftPlan, sampler: NativeSampler,
                     grammar: Constraint | None = None):
        """:meth:`propose` as a generator: yields each decode of its model it needs
        (:data:`DecodeAsk`), is sent that decode's last row, and returns the Draft; an error of
        the decode is thrown into it. The caller may answer several drafters' asks in one batch."""
        if not plan.uses("model"):
            return Draft.empty()  # pending tokens wait: the next step that drafts decodes them
        t0, deferred = time.perf_counter(), self.ctx.n_past < self.deferred_prompt
        row = yield from self._start_asks(committed)
        if deferred:  # that decode held the prompt a lazy reset deferred (and the tokens since)
            self.late_prefill_seconds += time.perf_counter() - t0
            self.deferred_prompt = 0
        if row is None:
            return Draft.empty()
        k, sampler = plan.k, self._sampler(sampler)
        rows = self._rows(k, sampler.n_vocab)
        confidence = self._confidence_row(sampler, plan)
        tokens, p = np.zeros(k, np.int32), np.zeros(k, np.float32)
        n_forwards, n = 1, 0
        compact: tuple[np.ndarray, np.ndarray] | None = None
        if self.device_k and grammar is None and self.ctx.device_top_k == self.device_k + 1:
            compact = (np.full((k, self.device_k + 1), -1, np.int32),
                       np.zeros((k, self.device_k + 1), np.float32))
        try:
            for i in range(k):
                if compact is not None:  # rows from the device's top-K (device.py)
                    taken = self._compact_draft(row, rows[i], sampler, confidence,
                                                compact[0][i], compact[1][i], plan)
                else:
                    taken = self._sampled_draft(i, row, rows[i], sampler, confidence, grammar,
                                                plan)
                if taken is None:
                    break  # the draft is unsure, or cannot go on: verify what we have
                d, tokens[i], p[i] = taken
                n += 1
                if i == k - 1 or self._is_eog(d) or not plan.more(p[:n]):
                    break  # nothing to propose after the last draft or an end-of-generation token
                row = yield from self._advance_asks(d, n)
                n_forwards += 1
        finally:
            self._finish()
        if n == 0:
            return Draft.empty(n_forwards)
        if compact is not None:
            return Draft(tokens[:n], None, ("model",) * n, p[:n], n_forwards,
                         (compact[0][:n], compact[1][:n]))
        return Draft(tokens[:n], self._proposal(n), ("model",) * n, p[:n], n_forwards)

    def _sampled_draft(self, i: int, row: np.ndarray, out: np.ndarray, sampler: NativeSampler,
                       confidence: np.ndarray | None, grammar: Constraint | None,
                       plan: DraftPlan) -> tuple[int, int, float] | None:
        """Draft ``i`` sampled from the full logits ``row`` under the grammar's mask, its law
        into ``out`` (row i of ``_rows_d``): (the draft's id d, the verifier's id, its p);
        None ends the draft before it (the grammar allows only ids this model cannot say, the
        plan finds the row too unsure, the id has no verifier id)."""
        allowed = self._allowed(grammar)
        try:
            d = sampler.draft(row[:self.n_logits], out, allowed=allowed)
        except EmptyMaskError:  # the grammar allows only ids this model cannot say
            return None
        if confidence is not None:  # the row under the request's warps, not the draft's
            sampler.warp_into(row[:self.n_logits], confidence, allowed=allowed)
        if plan.too_unsure(out if confidence is None else confidence):
            return None  # the draft is unsure: verify what we have
        taken = self._to_verifier(i, d)
        if taken is None or (grammar is not None and not grammar.push(taken[0])):
            return None  # (push never fails: d was sampled under the grammar's mask)
        return d, taken[0], taken[1] if confidence is None else confidence[d]

    def _compact_draft(self, row: np.ndarray, out: np.ndarray, sampler: NativeSampler,
                       confidence: np.ndarray | None, c_ids: np.ndarray, c_p: np.ndarray,
                       plan: DraftPlan) -> tuple[int, int, float] | None:
        """A draft from the device's top-K row (``_device_row``; the verifier's ids), or, at a
        tie at the K-th logit, from the full row decoded again (``_full_row``, this row and the
        rest): (d, d, its p); None when the plan finds the row too unsure."""
        got = (self._device_row(sampler, confidence, c_ids, c_p)
               if self.ctx.device_top_k else None)
        if got is None:  # a tie at the K-th logit: this row (and the rest) in full
            if self.ctx.device_top_k:
                row = self.ctx.decode_full_again()[-1]
            got = self._full_row(row, out, sampler, confidence, c_ids, c_p)
        d, p_d, law = got
        if plan.too_unsure(law):
            return None  # the draft is unsure: verify what we have
        return d, d, p_d

    def _device_row(self, sampler: NativeSampler, confidence: np.ndarray | None,
                    c_ids: np.ndarray, c_p: np.ndarray):
        """The draft's next token from the last decode's device top-K row (device.py), its ids
        and p written into ``c_ids`` / ``c_p`` (int32 / float32 [K + 1]): (d, p(d) or its
        confidence, the law the plan reads); None when the row's top K is not exact (a tie at
        the K-th logit)."""
        got = read_rows(self.ctx, 1, self.device_k)
        if got is None:
            return None
        ids, logits = got[0][0], got[1][0]
        c_ids[:] = ids
        j = sampler.draft_compact(logits, c_p)
        law = c_p
        if confidence is not None:  # the row under the request's warps
            law = np.empty(len(ids), np.float32)
            sampler.warp_compact_into(logits, law)
        return int(ids[j]), float(law[j]), law

    def _full_row(self, row: np.ndarray, out: np.ndarray, sampler: NativeSampler,
                  confidence: np.ndarray | None, c_ids: np.ndarray, c_p: np.ndarray):
        """As ``_device_row`` from a full logits ``row`` (the fallback), ``out`` its p buffer;
        its support (at most K ids: the warps keep no more) into ``c_ids`` / ``c_p``."""
        d = sampler.draft(row[:self.n_logits], out)
        support = np.flatnonzero(out)
        c_ids[:len(support)], c_p[:len(support)] = support, out[support]
        law = out
        if confidence is not None:
            sampler.warp_into(row[:self.n_logits], confidence)
            law = confidence
        return d, float(law[d]), law


def answer_asks(asks):
    """Run a generator of :data:`DecodeAsk` (``SamplingDrafter.propose_asks``), answering each
    with its own decode; what it returns. A decode's error is thrown into it (its cleanup runs)
    and raised."""
    try:
        ask = next(asks)
        while True:
            ctx, tokens, may_drop = ask
            try:
                row = ctx.decode(tokens, n_logits=1, may_drop=may_drop)[0]
            except BaseException as e:  # noqa: BLE001 - the generator's cleanup, then raised
                ask = asks.throw(e)
                continue
            ask = asks.send(row)
    except StopIteration as done:
        return done.value


def asks_of(drafter, committed: list[int], plan: DraftPlan, sampler: NativeSampler,
            grammar: Constraint | None):
    """The drafter's proposal as a generator of decode asks where its loop is the plain one
    (SamplingDrafter's ``propose``, not overridden), else a generator that asks nothing and
    returns its ``propose``."""
    if isinstance(drafter, SamplingDrafter) and type(drafter).propose is SamplingDrafter.propose:
        return (yield from drafter.propose_asks(committed, plan, sampler, grammar=grammar))
    return drafter.propose(committed, plan, sampler, grammar=grammar)

