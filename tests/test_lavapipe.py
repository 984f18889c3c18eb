"""The lavapipe warm-up plan (cactus_gguf/llama/lavapipe.py): ggml-vulkan's split-k scratch for one
flash-attention call, and the cheapest warm-up whose one request is the largest a context makes.

The expected bytes were observed on lavapipe with the pinned llama.cpp built for Vulkan
(``GGML_VK_MEMORY_LOGGER=1`` prints every ``split_k_size`` request), one fresh context per case:
a prompt of P tokens, then a batch of N rows. tests/test_vulkan.py checks the plan on the device.
"""
from __future__ import annotations

import pytest

from cactus_gguf.llama.lavapipe import (KV_PAD, AttentionShape, WarmupPlan, split_k_scratch,
                                        warmup_plan)

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


@pytest.mark.parametrize("shape,n_ctx,plan", [
    (TINY, 512, WarmupPlan(0, 4, 9216)),          # the tests' tiny contexts: no prompt
    (TINY, 4096, WarmupPlan(769, 8, 18432)),      # larger row blocks from 1024 cells on
    (QWEN_1_5B, 768, WarmupPlan(0, 2, 99840)),
    (QWEN_1_5B, 4096, WarmupPlan(769, 16, 199680)),
    (QWEN_0_5B, 4096, WarmupPlan(769, 1, 59136)),  # grouped heads only with the larger blocks
])
def test_warmup_plan(shape, n_ctx, plan):
    assert warmup_plan(shape, n_ctx, 512) == plan


@pytest.mark.parametrize("shape", [TINY, QWEN_0_5B, QWEN_1_5B, AttentionShape(32, 8, 128, 128),
                                   AttentionShape(8, 1, 256, 256), AttentionShape(2, 2, 40, 40)])
@pytest.mark.parametrize("n_ctx,n_batch", [(256, 512), (1000, 64), (2048, 512), (5000, 2048)])
def test_the_plan_asks_first_for_the_most_any_decode_asks(shape, n_ctx, n_batch):
    plan = warmup_plan(shape, n_ctx, n_batch)
    lengths = {min(n_ctx, n_kv(c)) for c in range(1, n_ctx + 1)}
    most = max(split_k_scratch(r, kv, shape)
               for kv in lengths for r in range(1, min(n_batch, kv) + 1))
    assert plan.scratch == most
    assert plan.prompt + plan.rows <= n_ctx and plan.rows <= n_batch
    if most:
        assert split_k_scratch(plan.rows, min(n_ctx, n_kv(plan.prompt + plan.rows)), shape) == most
        done = 0  # the prompt, in n_batch chunks, asks for nothing
        while done < plan.prompt:
            m = min(n_batch, plan.prompt - done)
            done += m
            assert split_k_scratch(m, min(n_ctx, n_kv(done)), shape) == 0
    else:
        assert plan == WarmupPlan(0, 0, 0)
