"""Several sequences of one llama.cpp context decoded in one ``llama_decode`` (slots: the
verification batches of every slot that steps together, as llama-server's continuous batching).

Dimension letters: V = vocabulary size, n_i = tokens of part i, m_i = its logits rows.

Each part appends its tokens to its own sequence at that sequence's next positions and asks for
logits of its last m_i rows; llama.cpp computes every part's rows in the same graph (weights read
once for all of them), each row attending to its own sequence only. llama.cpp's KV cache of
separate sequences (``kv_unified`` off) forms its micro-batches of equal token counts from
consecutive sequence ids, so parts of equal length on consecutive slots go in one graph, others in
a few more (llama-batch.cpp ``split_equal``); the rows are the same either way.

Only KV-only sequences go here: a recurrent state's snapshot window and checkpoints are per decode
(rollback.py), and an MTP head observes its verifier's own decodes; such sequences decode alone.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

import llama_cpp
from llama_cpp import _internals

from . import devices, log
from .context import Context, DecodeError

__all__ = ["decode_together", "can_batch"]


def can_batch(ctx: Context) -> bool:
    """Whether ``ctx`` may decode in a batch with other sequences: one of several sequences of
    its context, no recurrent state, no decode observer (an MTP head), no backend sampler."""
    return (ctx.n_seq > 1 and not ctx.recurrent and ctx.on_decode is None
            and not ctx.device_top_k and not ctx.closed)


def _shared_batch(ctx: Context):
    """The llama_batch of n_batch rows (one sequence id a row) every sequence of ``ctx``'s
    llama.cpp context shares for :func:`decode_together`, with NumPy views on its token, pos and
    logits arrays; made on first use, freed with the context."""
    entry = ctx._together.get("batch")
    if entry is None:
        with log.critical():
            batch = _internals.LlamaBatch(n_tokens=ctx.n_batch, embd=0, n_seq_max=1)
        b = batch.batch
        views = (np.ctypeslib.as_array(b.token, shape=(ctx.n_batch,)),
                 np.ctypeslib.as_array(b.pos, shape=(ctx.n_batch,)),
                 np.ctypeslib.as_array(b.logits, shape=(ctx.n_batch,)))
        np.ctypeslib.as_array(b.n_seq_id, shape=(ctx.n_batch,))[:] = 1
        entry = ctx._together["batch"] = (batch, views)
    return entry


def decode_together(parts: Sequence[tuple[Context, Sequence[int], int]]) -> list[np.ndarray]:
    """Decode each part ``(sequence, tokens, m)`` of one llama.cpp context in one call: its
    tokens appended at the sequence's positions ``n_past ..``, logits for its last ``m`` rows
    (1 <= m <= len(tokens)). Every sequence must pass :func:`can_batch`, each at most once, and
    all tokens together fit ``n_batch``.

    Returns one float32 [m_i, V] array per part (copies: valid after the next decode).
    Raises DecodeError when llama.cpp fails (every sequence is then back where it was) or a
    part does not fit its sequence's context; InputError-free: the caller checks the above."""
    first = parts[0][0]
    n = sum(len(t) for _, t, _ in parts)
    if n > first.n_batch or len({id(c) for c, _, _ in parts}) != len(parts):
        raise DecodeError(f"a batch of {n} tokens over {len(parts)} parts does not fit "
                          f"n_batch={first.n_batch} once per sequence")
    for ctx, tokens, m in parts:
        if ctx.n_past + len(tokens) > ctx.n_ctx:
            raise DecodeError(f"context full: {ctx.n_past} + {len(tokens)} tokens > "
                              f"n_ctx={ctx.n_ctx}")
    batch, (b_token, b_pos, b_logits) = _shared_batch(first)
    b = batch.batch
    rows, i = [], 0
    for ctx, tokens, m in parts:
        k = len(tokens)
        b_token[i:i + k] = tokens
        b_pos[i:i + k] = np.arange(ctx.n_past, ctx.n_past + k, dtype=np.int32)
        b_logits[i:i + k] = 0
        b_logits[i + k - m:i + k] = 1
        for j in range(i, i + k):
            b.seq_id[j][0] = ctx.seq_id
        rows.append((i + k - m, m))
        i += k
    b.n_tokens = n
    first._last[0]._window = 0  # (KV-only parts: no window to keep, but the owner's is gone)
    first._last[0] = first
    rc = devices.call(first._remote, llama_cpp.llama_decode, first.ptr, b)
    if rc != 0:
        for ctx, _, _ in parts:  # drop whatever the failed call may have stored
            llama_cpp.llama_memory_seq_rm(ctx.memory, ctx.seq_id, ctx.n_past, -1)
        what = {1: "no KV-cache slot for the batch: the context size has been exceeded",
                2: "aborted"}.get(rc, "error")
        raise DecodeError(f"llama_decode returned {rc}: {what}")
    out = []
    for (ctx, tokens, _), (row, m) in zip(parts, rows):
        ctx.tokens.extend(int(t) for t in tokens)
        got = np.empty((m, ctx.n_vocab), np.float32)
        for r in range(m):
            ptr = llama_cpp.llama_get_logits_ith(first.ptr, row + r)
            if not ptr:
                raise DecodeError(f"llama_get_logits_ith({row + r}) returned NULL")
            got[r] = np.ctypeslib.as_array(ptr, shape=(ctx.n_vocab,))
        out.append(got)
    return out
