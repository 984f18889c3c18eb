"""The vocabulary: do this draft's ids mean what the verifier's do (else the pair speculates through
speculative/foreign.py), which ids end an answer (the end set of protected ends), and a request's
logit bias as token ids (its texts tokenized, ``ignore_eos``'s bans)."""
from __future__ import annotations

from typing import Sequence

import json
import math

import numpy as np

from ..errors import InputError
from ..llama import Model

__all__ = ["VocabMismatchError", "first_difference", "token_pieces", "end_set", "eog_ids",
           "logit_biases", "bias_row"]


def token_pieces(model: Model) -> list[str]:
    """Every id's text piece, decoded as UTF-8 (invalid bytes replaced): str [V]."""
    return [model.token_to_piece(t).decode("utf-8", "replace") for t in range(model.n_vocab)]


def end_set(model: Model, pieces: Sequence[str], stops: Sequence[str], n_vocab: int) -> np.ndarray:
    """The ids that end an answer: bool [n_vocab], True for end-of-generation tokens and for the
    tokens that start a stop string (a piece, with or without its leading whitespace, that is a
    prefix of a stop string or begins with one: for the stop "```", "`", "``", "```", "\n```"
    and "```\n"). The set protected ends guard (``--protect-ends``): ending is emitting one of them.
    ``pieces``: :func:`token_pieces` of ``model``; ids past them (padding) are never ends."""
    mask = np.zeros(n_vocab, dtype=bool)
    for t in range(min(n_vocab, len(pieces))):
        if model.is_eog(t):
            mask[t] = True
            continue
        for text in {pieces[t], pieces[t].lstrip()} - {""}:
            if any(s.startswith(text) or text.startswith(s) for s in stops if s):
                mask[t] = True
                break
    return mask

def eog_ids(model: Model) -> tuple[int, ...]:
    """The end-of-generation ids of ``model`` (EOS, EOT and its other EOG tokens), ascending."""
    return tuple(t for t in range(model.n_vocab) if model.is_eog(t))


def logit_biases(model: Model, logit_bias: str | None, ignore_eos: bool, eogs: Sequence[int],
                 n_vocab: int) -> list[tuple[int, float]]:
    """A request's logit bias as (token id, bias) entries, in the order given, as llama-server
    reads its ``logit_bias`` and ``ignore_eos`` fields (server-schema.cpp): an id key as it is
    (an id outside [0, n_vocab) is skipped, as there), a text key tokenized without BOS or
    special tokens, each of its tokens given the bias; a ban (false) is -inf; then, with
    ``ignore_eos``, -inf on each of ``eogs`` (:func:`eog_ids`). ``logit_bias``: the Request's
    JSON text (options/values.py, normalize_logit_bias) or None."""
    out: list[tuple[int, float]] = []
    for key, bias in json.loads(logit_bias) if logit_bias else ():
        value = -math.inf if bias is False else float(bias)
        ids = ([key] if isinstance(key, int)
               else model.tokenize(key, add_special=False, parse_special=False))
        out += [(t, value) for t in ids if 0 <= t < n_vocab]
    if ignore_eos:
        out += [(t, -math.inf) for t in eogs if t < n_vocab]
    return out


def bias_row(biases: Sequence[tuple[int, float]], n_vocab: int) -> np.ndarray | None:
    """The row the sampler adds to every logits row (sampling/native.py): float32 [n_vocab], the
    entries' biases summed per id (as llama.cpp's logit-bias sampler adds each entry in turn;
    -inf wins over any finite sum), 0 elsewhere; None for no entry (nothing is added)."""
    if not biases:
        return None
    row = np.zeros(n_vocab, dtype=np.float64)  # summed in float64, then one rounding
    for token, bias in biases:
        row[token] += bias
    return row.astype(np.float32)


# token attributes (llama.h enum llama_token_attr) that mark ids no text ever maps to
_ATTR_UNUSED = 1 << 1
_ATTR_UNDEFINED = 0


class VocabMismatchError(InputError):
    """Draft and verifier tokenize differently; speculation between them would be meaningless."""


def first_difference(verifier: Model, draft: Model) -> str | None:
    """Why the draft's ids do not mean what the verifier's do, naming the first difference (a
    phrase), or None when they do.

    Compared: tokenizer type; BOS / EOS / EOT ids and the add-BOS flag; the text of every id the
    two vocabularies share. Vocabularies of different sizes agree when the extra ids at the end
    of the longer one are unused padding (e.g. 151,936 vs 152,064 in the Qwen2 family); the draft
    then never proposes an id the verifier lacks.
    """
    v, d = verifier.path.name, draft.path.name
    if verifier.vocab_type != draft.vocab_type:
        return (f"draft {d} and verifier {v} use different tokenizer types "
                f"({draft.vocab_type} vs {verifier.vocab_type})")
    for what in ("bos", "eos", "eot", "add_bos"):
        a, b = getattr(verifier, what), getattr(draft, what)
        if a != b:
            return f"draft {d} and verifier {v} disagree on {what} (verifier {a}, draft {b})"
    n_common = min(verifier.n_vocab, draft.n_vocab)
    for i in range(n_common):
        tv, td = verifier.token_text(i), draft.token_text(i)
        if tv != td:
            return (f"draft {d} and verifier {v} have different vocabularies: token id {i} is "
                    f"{tv.decode('utf-8', 'replace')!r} in the verifier and "
                    f"{td.decode('utf-8', 'replace')!r} in the draft")
    longer = verifier if verifier.n_vocab > draft.n_vocab else draft
    for i in range(n_common, longer.n_vocab):
        text = longer.token_text(i)
        padding = (longer.token_attr(i) in (_ATTR_UNUSED, _ATTR_UNDEFINED)
                   or text.startswith((b"[PAD", b"<|PAD", b"<pad")))
        if not padding:
            return (f"vocabulary sizes differ (verifier {verifier.n_vocab}, draft "
                    f"{draft.n_vocab}) and id {i} of {longer.path.name} "
                    f"({text.decode('utf-8', 'replace')!r}) is a real token")
    return None

