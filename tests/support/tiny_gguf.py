"""Tiny random-weight llama GGUF models that llama.cpp loads for real, written with the gguf package:
the one GGUF writer of the tests (``write_llama``; the session fixture ``tiny_pair`` of conftest.py,
the golden cases and every fault test use it).

``write_llama`` knobs: seed, architecture name, add-BOS flag, BOS / EOS / EOT ids, logit scale,
padding, a noisy copy of a model (a related draft), output rows zeroed, a chat template, or a
scripted *bigram* model whose next token is fixed by the current one (so a test can make llama.cpp
emit chosen tokens; ``chain`` builds the map).

Vocabulary (V = 3 + 256 + len(words) + n_pad): <unk>, <s>, </s> (then any extra control tokens), the 256 byte tokens <0x00>..<0xFF>
(so any UTF-8 text round-trips, and multi-byte characters span several tokens), then the SentencePiece
words below. ``n_pad`` unused padding ids may be appended (the Qwen2-style padded-vocabulary case).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

import gguf

WORDS = ["▁", "▁the", "▁a", "▁cat", "▁dog", "▁sat", "▁on", "▁mat", "▁hello", "▁world", "e", "t",
         "a", "o", "n", "s", "▁is", "▁and", "▁def", "(", ")", ":"]
N_LAYER, N_EMBD, N_HEAD, N_FF, N_CTX_TRAIN = 2, 64, 4, 128, 2048


def vocab(n_pad: int = 0, words: list[str] = WORDS, extra_control: Sequence[str] = ()
          ) -> tuple[list[str], list[float], list[int]]:
    tokens = (["<unk>", "<s>", "</s>"] + list(extra_control) + [f"<0x{b:02X}>" for b in range(256)]
              + list(words))
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.CONTROL] * len(extra_control)
             + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(words))
    scores = [0.0] * (259 + len(extra_control)) + [-float(i) for i in range(len(words))]
    for i in range(n_pad):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
        scores.append(-1e4)
    return tokens, scores, [int(t) for t in types]


BOS, EOS = 1, 2
# A minimal chat template for tiny models (tokenizer.chat_template): role-prefixed lines.
CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")


def byte_token(b: int) -> int:
    """The token id of byte ``b`` in the tiny vocabulary."""
    return 3 + b


def text_tokens(text: str) -> list[int]:
    """Byte-token ids spelling ``text`` in UTF-8 (one token per byte)."""
    return [byte_token(b) for b in text.encode("utf-8")]


def write_llama(path: str | Path, *, seed: int = 11, arch: str = "llama", add_bos: bool = True,
                bos_id: int = BOS, eos_id: int = EOS, eot_id: int | None = None,
                logit_scale: float = 2.0, n_pad: int = 0, noise: float = 0.0, noise_seed: int = 0,
                zero_output_rows: Sequence[int] = (),
                bigram: dict[int, int] | None = None, words: list[str] = WORDS,
                extra_control: Sequence[str] = (), chat_template: str | None = None) -> Path:
    """Write a 2-layer llama GGUF with float32 weights; return its path.

    ``logit_scale`` multiplies the output matrix: larger means peakier next-token distributions.
    ``noise`` > 0 adds noise (relative scale, seeded by ``noise_seed``) to every weight of the
    ``seed`` model: a related "draft" whose distributions overlap the original's.

    ``zero_output_rows``: token ids whose output-layer row is 0 (logit exactly 0 while the other
    logits spread over about +-14: such a token is practically never sampled, e.g. EOS for a long run).
    ``words``: the SentencePiece words after the byte tokens; ``extra_control``: control tokens
    inserted after ``</s>`` (every later id moves up: a vocabulary with other special tokens).
    ``chat_template``: a Jinja chat template (``tokenizer.chat_template``), e.g. CHAT_TEMPLATE.
    ``bigram``: {current token: next token}. The attention and FFN outputs are zeroed, so the final
    hidden state is the normalised embedding of the current token, and the output layer maps it to a
    logit about 32 above every other one for the scripted next token (a deterministic chain at any
    temperature <= 1); tokens without an entry get random next-token logits.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng(noise_seed)
    tokens, scores, types = vocab(n_pad, words, extra_control)
    V = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    pre = arch  # metadata keys are prefixed with the architecture name
    w.add_uint32(f"{pre}.context_length", N_CTX_TRAIN)
    w.add_uint32(f"{pre}.embedding_length", N_EMBD)
    w.add_uint32(f"{pre}.block_count", N_LAYER)
    w.add_uint32(f"{pre}.feed_forward_length", N_FF)
    w.add_uint32(f"{pre}.attention.head_count", N_HEAD)
    w.add_uint32(f"{pre}.attention.head_count_kv", N_HEAD)
    w.add_uint32(f"{pre}.rope.dimension_count", N_EMBD // N_HEAD)
    w.add_float32(f"{pre}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(bos_id)
    w.add_eos_token_id(eos_id)
    if eot_id is not None:
        w.add_eot_token_id(eot_id)
    w.add_unk_token_id(0)
    w.add_add_bos_token(add_bos)
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        base = rng.standard_normal(shape)
        if noise > 0:
            base = base + noise * noise_rng.standard_normal(shape)
        return (base * scale).astype(np.float32)

    emb = rand(V, N_EMBD, scale=1.0)
    w.add_tensor("token_embd.weight", emb)
    zero_out = bigram is not None  # a bigram model: layers add nothing to the residual stream
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(N_EMBD, N_EMBD))
        out = rand(N_EMBD, N_EMBD)
        w.add_tensor(f"blk.{i}.attn_output.weight", out * 0 if zero_out else out)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
        down = rand(N_EMBD, N_FF)
        w.add_tensor(f"blk.{i}.ffn_down.weight", down * 0 if zero_out else down)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    output = rand(V, N_EMBD, scale=0.3 * logit_scale)
    if bigram is not None:
        # logit of b after a = 0.5 * |e_a / rms(e_a)|^2 = 0.5 * N_EMBD = 32 for the scripted b,
        # against cross terms of standard deviation 0.5 * sqrt(N_EMBD) = 4 for the others
        unit = emb / np.sqrt((emb.astype(np.float64) ** 2).mean(axis=1, keepdims=True))
        output = output * 0.05
        for a, b in bigram.items():
            output[b] += 0.5 * unit[a].astype(np.float32)
    for t in zero_output_rows:
        output[t] = 0.0
    w.add_tensor("output.weight", output)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def chain(tokens: Sequence[int]) -> dict[int, int]:
    """The bigram map that makes each token of ``tokens`` follow the previous one (every token but
    the last must be distinct: a bigram model's next token depends on the current one only)."""
    assert len(set(tokens[:-1])) == len(tokens) - 1, "a bigram chain cannot repeat a token"
    return {a: b for a, b in zip(tokens, tokens[1:])}
