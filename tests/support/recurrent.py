"""The rollback check of a model with a recurrent state: the logits of one more token decoded
after a rollback, against a new context that decoded the same tokens from empty (max |difference|
below ``TOL``)."""
from __future__ import annotations

import numpy as np

from cactus_gguf.llama import Context, ContextOptions

# Decoding the same tokens in other batch shapes alone moves these logits by up to 4e-4 (lfm2, one
# token decoded alone or in a batch) and ~3e-3 after hundreds of tokens of mixed shapes; a wrong
# state moves them by more than 1 (tests/test_recurrent.py's control test)
TOL = 0.02


def opts(n_rs_seq: int = 4, n_batch: int = 32) -> ContextOptions:
    return ContextOptions(n_ctx=512, n_batch=n_batch, n_threads=1, n_rs_seq=n_rs_seq)


def next_logits(ctx: Context, token: int) -> np.ndarray:
    """The logits after decoding ``token`` on ``ctx`` (float32 [V], a copy)."""
    return np.array(ctx.decode([token], n_logits=1)[0])


def fresh_logits(path, tokens, token: int) -> np.ndarray:
    with Context.load(path, context_options=opts()) as fresh:
        if tokens:
            fresh.decode(list(tokens), n_logits=0)
        return next_logits(fresh, token)


def error_after(ctx: Context, path, probe: int = 60) -> float:
    """max |logits after ``probe``| of ``ctx`` against a fresh prefill of what it holds."""
    held = list(ctx.tokens)
    return float(np.abs(next_logits(ctx, probe) - fresh_logits(path, held, probe)).max())
