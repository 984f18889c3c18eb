"""Log-probabilities in the server: what a body asks for, and the answer shapes.

Asking (``request_fields``, the Request's ``n_probs`` / ``post_sampling_probs``):

- ``/v1/chat/completions``: OpenAI's ``logprobs`` (true / false) and ``top_logprobs`` (0..20, only
  with ``logprobs`` true);
- ``/v1/completions``: OpenAI's ``logprobs: N`` (0..20 alternatives; OpenAI allows 5);
- either, and llama-server's ``/completion``: llama-server's ``n_probs`` (0..256) and
  ``post_sampling_probs``.

The values (speculative/logprobs.py, docs/maths.md "Log-probabilities of what was emitted"): on
every endpoint by default the model's own log-probabilities, the raw log-softmax of the verifier's
logits (llama-server's default, ``post_sampling_probs`` false, and what OpenAI clients expect: at
temperature 0 too they are not all 0.0); ``post_sampling_probs: true`` (an extra field on the
OpenAI endpoints, as on ``/completion``) gives ``log q``, the verifier's law after the request's
warps and grammar (``/completion``: ``prob`` of q). Under Cactus and the other relaxed rules they
are the verifier's probabilities, not those of the mixture the tokens were drawn from. They cover
the tokens of the text returned: after a stop string, those wholly before it
(speculative/session.py).

Answer shapes: OpenAI's chat ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}],
"refusal": null}``; OpenAI's legacy completions ``{"tokens", "token_logprobs", "top_logprobs",
"text_offset"}`` plus llama-server's ``content`` list; llama-server's ``completion_probabilities``
(``id``, ``token``, ``bytes``, ``logprob`` / ``prob``, ``top_logprobs`` / ``top_probs``).
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable, Sequence

from ..errors import InputError
from ..speculative.logprobs import TokenLogprob

__all__ = ["request_fields", "openai_chat", "openai_completion", "llama_probs", "MAX_TOP"]

MAX_TOP = 20  # OpenAI's top_logprobs limit; /v1/completions takes as many (OpenAI: 5)
# llama-server writes a zero probability's log as the lowest float32, JSON having no -inf
LOWEST = -3.4028234663852886e38


def _int(body, name: str, lo: int, hi: int) -> int | None:
    """Field ``name`` of ``body`` (a declared field or an extra), an integer in [lo, hi] or None;
    InputError naming it otherwise."""
    value = getattr(body, name, None)
    if value is None:
        value = (body.model_extra or {}).get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name} must be an integer in [{lo}, {hi}], got "
                         f"{json.dumps(value)[:40]}", param=name)
    if not lo <= value <= hi:
        raise InputError(f"{name} must be an integer in [{lo}, {hi}], got {value}", param=name)
    return value


def request_fields(body, *, chat: bool, post_sampling: bool = False) -> dict[str, Any]:
    """The Request fields (``n_probs``, ``post_sampling_probs``) a body sets; {} when it asks for
    no log-probabilities. ``post_sampling``: the endpoint's default of ``post_sampling_probs``
    (false on every endpoint: the raw log-softmax, as llama-server). InputError naming the field
    for a bad value (``top_logprobs`` without ``logprobs``, a bool for a count, out of range)."""
    n = None
    if chat:
        asked = getattr(body, "logprobs", None)
        if asked is not None and not isinstance(asked, bool):
            raise InputError(f"logprobs must be true or false on chat completions (the number of "
                             f"alternatives is top_logprobs), got {json.dumps(asked)}",
                             param="logprobs")
        top = _int(body, "top_logprobs", 0, MAX_TOP)
        if top is not None and not asked:
            raise InputError("top_logprobs needs logprobs: true", param="top_logprobs")
        n = (top or 0) if asked else None
    elif hasattr(body, "logprobs"):
        if isinstance(body.logprobs, bool):
            raise InputError(f"logprobs must be an integer in [0, {MAX_TOP}] on completions (the "
                             "number of alternatives per token), got "
                             f"{json.dumps(body.logprobs)}", param="logprobs")
        n = _int(body, "logprobs", 0, MAX_TOP)
    n_probs = _int(body, "n_probs", 0, 256)
    if n_probs is not None and n is not None and n_probs != n:
        raise InputError(f"n_probs is llama-server's name of the number of alternatives: give it "
                         f"or logprobs, not both ({n_probs} and {n})", param="n_probs")
    if n_probs is not None and (n_probs > 0 or n is not None):  # n_probs 0 alone: off, as there
        n = n_probs
    post = getattr(body, "post_sampling_probs", None)  # a declared field (/completion's)
    if post is None:
        post = (body.model_extra or {}).get("post_sampling_probs")
    if post is not None and not isinstance(post, bool):
        raise InputError(f"post_sampling_probs must be true or false, got {json.dumps(post)[:40]}",
                         param="post_sampling_probs")
    if n is None:
        return {}
    return {"n_probs": n, "post_sampling_probs": post_sampling if post is None else post}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else LOWEST


def _text(piece: bytes) -> str:
    """A token's text as llama-server writes it: a lone byte that is part of a longer UTF-8
    character as ``byte: \\xNN`` (its hex), any other piece decoded (an invalid sequence as
    U+FFFD; the ``bytes`` field always holds the exact bytes)."""
    if len(piece) == 1 and piece[0] & 0x80:
        return f"byte: \\x{piece[0]:x}"
    return piece.decode("utf-8", errors="replace")


def openai_chat(entries: Sequence[TokenLogprob]) -> dict:
    """OpenAI's ``choices[].logprobs`` of a chat completion (or of one chunk's tokens)."""
    return {"content": [{
        "token": _text(e.piece), "logprob": _finite(e.logprob), "bytes": list(e.piece),
        "top_logprobs": [{"token": _text(a.piece), "logprob": _finite(a.logprob),
                          "bytes": list(a.piece)} for a in e.top]} for e in entries],
        "refusal": None}


def openai_completion(entries: Sequence[TokenLogprob], offset: int = 0) -> dict:
    """OpenAI's legacy ``choices[].logprobs`` of a text completion (``offset``: characters of the
    completion before these tokens, for ``text_offset``), with llama-server's ``content`` list."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(_text(e.piece))
    return {"tokens": [_text(e.piece) for e in entries],
            "token_logprobs": [_finite(e.logprob) for e in entries],
            "top_logprobs": [{_text(a.piece): _finite(a.logprob) for a in e.top}
                             for e in entries],
            "text_offset": offsets,
            "content": openai_chat(entries)["content"]}


def llama_probs(entries: Iterable[TokenLogprob], post_sampling: bool) -> list[dict]:
    """llama-server's ``completion_probabilities``: ``logprob`` / ``top_logprobs``, or with
    ``post_sampling_probs`` the probabilities themselves, ``prob`` / ``top_probs``."""
    key, top_key = ("prob", "top_probs") if post_sampling else ("logprob", "top_logprobs")

    def value(lp: float) -> float:
        return math.exp(lp) if post_sampling else _finite(lp)

    return [{"id": e.token, "token": _text(e.piece), "bytes": list(e.piece), key: value(e.logprob),
             top_key: [{"id": a.token, "token": _text(a.piece), "bytes": list(a.piece),
                        key: value(a.logprob)} for a in e.top]} for e in entries]
