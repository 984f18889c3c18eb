"""Prompt processing: a generation's first engine call (``Engine._advance``) decodes its prompt,
reusing what its slot's KV caches already hold (llama-server's ``cache_prompt``).

The verifier decodes all but the prompt's last token (that one opens the first verification batch);
the drafter resets on the prompt, or defers its decode until it first drafts (a lazy reset under
``-k auto``). Beside other slots' generations a call decodes at most one ``chunk`` of the verifier's
prompt (``n_batch`` tokens: llama-server's chunked prompt processing), so a long prompt does not
hold them up; the calls go on until the prompt is in. A cancel is seen between ``n_batch`` chunks
and, on a CPU, inside one (llama/abort.py); the caches then hold a prefix of the prompt, still
reusable. Progress reports (the server's ``return_progress``) come before each chunk of the
verifier's decode and once the prompt is in.

The same prefix reuse restores a slot's caches to a generation's committed tokens when another
generation used them in between (``resync``: more interleaved streams than slots, slots.py).
"""
from __future__ import annotations

import contextlib
import logging
import time

from ..llama.abort import abortable
from ..llama.context import DecodeCancelled, DecodeError
from .policy import CostAwareDraftLength
from .session import Progress, Session

__all__ = ["prefill", "resync"]

log = logging.getLogger("cactus_gguf.speculative.engine")


def prefill(session: Session, chunk: int | None = None) -> None:
    """Decode the prompt but its last token (which opens the first verification batch),
    reusing what the caches already hold; ``chunk``: at most that many of the verifier's
    tokens in this call (the session starts once they are all in: ``session.started``)."""
    now = time.perf_counter()
    first = not session.t_prefill
    t0 = session.t_prefill = session.t_prefill or now
    slot = session.slot
    verifier, draft = slot.verifier, slot.draft
    reuse = session.request.cache_prompt
    prompt, target = session.prompt, session.prompt[:-1]
    stop = session.should_stop or (lambda: False)
    abort = None
    report, reported = session.progress, session.progress_reported
    asked = len(target)

    def chunk_progress(done: int, n: int) -> None:  # before each chunk of the verifier's
        # decode of target[:asked]: those it does not decode were in the cache
        cache = session.stats.n_prompt_tokens_reused if not first else asked - n
        reported.append(done)
        report(Progress(len(prompt), cache, verifier.n_past, time.perf_counter() - t0))
    log.debug("processing a prompt of %d tokens", len(prompt))
    try:  # a cancel is seen between n_batch chunks (a long prompt takes many) and, on a CPU,
        # inside one (llama.cpp's abort callback: llama/abort.py)
        with contextlib.ExitStack() as interruptible:
            for c in (verifier, draft):
                if c is not None:
                    interruptible.enter_context(c.interruptible(
                        stop, chunk_progress if report is not None and c is verifier
                        else None))
            if session.should_stop is not None:
                abort = interruptible.enter_context(abortable((verifier, draft), stop))
            if slot.mtp is not None and first:  # the head's decodes of this prompt: its reuse
                slot.mtp.n_caught_up = 0  # (mtp.py)
            if chunk is not None:
                held = verifier.shared_prefix(target) if reuse or not first else 0
                asked = min(len(target), held + chunk)
            reused = verifier.sync(target[:asked], reuse=reuse or not first)
            if first:
                session.stats.n_prompt_tokens_reused = reused
            if asked < len(target):  # more chunks to come, in later calls
                session.stats.prefill_seconds += time.perf_counter() - now
                slot.owner = session
                return
            if session.drafter is not None and not stop():
                lazy = isinstance(session.policy, CostAwareDraftLength)  # drafts if it pays
                reused = session.drafter.reset(prompt, reuse=reuse, lazy=lazy)
                if reused is None:  # the verifier alone
                    session.stop_drafting("prompt does not fit the draft's context")
                else:
                    session.stats.n_draft_prompt_tokens_reused = reused
            cancelled = stop()
    except DecodeCancelled:  # the caches hold a prefix of the prompt: still reusable
        cancelled = True
    except DecodeError:
        if abort is None or not abort.aborted:
            raise
        cancelled = True  # stopped inside a chunk: that decode call was rolled back
    session.stats.prefill_seconds += time.perf_counter() - now
    if report is not None and not cancelled:  # the prompt is in the caches
        cache = session.stats.n_prompt_tokens_reused
        if not reported:  # nothing was decoded: the first report, from the cache alone
            report(Progress(len(prompt), cache, cache, session.stats.prefill_seconds))
        report(Progress(len(prompt), cache, len(prompt), session.stats.prefill_seconds))
    session.policy.prompt_processed(session.stats.prefill_seconds,
                                    _draft_behind(session.drafter))
    log.debug("prompt of %d tokens: %d reused from the verifier's cache, %d from the draft's",
              len(prompt), session.stats.n_prompt_tokens_reused,
              session.stats.n_draft_prompt_tokens_reused)
    slot.owner = None if cancelled else session
    session.started = True
    session.t_start = time.perf_counter()
    if cancelled:
        session.stop("cancelled", "cancelled during prompt processing")
        session.finish()


def resync(session: Session) -> None:
    """Another generation used the caches since this session's last step: make them hold
    this session's committed tokens again (prefix reuse keeps what both share)."""
    session.slot.verifier.sync(session.committed[:-1])
    if session.drafter is not None and not session.drafter.resync(session.committed):
        session.stop_drafting("a token the draft's vocabulary lacks")
    session.slot.owner = session


def _draft_behind(drafter) -> int:
    """The prompt tokens a drafter's model deferred and has yet to decode (a lazy ``reset``,
    draft.py; a hybrid drafter's model), 0 for one that defers none."""
    model = getattr(drafter, "model", drafter)
    ctx, deferred = getattr(model, "ctx", None), getattr(model, "deferred_prompt", 0)
    return max(0, deferred - ctx.n_past) if deferred and ctx is not None else 0
