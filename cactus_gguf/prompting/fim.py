"""Fill-in-the-middle prompts from a GGUF's own FIM tokens, as llama-server's ``/infill`` builds
them.

A FIM model completes the code between a prefix and a suffix. Its vocabulary has special tokens
for the parts (llama.cpp finds them from the GGUF's ``tokenizer.ggml.fim_*_token_id`` keys, or by
their text: Qwen's ``<|fim_prefix|>``, CodeLlama's ``<PRE>``, ...; ``llama_vocab_fim_pre`` etc.):

    PRE  prefix    SUF  suffix    MID  middle (what the model writes)
    REP  repository name          SEP  file separator (repository-level context)

The prompt (llama-server's ``format_prompt_infill``; the repository-level pattern of Qwen2.5-Coder,
arXiv:2409.12186)::

    [REP]myproject\\n [SEP]filename0\\n extra text 0 ... [SEP]filename\\n
    [PRE]prefix prompt[SUF]suffix[MID]

Each extra chunk (``input_extra``: other files of the project) follows a SEP token and its file
name; a model without SEP gets the chunks after a ``--- snippet ---`` line instead. The FIM part
must fit one batch (``n_batch``): it keeps the last 3/4 · n_batch tokens of the prefix and the
first n_batch/4 − 2 − len(prompt) of the suffix; the extra context keeps its newest tokens, up to
n_ctx − n_batch − 2 · n_predict. ``prompt`` continues the prefix (an editor sends the current
line's text before the cursor there), special tokens parsed. End-of-generation is llama.cpp's EOG
set, which includes the FIM pad, repository and separator tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import llama_cpp

from ..errors import InputError

__all__ = ["FimTokens", "ExtraChunk", "fim_tokens", "infill_prompt"]

# llama-server's names: a project and a current file it cannot know (server-common.cpp)
REPO_NAME, FILE_NAME, DEFAULT_CHUNK_NAME = "myproject", "filename", "tmp"
SNIPPET = "\n\n--- snippet ---\n\n"  # the chunk separator of a model without a SEP token

Text = Union[str, Sequence[Union[int, str]]]  # text, or token ids mixed with text (llama-server)


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids; ``rep`` and ``sep`` are None when it has none."""

    pre: int
    suf: int
    mid: int
    rep: int | None
    sep: int | None


@dataclass(frozen=True)
class ExtraChunk:
    """One piece of repository context: a file's name and some of its text."""

    filename: str
    text: str


def fim_tokens(model) -> FimTokens:
    """The FIM tokens of a loaded model (llama/model.py's Model). Raises InputError (one line)
    when it lacks the prefix, suffix or middle token: it was not trained to fill in."""
    vocab = model.vocab
    null = llama_cpp.LLAMA_TOKEN_NULL

    def get(f) -> int | None:
        t = f(vocab)
        return None if t == null or t < 0 else int(t)

    pre, suf, mid = (get(f) for f in (llama_cpp.llama_vocab_fim_pre, llama_cpp.llama_vocab_fim_suf,
                                      llama_cpp.llama_vocab_fim_mid))
    missing = [n for n, t in (("prefix", pre), ("suffix", suf), ("middle", mid)) if t is None]
    if missing:
        raise InputError(f"this model has no fill-in-the-middle {' / '.join(missing)} token "
                         "(tokenizer.ggml.fim_*_token_id): infill needs a FIM model, e.g. "
                         "Qwen2.5-Coder")
    return FimTokens(pre, suf, mid, get(llama_cpp.llama_vocab_fim_rep),
                     get(llama_cpp.llama_vocab_fim_sep))


def _tokens(model, text: Text, *, parse_special: bool = False) -> list[int]:
    """``text`` as ids, no BOS; a list mixes ids (kept) and strings (tokenized): llama-server's
    ``tokenize_mixed``."""
    if isinstance(text, str):
        return model.tokenize(text, add_special=False, parse_special=parse_special) if text else []
    out: list[int] = []
    for part in text:
        out.extend([int(part)] if isinstance(part, int) else _tokens(model, part,
                                                                     parse_special=parse_special))
    return out


def infill_prompt(model, prefix: Text, suffix: Text, *, extra: Sequence[ExtraChunk] = (),
                  prompt: Text = "", n_batch: int | None = None, n_ctx: int | None = None,
                  n_predict: int = 0, fim: FimTokens | None = None) -> list[int]:
    """The token ids of a FIM prompt (module docstring), ending with MID.

    ``n_batch`` None keeps prefix and suffix whole (``/v1/completions`` with ``suffix``: a prompt
    too long is then the usual context error, not cut); an int trims them as llama-server does.
    ``n_ctx`` bounds the extra context (None: all of it). ``n_predict`` < 0 counts as 0 there.
    Raises InputError when the model has no FIM tokens."""
    fim = fim or fim_tokens(model)
    head: list[int] = []
    if fim.rep is not None:
        head += [fim.rep] + _tokens(model, REPO_NAME + "\n")
    for chunk in extra:
        if fim.sep is not None:
            head += [fim.sep] + _tokens(model, (chunk.filename or DEFAULT_CHUNK_NAME) + "\n")
        else:
            head += _tokens(model, SNIPPET)
        head += _tokens(model, chunk.text)
    if fim.sep is not None:
        head += [fim.sep] + _tokens(model, FILE_NAME + "\n")

    pre, suf = _tokens(model, prefix), _tokens(model, suffix)
    middle = _tokens(model, prompt, parse_special=True)
    if n_batch is not None:
        n_pre = min(len(pre), 3 * (n_batch // 4))
        n_suf = min(len(suf), max(0, n_batch // 4 - (2 + len(middle))))
        pre, suf = pre[len(pre) - n_pre:], suf[:n_suf]
    if n_ctx is not None:
        n_extra = min(max(0, n_ctx - (n_batch or 0) - 2 * max(0, n_predict)), len(head))
        head = head[len(head) - n_extra:] if n_extra else []
    bos = [model.bos] if model.add_bos and model.bos >= 0 else []
    return head + bos + [fim.pre] + pre + middle + [fim.suf] + suf + [fim.mid]
