"""One step of speculative decoding, top to bottom: draft, verify, accept, commit.

For committed tokens t_0 .. t_{L-1} (t_{L-1} pending in both contexts; glossary in engine.py):
  draft:   the policy plans the step (a DraftPlan: k, ...); the drafter proposes d_1 .. d_k as a
           Draft (draft.py); a deterministic proposal (prompt lookup, a foreign draft's
           re-tokenised text) is cut at the first token the grammar refuses; the policy keeps
           the prefix worth verifying;
  verify:  one verifier decode of [t_{L-1}, d_1 .. d_k] with logits for all k+1 rows
           (float32 [k+1, V], read in place);
  accept:  the native helper returns AL and the residual / bonus token (a request that does not
           speculate samples the verifier's row 0 instead; under synthetic acceptance, seeded
           coins give AL and the verifier samples its row AL: drafters.py SynthDrafter);
  commit:  append d_1 .. d_AL and that token (with their log-probabilities, from the rows
           above, when the request asks: logprobs.py); fold the StepOutcome into the policy and the
           statistics; roll both KV caches back to (a prefix of) the committed tokens: the
           next step decodes whatever a context lacks (Context.forget).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..llama import Context
from ..sampling.native import StepResult
from ..stats import StepOutcome
from .costs import SlowStepWatch
from . import device
from .draft import Draft, DraftPlan, answer_asks, asks_of
from .drafters import SynthDrafter
from .session import Session

__all__ = ["run_step", "begin_step", "end_step", "Verification"]

log = logging.getLogger("cactus_gguf.speculative.engine")


@dataclass
class Verification:
    """A step between its draft and its verification (:func:`begin_step`): the verifier decodes
    ``tokens`` (the pending token(s), then the drafts) with logits for the last ``n_logits`` =
    len(draft) + 1 rows, of which it may drop ``may_drop`` = len(draft) again. ``t_draft`` /
    ``t_drafted``: the clock when the step began and when its draft was done;
    ``verify_seconds``: what the verification cost it, set by whoever decodes it (alone: the
    decode's seconds; in a batch shared with other slots: the batch's seconds times this step's
    share of its rows, what ``-k auto`` prices its steps by)."""

    tokens: list[int]
    n_logits: int
    may_drop: int
    proposal: Draft
    legal: Draft
    draft: Draft
    top_k: int
    late: float
    t_draft: float
    t_drafted: float
    verify_seconds: float = 0.0
    #: the draft's seconds when its decodes were shared with other slots' (together.py: its
    #: own work plus its share of each batch), else None: t_drafted - t_draft
    draft_seconds: float | None = None


def run_step(ver: Context, session: Session, slow_steps: SlowStepWatch) -> list[str]:
    """One draft-verify-accept-commit step of ``session`` on the verifier's context ``ver`` (which
    holds committed[:-1]); the text it released. ``slow_steps`` watches the verify times.
    Raises EngineError (a decode or the native helper failed; the caller restores the caches)."""
    v = begin_step(ver, session)
    if v is None:
        return []
    t = time.perf_counter()
    logits = ver.decode(v.tokens, n_logits=v.n_logits, may_drop=v.may_drop)
    v.verify_seconds = time.perf_counter() - t
    return end_step(ver, session, v, logits, slow_steps)


def begin_step(ver: Context, session: Session) -> Verification | None:
    """The first half of a step: plan it, draft, and say what the verifier must decode (None,
    the session stopped: a full context). The engine decodes it alone (:func:`run_step`) or in
    one batch with other slots' verifications (engine.py), then calls :func:`end_step`."""
    return answer_asks(begin_step_asks(ver, session))


def begin_step_asks(ver: Context, session: Session):
    """:func:`begin_step` as a generator of the draft model's decodes (draft.py ``DecodeAsk``:
    yielded, answered with the row), so several slots' drafts decode a position in one batch
    (together.py); returns the Verification (or None)."""
    committed, grammar, policy = session.committed, session.constraint, session.policy
    # The verifier holds committed[:-1]; the batch adds the pending token plus k drafts,
    # so k <= n_ctx - len(committed). Below 0 not even the pending token fits.
    room = ver.n_ctx - len(committed)
    if session.context_shift and room <= 0:  # full: shift, as llama-server does there
        _shift(ver, session)
        room = ver.n_ctx - len(committed)
    if room < 0:
        session.stop("length", f"context full (n_ctx={ver.n_ctx})")
        return None
    # ... and the batch must fit one llama_decode: k <= n_batch - 1. Under a context shift the
    # step ends at most at n_ctx committed tokens (k <= room - 1), so shifts happen where the
    # verifier alone's would, and the output does not depend on the draft
    margin = 1 if session.context_shift else 0
    plan = policy.plan(min(session.remaining - 1, room - margin, ver.n_batch - 1))
    if grammar is not None:
        grammar.start(plan.k)  # row 0: the committed output's mask
    top_k = _on_device(ver, session)

    t_draft = time.perf_counter()
    proposal = yield from _propose(session, plan)
    late = _late_prefill(session.drafter)  # the draft's prompt, decoded at its first draft:
    session.late_prefill_seconds += late  # prompt processing, not this step's (session.py)
    session.stats.prefill_seconds += late
    legal = proposal  # a deterministic proposal: up to the first token the grammar refuses
    if grammar is not None and proposal.deterministic:
        legal = proposal.prefix(grammar.extend(proposal.tokens, len(proposal)))
    draft = legal.prefix(policy.keep(legal))  # worth a batched verification (empty: verifier-only)
    # verify: one decode of the pending token(s) + the drafts, logits for len(draft) + 1 rows
    return Verification(committed[ver.n_past:] + draft.tokens.tolist(), len(draft) + 1,
                        len(draft), proposal, legal, draft, top_k, late, t_draft,
                        time.perf_counter())


def end_step(ver: Context, session: Session, v: Verification, logits: np.ndarray,
             slow_steps: SlowStepWatch | None) -> list[str]:
    """The second half of a step, after the verifier decoded ``v.tokens`` (``logits``: float32
    [len(draft) + 1, V], its rows): accept, commit, roll back; the text released.
    ``slow_steps`` watches the verify time (None: a batch shared with other slots)."""
    committed, grammar, policy = session.committed, session.constraint, session.policy
    proposal, legal, draft, top_k = v.proposal, v.legal, v.draft, v.top_k
    late, verify_seconds = v.late, v.verify_seconds
    t_accept = time.perf_counter()
    verdict = None
    if top_k:  # on the rows from the device's top-K (device.py), or all in full again after a tie
        session.stats.n_device_steps += 1
        verdict = _accept_rows(session, draft, ver, top_k)
        if verdict is None:
            logits = ver.decode_full_again()
            session.stats.n_device_fallbacks += 1
    if session.drafter is not None and session.drafter.shared_v is not None:
        session.stats.add_coverage(_coverage(session, logits[0], session.drafter.shared_v))
    if verdict is None:
        verdict = _accept(session, draft, logits, ver.model.is_eog)
    n_acc = verdict.n_accepted
    if grammar is not None:
        grammar.commit(n_acc, verdict.next_token)  # drop the rejected drafts, advance by the token
    t_end = time.perf_counter()
    if slow_steps is not None:
        slow_steps.observe(len(draft), verify_seconds)

    n_before, model = len(committed), ver.model
    last = "verifier" if not len(draft) else "bonus" if n_acc == len(draft) else "residual"
    pieces = session.emit(draft.tokens[:n_acc].tolist() + [verdict.next_token],
                          ["draft"] * n_acc + [last], model.is_eog, model.token_to_piece)
    if session.logprobs is not None:  # asked for: read before the next decode overwrites the rows
        _read_logprobs(session, logits, len(committed) - n_before)
    # the accepted drafts the generation used: up to its end (an ending end-of-generation
    # token included, drafts after a completed stop string not)
    used = len(committed) - n_before + (1 if session.stop_reason == "eos" else 0)
    outcome = StepOutcome(proposal.lookup, proposal.n_forwards, len(draft), verdict,
                          min(n_acc, used), v.t_drafted - v.t_draft - late
                          if v.draft_seconds is None else v.draft_seconds, verify_seconds,
                          t_end - t_accept, late)
    policy.observe(legal, outcome)
    session.stats.add_step(outcome)

    # Roll back: the verifier keeps t_0 .. t_{L-1} + the accepted drafts (the new pending
    # token is decoded next step); the draft keeps at most that much. After a stop inside
    # the block (EOS, stop string, length) that is committed[:-1]: nothing past the end (a
    # recurrent state that cannot drop the whole batch in place may keep the committed tokens
    # the batch held: up to n_before + n_acc).
    keep = min(n_before + n_acc, len(committed) - 1)
    ver.forget(min(ver.n_past, keep), upto=min(n_before + n_acc, len(committed)))
    if session.drafter is not None:
        session.drafter.rollback(keep)
    return pieces


def _shift(ver: Context, session: Session) -> None:
    """llama-server's context shift (``--context-shift``): keep the first n_keep committed tokens
    (the BOS token when the model adds one), discard half of those after them that the verifier
    holds, n_discard = floor((n_past - n_keep) / 2), from the verifier's cache, the draft's and
    ``committed``; the rest moves down (Context.shift). A drafter that cannot follow stops."""
    n_keep = min(ver.n_ctx - 4, 1 if ver.model.add_bos else 0)
    n_left = ver.n_past - n_keep
    n_discard = max(0, min(n_left // 2, n_left - 1))
    if n_discard == 0:
        return
    ver.shift(n_keep, n_discard)
    del session.committed[n_keep:n_keep + n_discard]
    session.stats.n_context_shifts += 1
    log.debug("context shift: n_keep %d, n_discard %d", n_keep, n_discard)
    drafter = session.drafter
    if drafter is not None and not getattr(drafter, "shift", lambda *_: False)(n_keep, n_discard):
        session.stop_drafting("context shift: this drafter cannot follow one")


def _propose(session: Session, plan: DraftPlan):
    """The drafter's proposal within ``plan`` (a generator of its decode asks: draft.py
    ``asks_of``); empty when there is no drafter (any more) or no room, and then, for want of
    room, the verifier decodes alone from here."""
    drafter, committed = session.drafter, session.committed
    if drafter is None or plan.k <= 0:
        return Draft.empty()
    room = drafter.room(committed)
    if room < 1:
        session.stop_drafting(drafter.why_no_room(committed))
        return Draft.empty()
    return (yield from asks_of(drafter, committed, plan.at_most(room), session.sampler,
                               session.constraint))


def _late_prefill(drafter) -> float:
    """Seconds the drafter's last proposal spent decoding the prompt it deferred
    (``reset(lazy=True)``, draft.py), taken from it; 0.0 for a drafter that defers none."""
    model = getattr(drafter, "model", drafter)  # a hybrid drafter's model
    seconds = getattr(model, "late_prefill_seconds", 0.0)
    if seconds:
        model.late_prefill_seconds = 0.0
    return seconds


def _on_device(ver: Context, session: Session) -> int:
    """Attach (or detach) the device's top-K on the verifier and on the draft for this step
    (device.py; a context another generation left attached is set back); the request's K when
    this step's rows come from the device, else 0."""
    k = session.device_top_k
    if k and not ver.set_device_top_k(k + 1):
        k = 0
    if not k:
        ver.set_device_top_k(0)
    drafter = session.drafter
    model = getattr(drafter, "model", drafter)  # a hybrid drafter's model
    ctx = getattr(model, "ctx", None)
    if hasattr(ctx, "set_device_top_k") and hasattr(model, "device_k"):
        model.device_k = k if k and ctx.set_device_top_k(k + 1) else 0
        if not model.device_k:
            ctx.set_device_top_k(0)
    return k


def _accept_rows(session: Session, draft: Draft, ver: Context, top_k: int
                 ) -> StepResult | None:
    """``_accept`` on the verifier's device rows of its top ``top_k`` + 1 (device.py; no
    grammar); None, having drawn nothing, when a row is not exact."""
    if not session.request.speculates:
        return device.sample_row(session.sampler, ver, top_k)
    if session.scope is not None:  # the top gap in code only (as _accept)
        session.sampler.use_acceptance(session.scope.rule)
    return device.verify_rows(session.sampler, draft, ver, top_k)


def _accept(session: Session, draft: Draft, logits: np.ndarray,
            is_eog: Callable[[int], bool]) -> StepResult:
    """The acceptance test of ``draft`` against the verifier's ``logits`` (float32
    [len(draft) + 1, V]); for a request that does not speculate, the verifier's own token from
    row 0 (AL 0, nothing evaluated). ``is_eog``: whether a token id ends a generation (a
    synthetic coin never accepts one)."""
    grammar = session.constraint
    if not session.request.speculates:
        token = session.sampler.sample(
            logits[0], allowed=grammar.allowed(0) if grammar is not None else None)
        return StepResult(0, token, 0, 0.0, 0.0)
    synth = session.drafter if isinstance(session.drafter, SynthDrafter) else None
    if synth is not None and len(draft):  # llama-server's benchmark mode: coins, not the rule
        n = synth.accepted(draft.tokens, is_eog)
        token = session.sampler.sample(
            logits[n], allowed=grammar.rows(len(draft))[n] if grammar is not None else None)
        return StepResult(n, token, min(n + 1, len(draft)), 0.0, 0.0)
    if session.scope is not None:  # the top gap in code only: the rule of the text so far
        session.sampler.use_acceptance(session.scope.rule)
    return session.sampler.verify(
        device.full_probs(draft, session.sampler.n_vocab), draft.tokens, logits,
        allowed=grammar.rows(len(draft)) if grammar is not None else None)


def _read_logprobs(session: Session, logits: np.ndarray, n_emitted: int) -> None:
    """The log-probabilities of the step's ``n_emitted`` tokens (logprobs.py): the i-th emitted
    token (accepted drafts, then the residual / bonus / verifier token) at row i of ``logits``
    (float32 [len(draft) + 1, V]), under the grammar mask that row had in the acceptance test."""
    grammar = session.constraint
    for i, token in enumerate(session.out_tokens[len(session.out_tokens) - n_emitted:]):
        session.token_logprobs.append(session.logprobs.read(
            logits[i], token, grammar.allowed(i) if grammar is not None else None))


def _coverage(session: Session, row: np.ndarray, shared_v: np.ndarray) -> float:
    """Σ q over the verifier ids a foreign draft can propose (``shared_v``: bool [V]), q the
    verifier's warped distribution at the step's first position (``row``: float32 [V] logits;
    unconstrained by any grammar)."""
    if session.q_buffer is None:
        session.q_buffer = np.empty(session.sampler.n_vocab, dtype=np.float32)
    session.sampler.warp_into(row, session.q_buffer)
    return float(session.q_buffer[shared_v].sum(dtype=np.float64))
