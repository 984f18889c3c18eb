"""The lavapipe warm-up (cactus_gguf/llama/lavapipe.py): ggml-vulkan's split-k scratch for one
flash-attention call, the cheapest warm-up whose one request is the largest a context makes, and
when a context makes it: only when ``CACTUS_GGUF_LAVAPIPE_WARMUP=1`` asks for it, on the llama.cpp
it mirrors, with the model's layers on lavapipe.

The expected bytes were observed on lavapipe with the pinned llama.cpp built for Vulkan
(``GGML_VK_MEMORY_LOGGER=1`` prints every ``split_k_size`` request), one fresh context per case:
a prompt of P tokens, then a batch of N rows. tests/test_vulkan.py checks the plan on the device
(its build's environment asks for the warm-up: tests/support/llama_build.py). The opt-in tests
below run the tiny model on the CPU with every device described as lavapipe, so detection alone
says "lavapipe".
"""
from __future__ import annotations

from pathlib import Path

import llama_cpp
import pytest

from cactus_gguf.llama import lavapipe, placement
from cactus_gguf.llama.context import Context, ContextOptions, DecodeError
from cactus_gguf.llama.lavapipe import (KV_PAD, WARMUP_ENV, WarmupFailedError, WarmupPlan,
                                        WarmupRefusedError, check_llama_cpp, prompt_chunks,
                                        split_k_scratch, warmup_plan, warmup_requested)
from cactus_gguf.llama.model import AttentionShape
from cactus_gguf.llama.placement import LayerPlacement, on_lavapipe
from support.llama_build import GpuBuild

TINY = AttentionShape(4, 4, 16, 16)          # tests/support/tiny_gguf.py: no grouped-query heads
QWEN_0_5B = AttentionShape(14, 2, 64, 64)    # qwen2.5-coder-0.5b-instruct
QWEN_1_5B = AttentionShape(12, 2, 128, 128)  # qwen2.5-coder-1.5b-instruct


def n_kv(cells: int) -> int:
    return max(KV_PAD, -(-cells // KV_PAD) * KV_PAD)


# (shape, prompt tokens, rows, bytes ggml-vulkan asked for), n_ctx = 2048
OBSERVED = [
    (TINY, 0, 1, 1152), (TINY, 0, 2, 4608), (TINY, 0, 5, 5760), (TINY, 0, 9, 5184),
    (TINY, 0, 16, 9216), (TINY, 0, 17, 0), (TINY, 300, 1, 2304), (TINY, 800, 8, 18432),
    (TINY, 800, 17, 9792), (TINY, 800, 32, 18432), (TINY, 800, 33, 0), (TINY, 1100, 1, 2016),
    (TINY, 1900, 7, 16128),
    (QWEN_0_5B, 0, 1, 7392), (QWEN_0_5B, 0, 2, 14784), (QWEN_0_5B, 0, 4, 29568),
    (QWEN_0_5B, 0, 8, 0), (QWEN_0_5B, 0, 16, 0), (QWEN_0_5B, 769, 1, 59136),
    (QWEN_1_5B, 0, 1, 49920), (QWEN_1_5B, 0, 2, 99840), (QWEN_1_5B, 0, 8, 99840),
    (QWEN_1_5B, 0, 16, 0),
]


@pytest.mark.parametrize("shape,prompt,rows,expected", OBSERVED)
def test_split_k_scratch_is_what_ggml_vulkan_asked_for_on_lavapipe(shape, prompt, rows, expected):
    # the prompt's own chunk (512 rows) never splits: the batch's request is the one logged
    assert prompt == 0 or split_k_scratch(prompt, n_kv(prompt), shape) == 0
    assert split_k_scratch(rows, n_kv(prompt + rows), shape) == expected


@pytest.mark.parametrize("shape,n_ctx,n_batch,plan", [
    (TINY, 512, 64, WarmupPlan((), 4, 9216)),              # the tests' tiny contexts: no prompt
    (TINY, 4096, 512, WarmupPlan((381, 380), 8, 18432)),   # larger row blocks from 1024 cells on
    # tests/support/harness.py's batches: 12 chunks of 63-64 rows, none of which splits
    (TINY, 4096, 64, WarmupPlan((64,) * 5 + (63,) * 7, 8, 18432)),
    (QWEN_1_5B, 768, 512, WarmupPlan((), 2, 99840)),
    (QWEN_1_5B, 4096, 512, WarmupPlan((377, 376), 16, 199680)),
    (QWEN_0_5B, 4096, 512, WarmupPlan((384, 384), 1, 59136)),  # grouped heads: larger blocks
    # 8-row batches: every prompt chunk of the tiny model splits, so no warm-up reaches 1024
    # cells; the plan asks for the most an empty cache can (4 rows)
    (TINY, 4096, 8, WarmupPlan((), 4, 9216, complete=False)),
])
def test_warmup_plan(shape, n_ctx, n_batch, plan):
    assert warmup_plan(shape, n_ctx, n_batch) == plan


def test_prompt_chunks_are_even_and_longest_first():
    assert prompt_chunks(0, 64) == ()
    assert prompt_chunks(64, 64) == (64,)
    assert prompt_chunks(65, 64) == (33, 32)
    assert prompt_chunks(761, 64) == (64,) * 5 + (63,) * 7
    assert prompt_chunks(761, 512) == (381, 380)


@pytest.mark.parametrize("shape", [TINY, QWEN_0_5B, QWEN_1_5B, AttentionShape(32, 8, 128, 128),
                                   AttentionShape(8, 1, 256, 256), AttentionShape(2, 2, 40, 40)])
@pytest.mark.parametrize("n_ctx,n_batch", [(256, 512), (512, 64), (1000, 64), (2048, 512),
                                           (4096, 64), (5000, 2048)])
def test_the_plan_asks_first_for_the_most_any_decode_asks(shape, n_ctx, n_batch):
    plan = warmup_plan(shape, n_ctx, n_batch)
    lengths = {min(n_ctx, n_kv(c)) for c in range(1, n_ctx + 1)}
    most = max(split_k_scratch(r, kv, shape)
               for kv in lengths for r in range(1, min(n_batch, kv) + 1))
    assert plan.complete and plan.scratch == most
    assert plan.prompt + plan.rows <= n_ctx and plan.rows <= n_batch
    if most:
        assert split_k_scratch(plan.rows, min(n_ctx, n_kv(plan.prompt + plan.rows)), shape) == most
        done = 0  # the prompt's chunks ask for nothing
        for m in plan.chunks:
            done += m
            assert 0 < m <= n_batch and split_k_scratch(m, min(n_ctx, n_kv(done)), shape) == 0
    else:
        assert plan == WarmupPlan((), 0, 0)


# ------------------------------------------------------------------------------------------------
# Only when asked for
# ------------------------------------------------------------------------------------------------

LAVAPIPE = "llvmpipe (LLVM 15.0.6, 256 bits)"  # how lavapipe describes itself to ggml
CTX = ContextOptions(n_ctx=512, n_threads=1)


@pytest.fixture
def lavapipe_everywhere(monkeypatch):
    """Every device of this process (the CPU the tiny model loads on) describes itself as
    lavapipe: device detection alone says the model runs there."""
    monkeypatch.setattr(placement, "dev_description", lambda dev: LAVAPIPE)


@pytest.fixture
def decodes(monkeypatch) -> list[int]:
    """The batch sizes of every Context.decode from here on."""
    seen: list[int] = []
    decode = Context.decode

    def counting(self, tokens, *args, **kwargs):
        seen.append(len(tokens))
        return decode(self, tokens, *args, **kwargs)

    monkeypatch.setattr(Context, "decode", counting)
    return seen


@pytest.fixture
def closes(monkeypatch) -> list[Context]:
    """Every context closed from here on."""
    closed: list[Context] = []
    close = Context.close

    def recording(self):
        closed.append(self)
        close(self)

    monkeypatch.setattr(Context, "close", recording)
    return closed


@pytest.mark.parametrize("value", [None, "", "0"])
def test_no_warm_up_unless_asked_even_on_lavapipe(tiny_pair, lavapipe_everywhere, decodes,
                                                  monkeypatch, value):
    if value is None:
        monkeypatch.delenv(WARMUP_ENV, raising=False)
    else:
        monkeypatch.setenv(WARMUP_ENV, value)
    with Context.load(tiny_pair[0], context_options=CTX) as ctx:
        assert on_lavapipe(ctx.model.placement)  # detection says lavapipe ...
        assert ctx.warmup is None and decodes == []  # ... and nothing is decoded


def test_asked_for_on_lavapipe_the_context_decodes_its_plan(tiny_pair, lavapipe_everywhere,
                                                            decodes, monkeypatch):
    monkeypatch.setenv(WARMUP_ENV, "1")
    with Context.load(tiny_pair[0], context_options=CTX) as ctx:
        plan = warmup_plan(ctx.model.attention_shape, ctx.n_ctx, ctx.n_batch)
        assert plan.rows > 0 and ctx.warmup == plan
        assert decodes == [*plan.chunks, plan.rows]
        assert ctx.n_past == 0 and ctx.tokens == []  # the cache is cleared after it


def test_asked_for_off_lavapipe_no_warm_up(tiny_pair, decodes, monkeypatch):
    monkeypatch.setenv(WARMUP_ENV, "1")
    with Context.load(tiny_pair[0], context_options=CTX) as ctx:
        assert not on_lavapipe(ctx.model.placement)
        assert ctx.warmup is None and decodes == []


def test_a_lavapipe_device_the_model_does_not_use_does_not_count(monkeypatch):
    names = {1: "CPU", 2: "Vulkan0", 3: "Vulkan1"}
    described = {1: "AMD EPYC", 2: "AMD Radeon RX 7900 XTX (RADV NAVI31)", 3: LAVAPIPE}
    monkeypatch.setattr(placement, "all_devices", lambda: list(names))
    monkeypatch.setattr(placement, "dev_name", names.__getitem__)
    monkeypatch.setattr(placement, "dev_description", described.__getitem__)
    assert not on_lavapipe(LayerPlacement(("Vulkan0",) * 3))  # the real GPU, lavapipe beside it
    assert not on_lavapipe(LayerPlacement(("CPU",) * 3))
    assert on_lavapipe(LayerPlacement(("Vulkan0", "Vulkan1", "CPU")))


def test_the_variable_is_1_or_0():
    assert not warmup_requested({}) and not warmup_requested({WARMUP_ENV: ""})
    assert not warmup_requested({WARMUP_ENV: "0"}) and warmup_requested({WARMUP_ENV: "1"})
    with pytest.raises(WarmupRefusedError, match=rf"^{WARMUP_ENV}='yes': set it to 1"):
        warmup_requested({WARMUP_ENV: "yes"})


def test_the_pinned_llama_cpp_is_the_one_the_warm_up_mirrors():
    assert llama_cpp.__version__ == lavapipe.MIRRORED_LLAMA_CPP_PYTHON
    assert lavapipe.ggml_commit().split("-")[0] == lavapipe.MIRRORED_GGML_COMMIT
    check_llama_cpp()
    check_llama_cpp("0c1e570-dirty")  # the sdist's git metadata; dirty once built
    for other in ("0c1e571", "unknown", ""):
        with pytest.raises(WarmupRefusedError):
            check_llama_cpp(other)


def test_another_llama_cpp_is_refused(tiny_pair, lavapipe_everywhere, decodes, closes,
                                      monkeypatch):
    monkeypatch.setenv(WARMUP_ENV, "1")
    monkeypatch.setattr(lavapipe, "ggml_commit", lambda: "b7000aa")
    with pytest.raises(WarmupRefusedError) as err:
        Context.load(tiny_pair[0], context_options=CTX)
    msg = str(err.value)
    assert "\n" not in msg and "ggml commit 0c1e570" in msg and "ggml commit b7000aa" in msg
    assert f"unset {WARMUP_ENV}" in msg and "llama-cpp-python 0.3.36" in msg
    assert decodes == [] and len(closes) == 1 and closes[0].closed and closes[0].model.closed


def test_a_failed_warm_up_raises_and_frees_the_context(tiny_pair, lavapipe_everywhere, closes,
                                                       monkeypatch):
    monkeypatch.setenv(WARMUP_ENV, "1")

    def failing(self, tokens, *args, **kwargs):
        raise DecodeError("llama_decode returned -3: the device was lost")

    monkeypatch.setattr(Context, "decode", failing)
    with pytest.raises(WarmupFailedError) as err:
        Context.load(tiny_pair[0], context_options=CTX)
    assert isinstance(err.value.__cause__, DecodeError)
    assert str(err.value).startswith("the lavapipe warm-up of verifier.gguf (")
    assert "the device was lost" in str(err.value)
    assert len(closes) == 1 and closes[0].closed and closes[0].model.closed


def test_the_vulkan_builds_environment_asks_for_the_warm_up(monkeypatch):
    monkeypatch.delenv(WARMUP_ENV, raising=False)
    assert GpuBuild("vulkan", Path("/nowhere"), 0.0).env()[WARMUP_ENV] == "1"
    assert WARMUP_ENV not in GpuBuild("cuda", Path("/nowhere"), 0.0).env()  # real GPUs: none
    monkeypatch.setenv(WARMUP_ENV, "0")  # an explicit choice stays
    assert GpuBuild("vulkan", Path("/nowhere"), 0.0).env()[WARMUP_ENV] == "0"
