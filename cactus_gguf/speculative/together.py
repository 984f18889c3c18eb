"""The slots' steps taken together (``Engine.step_streams``): one engine call for each of several
generations, the verifications of those on separate KV-only slots decoded in one batch
(llama/batch.py), as llama-server's continuous batching verifies every slot's drafts in one decode.

Per generation the call is what it would be alone (engine.py ``_advance``): the prompt when it has
not been processed, else one step (step.py): its plan and draft (``begin_step``), the verifier's
rows of its tokens, the acceptance, commit and rollback (``end_step``). Only the verifier's decode
is shared: each drafter drafts on its own sequence of the draft's context, and a generation on a
recurrent model, with an MTP head or with the backend sampler steps alone. A batch holds at most
``n_batch`` tokens; more verifications go in further batches. Each row is its sequence's own (the
same logits as alone, up to the rounding of the batch's shape: docs/server.md "Slots"), so the
tokens do not depend on what else runs. A step in a shared batch is timed as its share of the
batch's rows (``Verification.verify_seconds``): what ``-k auto`` prices its next steps by.
"""
from __future__ import annotations

import time
from typing import Sequence

from ..llama.batch import can_batch, decode_together
from .prefill import resync
from .session import Session
from .step import begin_step_asks, end_step

__all__ = ["DONE", "steps_together"]

#: the outcome of a call on a stream that has ended (its ``result`` is set)
DONE = object()


def batchable(session: Session) -> bool:
    """Whether ``session``'s next call is a step whose verification can share a batch."""
    return (session.started and not session.finished and session.device_top_k == 0
            and can_batch(session.slot.verifier))


def steps_together(engine, sessions: Sequence[Session]) -> list:
    """One step of each of ``sessions`` (each :func:`batchable`, on separate slots), their
    verifications decoded together, under the engine's lock. Per session: its Chunk, or the
    exception that ended it (the session is then finished and its slot's caches unknown)."""
    out: list = [None] * len(sessions)
    pending = []  # (index, session, its Verification)

    def fail(i: int, s: Session, e: BaseException) -> None:
        s.slot.owner = None  # the caches may hold part of a step: restore before any reuse
        s.finished = True
        out[i] = e

    def done(i: int, s: Session, pieces: list[str]) -> None:
        if s.finished:
            pieces += s.finish()
        out[i] = s.chunk(pieces)

    for i, s, v in _draft_together(sessions, fail):
        if v is None:
            done(i, s, [])
        else:
            pending.append((i, s, v))
    n_batch = sessions[0].slot.verifier.n_batch if sessions else 0
    while pending:
        group, n = [], 0
        while pending and n + len(pending[0][2].tokens) <= n_batch:
            n += len(pending[0][2].tokens)
            group.append(pending.pop(0))
        if not group:  # one verification alone longer than n_batch: decoded alone, in chunks
            group = [pending.pop(0)]
        t = time.perf_counter()
        try:
            if len(group) == 1:
                i, s, v = group[0]
                rows = [s.slot.verifier.decode(v.tokens, n_logits=v.n_logits, may_drop=v.may_drop)]
            else:
                rows = decode_together([(s.slot.verifier, v.tokens, v.n_logits)
                                        for _, s, v in group])
        except Exception as e:  # noqa: BLE001
            for i, s, _ in group:
                fail(i, s, e)
            continue
        seconds, n_rows = time.perf_counter() - t, sum(len(v.tokens) for _, _, v in group)
        for (i, s, v), logits in zip(group, rows):
            v.verify_seconds = seconds * len(v.tokens) / n_rows  # its share of the batch
            try:  # (a shared batch takes longer than one step: not a slow step)
                pieces = end_step(s.slot.verifier, s, v, logits,
                                  engine._slow_steps if len(group) == 1 else None)
                s.stats.n_shared_steps += len(group) > 1
                done(i, s, pieces)
            except Exception as e:  # noqa: BLE001
                fail(i, s, e)
    return out


def _draft_together(sessions: Sequence[Session], fail) -> list:
    """Each session's first half of a step (step.py ``begin_step_asks``), their draft models'
    decodes answered together: at each round every drafter that asks gets its row, the asks on
    separate KV-only sequences of one draft context in one batch (its ``n_batch`` at most), the
    others alone. A session's draft time is its own work plus its share of each batch's rows.
    Per session that did not fail: (index, session, its Verification or None)."""
    live: list[list] = []  # [index, session, generator, ask, own seconds]
    out = []

    def send(entry, value=None, error=None, first=False) -> None:
        i, s, gen = entry[0], entry[1], entry[2]
        t = time.perf_counter()
        try:
            if first:
                if s.slot.owner is not s:
                    resync(s)
                ask = next(gen)
            else:
                ask = gen.throw(error) if error is not None else gen.send(value)
            entry[3] = ask
            entry[4] += time.perf_counter() - t
        except StopIteration as stop:
            entry[4] += time.perf_counter() - t
            v = stop.value
            if v is not None:
                v.draft_seconds = max(0.0, entry[4] - v.late)
            out.append((i, s, v))
            live.remove(entry)
        except Exception as e:  # noqa: BLE001 - handed to that session's caller
            live.remove(entry)
            fail(i, s, e)

    for i, s in enumerate(sessions):
        entry = [i, s, begin_step_asks(s.slot.verifier, s), None, 0.0]
        live.append(entry)
        send(entry, first=True)
    while live:
        group, alone, n, seen = [], [], 0, set()
        for entry in list(live):
            ctx, tokens, _ = entry[3]
            if (can_batch(ctx) and id(ctx) not in seen and n + len(tokens) <= ctx.n_batch
                    and (not group or ctx._together is group[0][3][0]._together)):
                group.append(entry)
                seen.add(id(ctx))
                n += len(tokens)
            else:
                alone.append(entry)
        if len(group) == 1:
            alone, group = group + alone, []
        if group:
            t = time.perf_counter()
            try:
                rows = decode_together([(e[3][0], e[3][1], 1) for e in group])
            except Exception as e:  # noqa: BLE001 - each drafter cleans up, then fails
                for entry in group:
                    send(entry, error=e)
            else:
                seconds = time.perf_counter() - t
                for entry, row in zip(group, rows):
                    entry[4] += seconds * len(entry[3][1]) / n
                    send(entry, row[0])
        for entry in alone:
            ctx, tokens, may_drop = entry[3]
            t = time.perf_counter()
            try:
                row = ctx.decode(tokens, n_logits=1, may_drop=may_drop)[0]
            except Exception as e:  # noqa: BLE001
                send(entry, error=e)
                continue
            entry[4] += time.perf_counter() - t
            send(entry, row)
    return out

