"""A prompt's token ids, checked against the model that reads them: text tokenized, ids that are
integers inside the vocabulary, at least one, and fewer than the context holds."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..errors import ContextLengthError, InputError

__all__ = ["prompt_tokens"]


def prompt_tokens(prompt, tokenize: Callable[[str], list[int]], n_vocab: int,
                  n_ctx: int, slots: int = 1) -> list[int]:
    """The token ids of ``prompt`` (text, tokenized by ``tokenize``, or a sequence of token ids).

    Raises InputError (param ``prompt``) for another type, ids that are not integers or not in
    [0, ``n_vocab``), no token at all; ContextLengthError for a prompt of ``n_ctx`` tokens or more
    (``n_ctx``: a slot's positions, of ``slots``; the message names the options to change).
    """
    if isinstance(prompt, str):
        tokens = tokenize(prompt)
    elif isinstance(prompt, (bytes, bytearray)) or not isinstance(prompt, Sequence):
        raise InputError(f"prompt must be a str or a sequence of token ids, got "
                         f"{type(prompt).__name__}", param="prompt")
    else:
        bad = next((t for t in prompt if isinstance(t, bool)
                    or not isinstance(t, (int, np.integer))), None)
        if bad is not None:
            raise InputError(f"prompt token ids must be integers, got {bad!r}",
                             param="prompt")
        tokens = [int(t) for t in prompt]
    if not tokens:  # empty text is a prompt when the model adds BOS (then its one token)
        raise InputError("the prompt is empty and this model adds no BOS token, so there is "
                         "nothing to continue: give some text" if isinstance(prompt, str)
                         else "the prompt is empty: give at least one token id",
                         param="prompt")
    bad = next((t for t in tokens if not 0 <= t < n_vocab), None)
    if bad is not None:
        raise InputError(f"prompt token id {bad} is outside the verifier's vocabulary "
                         f"[0, {n_vocab})", param="prompt")
    if len(tokens) >= n_ctx:
        n, cut = len(tokens), len(tokens) - n_ctx + 1
        raise ContextLengthError(
            f"the prompt is {n} tokens and {{n_ctx}} is {n_ctx}: raise {{n_ctx}} above {n} or "
            f"shorten the prompt by {cut} tokens (it exceeds the available context size)"
            if slots == 1 else
            f"the prompt is {n} tokens and a slot holds {n_ctx} ({{n_ctx}} {n_ctx * slots} / "
            f"{{n_parallel}} {slots}): raise {{n_ctx}} above {n * slots}, lower {{n_parallel}} "
            f"or shorten the prompt by {cut} tokens (it exceeds the available context size)",
            param="n_ctx", options=("n_ctx", "n_parallel"), n_prompt_tokens=n, n_ctx=n_ctx)
    return tokens
