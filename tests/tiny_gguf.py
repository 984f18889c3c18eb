"""Tiny random-weight llama GGUF models that llama.cpp loads for real, written with the gguf package.

Vocabulary (V = 3 + 256 + len(words) + n_pad): <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>
(so any UTF-8 text round-trips, and multi-byte characters span several tokens), then the SentencePiece
words below. ``n_pad`` unused padding ids may be appended (the Qwen2-style padded-vocabulary case).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

import gguf

WORDS = ["▁", "▁the", "▁a", "▁cat", "▁dog", "▁sat", "▁on", "▁mat", "▁hello", "▁world", "e", "t",
         "a", "o", "n", "s", "▁is", "▁and", "▁def", "(", ")", ":"]
N_LAYER, N_EMBD, N_HEAD, N_FF, N_CTX_TRAIN = 2, 64, 4, 128, 2048


def vocab(n_pad: int = 0, words: list[str] = WORDS) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + list(words)
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(words))
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    for i in range(n_pad):
        tokens.append(f"[PAD{i}]")
        types.append(gguf.TokenType.UNUSED)
        scores.append(-1e4)
    return tokens, scores, [int(t) for t in types]


def write_tiny_llama(path: str | Path, *, seed: int, n_pad: int = 0, logit_scale: float = 1.0,
                     words: list[str] = WORDS, eos_id: int = 2, noise: float = 0.0,
                     noise_seed: int = 0) -> Path:
    """Write a 2-layer llama GGUF with random float32 weights; return its path.

    ``logit_scale`` multiplies the output matrix: larger means peakier next-token distributions.
    ``noise`` > 0 adds noise (relative scale, seeded by ``noise_seed``) to every weight of the
    ``seed`` model: a related "draft" whose distributions overlap the original's.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng(noise_seed)
    tokens, scores, types = vocab(n_pad, words)
    V = len(tokens)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(N_CTX_TRAIN)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(eos_id)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def t(name: str, *shape: int, scale: float = 0.2) -> None:
        base = rng.standard_normal(shape)
        if noise > 0:
            base = base + noise * noise_rng.standard_normal(shape)
        w.add_tensor(name, (base * scale).astype(np.float32))

    t("token_embd.weight", V, N_EMBD, scale=1.0)
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(N_EMBD, np.float32))
        t(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.attn_k.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.attn_v.weight", N_EMBD, N_EMBD)
        t(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(N_EMBD, np.float32))
        t(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        t(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, np.float32))
    t("output.weight", V, N_EMBD, scale=0.3 * logit_scale)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
