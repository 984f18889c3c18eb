"""Tiny random-weight GGUF models that llama.cpp loads for real, written with the gguf package:
the one GGUF writer of the tests. ``write_llama`` (the session fixture ``tiny_pair`` of
conftest.py, the golden cases and every fault test use it) and the hybrid architectures with a
recurrent state, ``write_lfm2`` (short convolutions + attention), ``write_qwen35`` (gated
delta-net + attention, optional next-n / MTP block) and ``write_nemotron_h`` (Mamba-2 + attention
+ MLP), share one header (``_begin``: hyperparameters, then the tokenizer below), the embedding
and output head, and the seed / ``noise`` / ``logit_scale`` semantics.

``write_llama`` knobs: seed, architecture name, add-BOS flag, BOS / EOS / EOT ids, logit scale,
padding, a noisy copy of a model (a related draft), output rows zeroed, a chat template, or a
scripted *bigram* model whose next token is fixed by the current one (so a test can make llama.cpp
emit chosen tokens; ``chain`` builds the map).

Vocabulary (V = 3 + 256 + len(words) + n_pad): <unk>, <s>, </s> (then any extra control tokens),
the 256 byte tokens <0x00>..<0xFF>
(so any UTF-8 text round-trips, and multi-byte characters span several tokens), then the SentencePiece
words below. ``n_pad`` unused padding ids may be appended (the Qwen2-style padded-vocabulary case).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence, Union

import numpy as np

import gguf

WORDS = ["▁", "▁the", "▁a", "▁cat", "▁dog", "▁sat", "▁on", "▁mat", "▁hello", "▁world", "e", "t",
         "a", "o", "n", "s", "▁is", "▁and", "▁def", "(", ")", ":"]
# a foreign draft's words (another vocabulary): some of WORDS, some its own ("▁cat" and "t" are gone)
FOREIGN_WORDS = ["▁", "▁the", "▁a", "▁cats", "▁dog", "▁sat", "▁on", "▁mat", "▁hat", "e", "at",
                 "o", "n", "s", "▁is", "▁and", "(", ")", ":"]
EXTRA = ["<|x|>"]  # a control token only the drafts have (``extra_control``), at id 3
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


def _sampler(seed: int, noise: float, noise_seed: int) -> Callable[..., np.ndarray]:
    """``rand(*shape, scale=0.2)``: seeded standard-normal float32 weights times ``scale``. With
    ``noise`` > 0 each draw gets ``noise`` x an independent normal draw (seeded by ``noise_seed``)
    added before scaling: the same ``seed`` with noise is a related draft of the noiseless model.
    Every writer draws its tensors in a fixed order, so a noisy copy perturbs the same values."""
    rng = np.random.default_rng(seed)
    noise_rng = np.random.default_rng(noise_seed)

    def rand(*shape: int, scale: float = 0.2) -> np.ndarray:
        base = rng.standard_normal(shape)
        if noise > 0:
            base = base + noise * noise_rng.standard_normal(shape)
        return (base * scale).astype(np.float32)

    return rand


def _ones(*shape: int) -> np.ndarray:
    return np.ones(shape, np.float32)


Hparam = Union[int, float, Sequence[int]]


def _begin(path: Path, arch: str, hparams: Sequence[tuple[str, Hparam]], *, add_bos: bool = True,
           bos_id: int = BOS, eos_id: int = EOS, eot_id: int | None = None, n_pad: int = 0,
           words: list[str] = WORDS, extra_control: Sequence[str] = (),
           chat_template: str | None = None) -> tuple[gguf.GGUFWriter, int]:
    """Open the GGUF writer of every tiny model: the architecture's hyperparameters in order (keys
    without the ``{arch}.`` prefix; int -> uint32, float -> float32, a sequence -> an int32 array
    such as a per-layer ``attention.head_count_kv``), then the file type and the shared tokenizer
    header (the byte vocabulary of ``vocab``, BOS / EOS / EOT / UNK ids, add-BOS flag, chat
    template). Returns the writer and the vocabulary size."""
    tokens, scores, types = vocab(n_pad, words, extra_control)
    w = gguf.GGUFWriter(str(path), arch)
    for key, value in hparams:
        key = f"{arch}.{key}"  # metadata keys are prefixed with the architecture name
        if isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_array(key, [int(v) for v in value])
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
    return w, len(tokens)


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


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
    rand = _sampler(seed, noise, noise_seed)
    w, V = _begin(path, arch, [
        ("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
        ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
        ("attention.head_count_kv", N_HEAD), ("rope.dimension_count", N_EMBD // N_HEAD),
        ("attention.layer_norm_rms_epsilon", 1e-5)],
        add_bos=add_bos, bos_id=bos_id, eos_id=eos_id, eot_id=eot_id, n_pad=n_pad, words=words,
        extra_control=extra_control, chat_template=chat_template)

    emb = rand(V, N_EMBD, scale=1.0)
    w.add_tensor("token_embd.weight", emb)
    zero_out = bigram is not None  # a bigram model: layers add nothing to the residual stream
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(N_EMBD))
        w.add_tensor(f"blk.{i}.attn_q.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_k.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.attn_v.weight", rand(N_EMBD, N_EMBD))
        out = rand(N_EMBD, N_EMBD)
        w.add_tensor(f"blk.{i}.attn_output.weight", out * 0 if zero_out else out)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", _ones(N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
        down = rand(N_EMBD, N_FF)
        w.add_tensor(f"blk.{i}.ffn_down.weight", down * 0 if zero_out else down)
    w.add_tensor("output_norm.weight", _ones(N_EMBD))
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
    _finish(w)
    return path


# -- hybrid (recurrent-state) architectures -------------------------------------------------------
# Same vocabulary, tokenizer header, N_EMBD / N_HEAD / N_FF, embedding and output head as
# write_llama; attention layers have 2 KV heads of 16 (GQA 2:1). ``**tokenizer`` takes the
# vocabulary knobs of write_llama (add_bos, bos_id, eos_id, eot_id, n_pad, words, extra_control,
# chat_template). ``zero_attn`` zeroes the attention layers' output projections: only the recurrent
# layers then carry information from one token to the next (a test of the recurrent state alone).
HEAD_DIM, N_HEAD_KV_HYBRID = N_EMBD // N_HEAD, 2


def _swiglu_ffn(w: gguf.GGUFWriter, rand: Callable[..., np.ndarray], i: int) -> None:
    w.add_tensor(f"blk.{i}.ffn_gate.weight", rand(N_FF, N_EMBD))
    w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
    w.add_tensor(f"blk.{i}.ffn_down.weight", rand(N_EMBD, N_FF))


def _attention(w: gguf.GGUFWriter, rand: Callable[..., np.ndarray], i: int, n_q: int,
               zero: bool, qk_norm: bool) -> None:
    """Separate Q / K / V projections (``n_q`` query rows), the output projection (zeroed when
    ``zero``) and, with ``qk_norm``, per-head RMS norms of Q and K."""
    w.add_tensor(f"blk.{i}.attn_q.weight", rand(n_q, N_EMBD))
    w.add_tensor(f"blk.{i}.attn_k.weight", rand(N_HEAD_KV_HYBRID * HEAD_DIM, N_EMBD))
    w.add_tensor(f"blk.{i}.attn_v.weight", rand(N_HEAD_KV_HYBRID * HEAD_DIM, N_EMBD))
    out = rand(N_EMBD, N_HEAD * HEAD_DIM)
    w.add_tensor(f"blk.{i}.attn_output.weight", out * 0 if zero else out)
    if qk_norm:
        w.add_tensor(f"blk.{i}.attn_q_norm.weight", _ones(HEAD_DIM))
        w.add_tensor(f"blk.{i}.attn_k_norm.weight", _ones(HEAD_DIM))


def _output(w: gguf.GGUFWriter, rand: Callable[..., np.ndarray], V: int, logit_scale: float,
            norm: str = "output_norm.weight") -> None:
    w.add_tensor(norm, _ones(N_EMBD))
    w.add_tensor("output.weight", rand(V, N_EMBD, scale=0.3 * logit_scale))


LFM2_PATTERN = "ccac"


def write_lfm2(path: str | Path, *, seed: int = 11, logit_scale: float = 2.0, noise: float = 0.0,
               noise_seed: int = 0, pattern: str = LFM2_PATTERN, zero_attn: bool = False,
               **tokenizer: Any) -> Path:
    """Write an LFM2 GGUF (architecture ``lfm2``): one layer per letter of ``pattern``, ``c`` a
    gated short-convolution layer (``shortconv.l_cache`` 3: a recurrent state of the last 2 tokens'
    B*x, n_embd x 2 floats), ``a`` a GQA attention layer with Q/K norms and RoPE; every layer has
    a SwiGLU FFN. Default "ccac": layers 0, 1, 3 convolution, 2 attention. llama.cpp tells the
    kinds apart by the per-layer ``attention.head_count_kv`` (0 = convolution). The output norm is
    LFM2's ``token_embd_norm``; ``seed`` / ``logit_scale`` / ``noise`` / ``noise_seed`` as in
    write_llama."""
    assert pattern and set(pattern) <= {"c", "a"}, pattern
    path = Path(path)
    rand = _sampler(seed, noise, noise_seed)
    l_cache = 3
    w, V = _begin(path, "lfm2", [
        ("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD),
        ("block_count", len(pattern)), ("feed_forward_length", N_FF),
        ("attention.head_count", N_HEAD),
        ("attention.head_count_kv", [N_HEAD_KV_HYBRID if k == "a" else 0 for k in pattern]),
        ("rope.freq_base", 1e6), ("attention.layer_norm_rms_epsilon", 1e-5),
        ("shortconv.l_cache", l_cache)], **tokenizer)
    w.add_tensor("token_embd.weight", rand(V, N_EMBD, scale=1.0))
    for i, kind in enumerate(pattern):
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(N_EMBD))
        if kind == "a":
            _attention(w, rand, i, N_HEAD * HEAD_DIM, zero_attn, qk_norm=True)
        else:
            w.add_tensor(f"blk.{i}.shortconv.in_proj.weight", rand(3 * N_EMBD, N_EMBD))  # B, C, x
            w.add_tensor(f"blk.{i}.shortconv.conv.weight", rand(N_EMBD, l_cache, scale=0.5))
            w.add_tensor(f"blk.{i}.shortconv.out_proj.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", _ones(N_EMBD))
        _swiglu_ffn(w, rand, i)
    _output(w, rand, V, logit_scale, norm="token_embd_norm.weight")
    _finish(w)
    return path


# Qwen3.5 gated delta-net: K heads (ssm.group_count) x state size, V heads (ssm.time_step_rank)
QWEN35_LAYERS, QWEN35_D_CONV, QWEN35_D_STATE, QWEN35_K_HEADS, QWEN35_V_HEADS = 4, 4, 16, 2, 4


def write_qwen35(path: str | Path, *, seed: int = 11, logit_scale: float = 2.0, noise: float = 0.0,
                 noise_seed: int = 0, n_nextn: int = 0, zero_attn: bool = False,
                 mimic: float | None = None, **tokenizer: Any) -> Path:
    """Write a Qwen3.5 GGUF (architecture ``qwen35``): 4 layers, full attention every 4th
    (``full_attention_interval`` 4: layers 0-2 gated delta-net, 3 attention), as the real models.

    Delta-net layers: fused ``attn_qkv`` (2 K heads x 16 for Q and K, 4 V heads x 16), the gate
    ``attn_gate`` (z), a causal conv (kernel 4) over QKV, per-V-head decay ``ssm_a`` = -exp(A_log)
    (0.05 .. 0.5) with ``ssm_dt`` bias -1 and input-dependent ``ssm_alpha`` / ``ssm_beta``: a
    16 x 16 state per V head that typically forgets ~2-15% a token (decay exp(softplus(alpha - 1)
    x A)), so early tokens still count 10 tokens on. Attention layers: gated attention (the Q
    projection twice as wide: query + sigmoid gate), Q/K norms, interleaved multi-section RoPE on
    8 of 16 dimensions (``rope.dimension_sections``).
    Norms are ones (the converter stores Qwen's 1 + w).

    ``n_nextn`` > 0 appends that many next-n (MTP) blocks after the trunk, as the real GGUFs do:
    ``block_count`` counts them, ``nextn_predict_layers`` = n_nextn, and each is a full-attention
    decoder block plus ``nextn.eh_proj`` / ``nextn.enorm`` / ``nextn.hnorm`` /
    ``nextn.shared_head_norm`` (the embedding and LM head are shared with the trunk). Its
    weights are drawn after the trunk's: the trunk is exactly the ``n_nextn=0`` model's.

    ``mimic`` (with ``n_nextn``): a next-n block that predicts what the verifier will. The
    blocks' outputs (``ssm_out``, ``attn_output``, ``ffn_down``) are zeroed, so the trunk is a
    bigram model (its logits after a token depend on that token alone), and ``eh_proj`` is
    [I | 0] + mimic x its random draw, so the head reads the next token's embedding (and, for
    mimic > 0, a little of the hidden state): at mimic 0 the head's logits for t+2 are the
    verifier's after t+1 (two RMS norms in a row differ by rounding).
    """
    path = Path(path)
    rand = _sampler(seed, noise, noise_seed)
    n_k, n_v, d_state, d_conv = QWEN35_K_HEADS, QWEN35_V_HEADS, QWEN35_D_STATE, QWEN35_D_CONV
    key_dim, value_dim = n_k * d_state, n_v * d_state
    hparams: list[tuple[str, Hparam]] = [
        ("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD),
        ("block_count", QWEN35_LAYERS + n_nextn), ("feed_forward_length", N_FF),
        ("attention.head_count", N_HEAD), ("attention.head_count_kv", N_HEAD_KV_HYBRID),
        ("attention.key_length", HEAD_DIM), ("attention.value_length", HEAD_DIM),
        ("rope.dimension_count", HEAD_DIM // 2), ("rope.dimension_sections", [2, 1, 1, 0]),
        ("rope.freq_base", 1e7), ("attention.layer_norm_rms_epsilon", 1e-6),
        ("ssm.conv_kernel", d_conv), ("ssm.state_size", d_state), ("ssm.group_count", n_k),
        ("ssm.time_step_rank", n_v), ("ssm.inner_size", value_dim),
        ("full_attention_interval", 4)]
    if n_nextn:
        hparams.append(("nextn_predict_layers", n_nextn))
    w, V = _begin(path, "qwen35", hparams, **tokenizer)
    if mimic is not None:
        add = w.add_tensor

        def mimicking(name: str, data: np.ndarray) -> None:
            if name.endswith(("ssm_out.weight", "attn_output.weight", "ffn_down.weight")):
                data = data * 0
            elif name.endswith("nextn.eh_proj.weight"):
                copy = np.hstack([np.eye(N_EMBD), np.zeros((N_EMBD, N_EMBD))]).astype(np.float32)
                data = copy + np.float32(mimic) * data
            add(name, data)

        w.add_tensor = mimicking
    w.add_tensor("token_embd.weight", rand(V, N_EMBD, scale=1.0))
    for i in range(QWEN35_LAYERS + n_nextn):
        if i == QWEN35_LAYERS:  # the head before the next-n blocks: the trunk is that of n_nextn=0
            _output(w, rand, V, logit_scale)
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(N_EMBD))
        w.add_tensor(f"blk.{i}.post_attention_norm.weight", _ones(N_EMBD))
        if i < QWEN35_LAYERS and (i + 1) % 4 != 0:  # gated delta-net
            w.add_tensor(f"blk.{i}.attn_qkv.weight", rand(2 * key_dim + value_dim, N_EMBD))
            w.add_tensor(f"blk.{i}.attn_gate.weight", rand(value_dim, N_EMBD))
            w.add_tensor(f"blk.{i}.ssm_conv1d.weight",
                         rand(2 * key_dim + value_dim, d_conv, scale=0.5))
            w.add_tensor(f"blk.{i}.ssm_dt.bias", np.full(n_v, -1.0, np.float32))
            w.add_tensor(f"blk.{i}.ssm_a", -np.linspace(0.05, 0.5, n_v, dtype=np.float32))
            w.add_tensor(f"blk.{i}.ssm_beta.weight", rand(n_v, N_EMBD))
            w.add_tensor(f"blk.{i}.ssm_alpha.weight", rand(n_v, N_EMBD))
            w.add_tensor(f"blk.{i}.ssm_norm.weight", _ones(d_state))
            w.add_tensor(f"blk.{i}.ssm_out.weight", rand(N_EMBD, value_dim))
        else:  # full attention (trunk) or a next-n block
            _attention(w, rand, i, 2 * N_HEAD * HEAD_DIM, zero_attn and i < QWEN35_LAYERS,
                       qk_norm=True)
        _swiglu_ffn(w, rand, i)
        if i >= QWEN35_LAYERS:
            w.add_tensor(f"blk.{i}.nextn.eh_proj.weight", rand(N_EMBD, 2 * N_EMBD))
            w.add_tensor(f"blk.{i}.nextn.enorm.weight", _ones(N_EMBD))
            w.add_tensor(f"blk.{i}.nextn.hnorm.weight", _ones(N_EMBD))
            w.add_tensor(f"blk.{i}.nextn.shared_head_norm.weight", _ones(N_EMBD))
    if not n_nextn:
        _output(w, rand, V, logit_scale)
    _finish(w)
    return path


# Nemotron-H Mamba-2 sizes: 8 SSM heads of 16 (inner 128), 2 groups of B / C with state 16
NEMOTRON_H_PATTERN = "M*M-"
NEMOTRON_D_CONV, NEMOTRON_D_STATE, NEMOTRON_GROUPS = 4, 16, 2
NEMOTRON_SSM_HEADS, NEMOTRON_D_INNER = 8, 128


def write_nemotron_h(path: str | Path, *, seed: int = 11, logit_scale: float = 2.0,
                     noise: float = 0.0, noise_seed: int = 0, pattern: str = NEMOTRON_H_PATTERN,
                     zero_attn: bool = False, **tokenizer: Any) -> Path:
    """Write a Nemotron-H GGUF (architecture ``nemotron_h``, a Mamba-2 hybrid): one block per
    letter of ``pattern`` in Nemotron-H's own notation, ``M`` Mamba-2, ``*`` attention (GQA, no
    RoPE), ``-`` a squared-ReLU MLP; each block is norm -> mixer -> residual. Default "M*M-".
    llama.cpp tells the kinds apart by the per-layer ``attention.head_count_kv`` and
    ``feed_forward_length`` (both 0 = Mamba-2).

    Mamba-2 blocks: ``ssm_in`` -> z, xBC, dt; causal conv (kernel 4, with bias) over xBC; 8 heads
    of 16 with A = -(0.1 .. 0.8) and ``ssm_dt`` bias -1 (dt = softplus(.) ~ 0.3: each head keeps
    ~80-97% of its 16 x 16 state a token); D = 1; grouped RMS norm (2 groups); ``ssm_out``.
    """
    assert pattern and set(pattern) <= {"M", "*", "-"}, pattern
    path = Path(path)
    rand = _sampler(seed, noise, noise_seed)
    d_conv, d_state, n_group = NEMOTRON_D_CONV, NEMOTRON_D_STATE, NEMOTRON_GROUPS
    n_ssm_head, d_inner = NEMOTRON_SSM_HEADS, NEMOTRON_D_INNER
    d_xbc = d_inner + 2 * n_group * d_state
    w, V = _begin(path, "nemotron_h", [
        ("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD),
        ("block_count", len(pattern)),
        ("feed_forward_length", [N_FF if k == "-" else 0 for k in pattern]),
        ("attention.head_count", N_HEAD),
        ("attention.head_count_kv", [N_HEAD_KV_HYBRID if k == "*" else 0 for k in pattern]),
        ("attention.layer_norm_epsilon", 1e-5), ("attention.layer_norm_rms_epsilon", 1e-5),
        ("ssm.conv_kernel", d_conv), ("ssm.state_size", d_state), ("ssm.group_count", n_group),
        ("ssm.time_step_rank", n_ssm_head), ("ssm.inner_size", d_inner)], **tokenizer)
    w.add_tensor("token_embd.weight", rand(V, N_EMBD, scale=1.0))
    for i, kind in enumerate(pattern):
        w.add_tensor(f"blk.{i}.attn_norm.weight", _ones(N_EMBD))
        if kind == "M":
            w.add_tensor(f"blk.{i}.ssm_in.weight", rand(d_inner + d_xbc + n_ssm_head, N_EMBD))
            w.add_tensor(f"blk.{i}.ssm_conv1d.weight", rand(d_xbc, d_conv, scale=0.5))
            w.add_tensor(f"blk.{i}.ssm_conv1d.bias", np.zeros(d_xbc, np.float32))
            w.add_tensor(f"blk.{i}.ssm_dt.bias", np.full(n_ssm_head, -1.0, np.float32))
            a = -np.linspace(0.1, 0.8, n_ssm_head, dtype=np.float32)  # -exp(A_log)
            w.add_tensor(f"blk.{i}.ssm_a", a.reshape(n_ssm_head, 1))
            w.add_tensor(f"blk.{i}.ssm_d", _ones(n_ssm_head, 1))
            w.add_tensor(f"blk.{i}.ssm_norm.weight", _ones(n_group, d_inner // n_group))
            w.add_tensor(f"blk.{i}.ssm_out.weight", rand(N_EMBD, d_inner))
        elif kind == "*":
            _attention(w, rand, i, N_HEAD * HEAD_DIM, zero_attn, qk_norm=False)
        else:
            w.add_tensor(f"blk.{i}.ffn_up.weight", rand(N_FF, N_EMBD))
            w.add_tensor(f"blk.{i}.ffn_down.weight", rand(N_EMBD, N_FF))
    _output(w, rand, V, logit_scale)
    _finish(w)
    return path


def chain(tokens: Sequence[int]) -> dict[int, int]:
    """The bigram map that makes each token of ``tokens`` follow the previous one (every token but
    the last must be distinct: a bigram model's next token depends on the current one only)."""
    assert len(set(tokens[:-1])) == len(tokens) - 1, "a bigram chain cannot repeat a token"
    return {a: b for a, b in zip(tokens, tokens[1:])}
