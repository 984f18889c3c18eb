"""The tiny hybrid (recurrent-state) GGUF writers of support/tiny_gguf.py: LFM2 (short
convolutions + attention), Qwen3.5 (gated delta-net + attention, optional next-n / MTP block) and
Nemotron-H (Mamba-2 + attention + MLP) load in the vendored llama.cpp, decode to finite, spread
logits, and carry information from token to token through their recurrent state."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gguf
import llama_cpp

from cactus_gguf.llama import Context, ContextOptions, ModelOptions, log
from support.tiny_gguf import (text_tokens, write_lfm2, write_nemotron_h, write_qwen35,
                               WORDS)

WRITERS = {"lfm2": write_lfm2, "qwen35": write_qwen35, "nemotron_h": write_nemotron_h}
V = 3 + 256 + len(WORDS)
PROMPT = text_tokens("the cat sa")  # 10 byte tokens
# recurrent-state bytes per sequence: recurrent layers x (conv rows R + SSM rows S) x 4 (float32)
#   lfm2 "ccac":       3 x (64 x (3 - 1) + 0)                      = 3 x 128
#   qwen35:            3 x ((4 - 1) x (2 x 32 + 64) + 16 x 64)     = 3 x (384 + 1024)
#   nemotron_h "M*M-": 2 x ((4 - 1) x (128 + 2 x 2 x 16) + 16 x 128) = 2 x (576 + 2048)
STATE_BYTES = {"lfm2": 3 * 128 * 4, "qwen35": 3 * 1408 * 4, "nemotron_h": 2 * 2624 * 4}
N_LAYER = {"lfm2": 4, "qwen35": 4, "nemotron_h": 4}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hybrids")
    out = {}
    for arch, write in WRITERS.items():
        out[arch] = write(d / f"{arch}.gguf")
        out[arch + "/zero_attn"] = write(d / f"{arch}-zero-attn.gguf", zero_attn=True)
        out[arch + "/draft"] = write(d / f"{arch}-draft.gguf", noise=0.02, noise_seed=12)
    out["qwen35/mtp"] = write_qwen35(d / "qwen35-mtp.gguf", n_nextn=1)
    return out


def _ctx(path: Path) -> Context:
    return Context.load(path, ModelOptions(), ContextOptions(n_ctx=256, n_batch=32))


def _last_logits(path: Path, tokens: list[int], split: int | None = None) -> np.ndarray:
    """The logits after ``tokens``, decoded in one batch or as tokens[:split] then the rest
    (the second decode then sees the first part only through the cache / recurrent state)."""
    with _ctx(path) as ctx:
        if split is not None:
            ctx.decode(tokens[:split], n_logits=0)
            tokens = tokens[split:]
        return ctx.decode(tokens, n_logits=1)[-1].copy()


@pytest.mark.parametrize("arch", list(WRITERS))
def test_loads_as_a_hybrid_and_decodes(models, arch):
    with _ctx(models[arch]) as ctx:
        m = ctx.model.ptr
        assert ctx.model.metadata("general.architecture") == arch
        assert llama_cpp.llama_model_is_hybrid(m) and not llama_cpp.llama_model_is_recurrent(m)
        assert ctx.n_vocab == V == 281
        assert llama_cpp.llama_model_n_layer(m) == N_LAYER[arch]
        logits = ctx.decode(PROMPT, n_logits=len(PROMPT)).copy()
        assert logits.shape == (10, V) and np.isfinite(logits).all()
        assert (logits.std(axis=1) > 0.5).all(), logits.std(axis=1)
        assert not np.allclose(logits[-1], logits[-2])
        # the partial (recurrent-only) state of the sequence: the designed sizes, plus headers
        size = llama_cpp.llama_state_seq_get_size_ext(ctx.ptr, 0,
                                                      llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)
        assert STATE_BYTES[arch] <= size < STATE_BYTES[arch] + 512, size


@pytest.mark.parametrize("arch", list(WRITERS))
def test_first_token_changes_the_last_logits(models, arch):
    other = [text_tokens("X")[0]] + PROMPT[1:]
    a, b = _last_logits(models[arch], PROMPT), _last_logits(models[arch], other)
    assert np.abs(a - b).max() > 1e-2


@pytest.mark.parametrize("arch", list(WRITERS))
def test_state_carries_across_decodes(models, arch):
    """Split decodes give the one-batch logits: what the first decode left in the cache and the
    recurrent state is what the second one reads."""
    path = models[arch]
    whole = _last_logits(path, PROMPT)
    for split in (1, 5, 9):
        np.testing.assert_allclose(_last_logits(path, PROMPT, split), whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["qwen35", "nemotron_h"])
def test_recurrent_state_alone_carries_the_first_token(models, arch):
    """With the attention outputs zeroed only the delta-net / Mamba-2 state links tokens: the first
    token still moves the logits 9 tokens later, also when it was decoded in an earlier batch."""
    path = models[arch + "/zero_attn"]
    other = [text_tokens("X")[0]] + PROMPT[1:]
    for split in (None, 1, 5):
        a, b = _last_logits(path, PROMPT, split), _last_logits(path, other, split)
        assert np.abs(a - b).max() > 1e-2, split


def test_lfm2_short_convolution_window(models):
    """LFM2 without attention: each of the 3 convolution layers (l_cache 3) reaches 2 tokens back,
    so the last of 10 tokens depends on positions 3 .. 9 and not on 0 .. 2, whether they were
    decoded in the same batch or earlier (the 2-token conv state)."""
    path = models["lfm2/zero_attn"]
    for split in (None, 5, 8):
        base = _last_logits(path, PROMPT, split)
        for pos, changes in ((2, False), (3, True), (8, True)):
            toks = list(PROMPT)
            toks[pos] = text_tokens("X")[0]
            diff = np.abs(_last_logits(path, toks, split) - base).max()
            assert (diff > 1e-2) if changes else (diff == 0.0), (split, pos, diff)


@pytest.mark.parametrize("arch", list(WRITERS))
def test_noisy_copy_is_a_related_draft(models, arch):
    """A little noise on every drawn weight (here 2%) gives other logits that still follow the
    model's (correlation ~0.99); at write_llama's usual 0.5 the copies are far less related."""
    p, q = _last_logits(models[arch], PROMPT), _last_logits(models[arch + "/draft"], PROMPT)
    assert np.abs(p - q).max() > 0.1
    assert np.corrcoef(p, q)[0, 1] > 0.95


@pytest.mark.parametrize("arch", list(WRITERS))
def test_logit_scale_scales_the_logits(models, arch, tmp_path):
    doubled = WRITERS[arch](tmp_path / "x4.gguf", logit_scale=4.0)
    np.testing.assert_allclose(_last_logits(doubled, PROMPT),
                               2 * _last_logits(models[arch], PROMPT), rtol=1e-4, atol=1e-3)


def _tensor_names(path: Path) -> list[str]:
    return [t.name for t in gguf.GGUFReader(str(path)).tensors]


def test_qwen35_layer_layout(models):
    names = set(_tensor_names(models["qwen35"]))
    for i in range(3):
        assert {f"blk.{i}.attn_qkv.weight", f"blk.{i}.ssm_a", f"blk.{i}.ssm_conv1d.weight"} <= names
        assert f"blk.{i}.attn_q.weight" not in names
    assert {"blk.3.attn_q.weight", "blk.3.attn_q_norm.weight"} <= names
    assert "blk.3.ssm_a" not in names and "blk.4.attn_norm.weight" not in names
    assert not any("nextn" in n for n in names)
    mtp = set(_tensor_names(models["qwen35/mtp"]))
    assert {"blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight", "blk.4.nextn.hnorm.weight",
            "blk.4.nextn.shared_head_norm.weight", "blk.4.attn_q.weight"} <= mtp
    assert mtp - names == {n for n in mtp if n.startswith("blk.4.")}


def _load_raw(path: Path, load_mtp: bool):
    log.init_backend()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.load_mtp = load_mtp
    m = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert m, f"llama.cpp could not load {path} (load_mtp={load_mtp})"
    return m


@pytest.mark.parametrize("load_mtp", [False, True])
def test_qwen35_nextn_layer(models, load_mtp):
    """Both files load with and without load_mtp; with it, an MTP context (whose creation builds
    the next-n graph: eh_proj over [enorm(embedding), hnorm(hidden)], the attention block, the
    shared head) can be made over the n_nextn=1 model. (Without load_mtp llama.cpp skips the
    next-n tensors and an MTP context would abort the process: GGML_ASSERT in qwen35.cpp.)"""
    for key, n_nextn in (("qwen35", 0), ("qwen35/mtp", 1)):
        m = _load_raw(models[key], load_mtp)
        try:
            assert llama_cpp.llama_model_n_layer_nextn(m) == n_nextn
            assert llama_cpp.llama_model_n_layer(m) == 4  # the trunk: next-n blocks excluded
            assert llama_cpp.llama_model_is_hybrid(m)
            if load_mtp and n_nextn:
                cparams = llama_cpp.llama_context_default_params()
                cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 64, 8, 8
                cparams.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
                ctx = llama_cpp.llama_init_from_model(m, cparams)
                assert ctx, log.last_error()
                llama_cpp.llama_free(ctx)
        finally:
            llama_cpp.llama_model_free(m)


def test_qwen35_nextn_block_leaves_the_trunk_alone(models):
    """The next-n block is loaded but not run in the main pass, and its weights are drawn after
    the trunk's: the n_nextn=1 model gives the n_nextn=0 model's logits exactly."""
    np.testing.assert_array_equal(_last_logits(models["qwen35/mtp"], PROMPT),
                                  _last_logits(models["qwen35"], PROMPT))
