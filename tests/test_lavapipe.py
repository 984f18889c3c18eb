"""The lavapipe warm-up plan (cactus_gguf/llama/lavapipe.py): ggml-vulkan's split-k scratch for one
flash-attention call, and the cheapest warm-up whose one request is the largest a context makes.

The expected bytes were observed on lavapipe with the pinned llama.cpp built for Vulkan
(``GGML_VK_MEMORY_LOGGER=1`` prints every ``split_k_size`` request), one fresh context per case:
a prompt of P tokens, then a batch of N rows. tests/test_vulkan.py checks the plan on the device.
"""
from __future__ import annotations

import pytest

from cactus_gguf.llama.lavapipe import (KV_PAD, AttentionShape, WarmupPlan, prompt_chunks,
                                        split_k_scratch, warmup_plan)

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
