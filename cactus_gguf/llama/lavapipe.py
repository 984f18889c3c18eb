"""The warm-up that keeps Mesa's lavapipe (the software Vulkan device the GPU tests run on) alive:
test support, made only when asked for.

lavapipe (Debian 12's Mesa 22.3) reads every binding of a descriptor set it binds, also those the
shader does not use. ggml-vulkan writes only the bindings a shader uses, and keeps per-context
scratch buffers that it grows in the middle of a decode when a shape needs more
(``ggml_vk_preallocate_buffers`` destroys the old buffer). Flash attention's split-k scratch sits
at binding 5 of its dispatch; after it grows, a descriptor set that still names the destroyed
buffer in a binding the next shader does not use crashes lavapipe's queue thread (a SIGSEGV while
``llama_get_logits`` waits for the device): e.g. one-token decodes and then a multi-row
verification, or a long prompt and then a one-row decode. A scratch buffer that grows from
nothing destroys nothing (ggml makes no device buffer for size 0), so on lavapipe a context's
first request for split-k scratch must already be the largest it will ever make.

How large that is follows from ggml-vulkan's choice of the split count (``ggml_vk_flash_attn`` and
``get_fa_tuning_params_scalar`` in the vendored ``ggml-vulkan.cpp`` of llama-cpp-python 0.3.36,
the version this project pins; lavapipe reports no shader-core count, so ggml assumes 16):
:func:`split_k_scratch` reproduces it for one attention call, :func:`warmup_plan` finds the
largest request over every batch size and cache length the context allows, and the cheapest
decode that makes it first. The KV cache length an attention call sees is a multiple of 256
cells (llama.cpp pads it), so the plan looks at those lengths only. The split count grows with the
cache length until it reaches its cap, and ggml uses larger row blocks from 1024 cells on, so
for some models and batch sizes the largest request needs a few hundred cached tokens: the plan
pays that prompt once, at load. ``GGML_VK_MEMORY_LOGGER=1`` makes ggml print every scratch
request (``split_k_size``); tests/test_vulkan.py checks with it that the plan's request is the
only one.

**Only when asked for.** The warm-up is a workaround for one driver on one llama.cpp, not part of
the product: a context makes it only when ``CACTUS_GGUF_LAVAPIPE_WARMUP=1`` is set (the Vulkan
tests set it through tests/support/llama_build.py, and benchmarks/gpu_check.sh) *and* the model's
layers went to a lavapipe device; a lavapipe device being present is never enough. Asked for, it
first checks that the loaded llama.cpp is the one this module mirrors (:func:`check_llama_cpp`:
ggml's build commit, ``ggml_commit()``) and refuses any other with WarmupRefusedError; a decode
of the warm-up that fails is a WarmupFailedError (llama/context.py), never ignored.
"""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from typing import Mapping

import llama_cpp

from ..errors import EngineError, InputError
from .model import AttentionShape
from .placement import LayerPlacement, on_lavapipe

__all__ = ["WarmupPlan", "split_k_scratch", "warmup_plan", "prompt_chunks", "KV_PAD",
           "WARMUP_ENV", "WarmupRefusedError", "WarmupFailedError", "warmup_requested",
           "check_llama_cpp", "warmup_wanted"]

log_ = logging.getLogger(__name__)

#: the environment variable that asks for the warm-up: "1"; unset, "" or "0": none
WARMUP_ENV = "CACTUS_GGUF_LAVAPIPE_WARMUP"
#: the llama.cpp whose ggml-vulkan this module mirrors: llama-cpp-python 0.3.36's vendored source,
#: built from the sdist (its git metadata gives ggml_commit() "0c1e570", or "0c1e570-dirty")
MIRRORED_LLAMA_CPP_PYTHON = "0.3.36"
MIRRORED_GGML_COMMIT = "0c1e570"
#: llama.cpp pads the KV length an attention call sees to a multiple of this (cells)
KV_PAD = 256
#: ggml-vulkan's stand-in for the shader-core count of a device that reports none (lavapipe)
_CORES = 16
#: below this cache length (cells) ggml-vulkan's scalar flash attention uses smaller row blocks
_LARGE_BLOCKS_FROM = 1024


class WarmupRefusedError(InputError):
    """The warm-up was asked for where this module cannot plan it: another llama.cpp than the one
    it mirrors, or a value of CACTUS_GGUF_LAVAPIPE_WARMUP other than 0 or 1."""


class WarmupFailedError(EngineError):
    """A decode of the warm-up failed (the context is closed)."""


def warmup_requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``CACTUS_GGUF_LAVAPIPE_WARMUP`` asks for the warm-up ("1"; unset, "" or "0": no).
    Raises WarmupRefusedError for any other value."""
    value = environ.get(WARMUP_ENV, "")
    if value not in ("", "0", "1"):
        raise WarmupRefusedError(f"{WARMUP_ENV}={value!r}: set it to 1 to make the lavapipe "
                                 "warm-up, 0 (or leave it unset) for none")
    return value == "1"


def ggml_commit() -> str:
    """The commit the loaded ggml was built from (``ggml_commit()``: "0c1e570-dirty"; "unknown"
    when it was built outside git, or the library has no such function)."""
    fn = getattr(llama_cpp.llama_cpp._lib, "ggml_commit", None)
    if fn is None:
        return "unknown"
    fn.restype, fn.argtypes = ctypes.c_char_p, []
    return (fn() or b"unknown").decode("utf-8", errors="replace")


def check_llama_cpp(commit: str | None = None) -> None:
    """Refuse (WarmupRefusedError) a llama.cpp other than the one this module mirrors: its plan
    reproduces that ggml-vulkan's choices, which another version may make differently.
    ``commit``: the loaded ggml's (default :func:`ggml_commit`)."""
    commit = ggml_commit() if commit is None else commit
    if commit.split("-", 1)[0] != MIRRORED_GGML_COMMIT:
        raise WarmupRefusedError(
            f"{WARMUP_ENV}=1 asks for the lavapipe warm-up, which mirrors ggml-vulkan of "
            f"llama-cpp-python {MIRRORED_LLAMA_CPP_PYTHON} (ggml commit {MIRRORED_GGML_COMMIT}); "
            f"this llama.cpp is ggml commit {commit} (llama-cpp-python {llama_cpp.__version__}): "
            f"unset {WARMUP_ENV}, or use llama-cpp-python {MIRRORED_LLAMA_CPP_PYTHON}")


def warmup_wanted(placement: LayerPlacement | None) -> bool:
    """Whether a context of a model placed so makes the warm-up: asked for
    (:func:`warmup_requested`), on the llama.cpp this module mirrors (else WarmupRefusedError),
    and some of the model's layers on a lavapipe device (``placement``: llama.cpp's own account of
    the load; None, when it gave none: no layer known to be there, so no warm-up)."""
    if not warmup_requested():
        return False
    check_llama_cpp()
    if placement is None:
        log_.warning("%s=1 but llama.cpp did not say where the layers went: no lavapipe warm-up",
                     WARMUP_ENV)
        return False
    return on_lavapipe(placement)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _blocks(rows: int, n_kv: int, shape: AttentionShape) -> tuple[int, int]:
    """(block rows Br, block columns Bc) of ggml-vulkan's scalar flash-attention kernel for a
    call over ``rows`` query rows and ``n_kv`` cached cells (a device that is neither AMD,
    Intel nor NVIDIA, and has the shared memory of the larger blocks)."""
    d = shape.head_k | shape.head_v
    if rows == 1:
        return 1, 64
    reduce = bool(d & 8) or n_kv < _LARGE_BLOCKS_FROM
    if rows < 4 or shape.head_k <= 64:  # row split 1
        br = 2 if rows == 2 else (4 if rows <= 4 or reduce else 8)
    else:                                # row split 4
        br = 4 if rows <= 4 else (8 if rows <= 8 or reduce else 16)
    return br, (64 if d & 8 else 32)


def split_k_scratch(rows: int, n_kv: int, shape: AttentionShape) -> int:
    """Bytes of split-k scratch ggml-vulkan asks for in one flash-attention call over ``rows``
    query rows (the batch) and ``n_kv`` cached cells; 0 when it does not split the cache."""
    group = shape.n_head // max(1, shape.n_head_kv)
    max_group = min(_blocks(512, n_kv, shape)[0], 32)
    grouped = rows <= 8 and 1 < group <= max_group and group * shape.n_head_kv == shape.n_head
    if grouped:  # the query heads of one KV head become the rows
        br, bc = _blocks(group, n_kv, shape)
        wgs = rows * (shape.n_head // group)
        split = _CORES * 2 // wgs if rows <= br else 1
    else:
        br, bc = _blocks(rows, n_kv, shape)
        wgs = _ceil_div(rows, br) * shape.n_head
        split = _CORES * 2 // wgs if wgs < _CORES * 2 else 1
    if split <= 1:
        return 0
    per_split = _ceil_div(max(1, n_kv // split), bc) * bc
    split = _ceil_div(n_kv, per_split)
    if split <= 1:
        return 0
    return (shape.head_v * shape.n_head * 4 + shape.n_head * 8) * split * rows


@dataclass(frozen=True)
class WarmupPlan:
    """Decode a prompt in ``chunks`` (batch sizes, none of which asks for split-k scratch), then
    one batch of ``rows`` rows, every row an output, then clear the cache: the batch asks for
    ``scratch`` bytes, the most any decode of the context can ask for (``complete``) or, when no
    such warm-up exists, the most a batch on an empty cache can ask for. ``scratch`` 0: nothing
    to warm up."""

    chunks: tuple[int, ...]
    rows: int
    scratch: int
    complete: bool = True

    @property
    def prompt(self) -> int:
        """Tokens decoded before the batch."""
        return sum(self.chunks)


def _n_kv(cells: int, n_ctx: int) -> int:
    return min(n_ctx, max(KV_PAD, _ceil_div(cells, KV_PAD) * KV_PAD))


def prompt_chunks(prompt: int, n_batch: int) -> tuple[int, ...]:
    """``prompt`` tokens in the fewest batches of at most ``n_batch`` rows, as even as possible
    (sizes differ by at most one), longest first: the smallest batch is as large as it can be."""
    if prompt <= 0:
        return ()
    n = _ceil_div(prompt, n_batch)
    small, extra = divmod(prompt, n)
    return (small + 1,) * extra + (small,) * (n - extra)


def _asks_nothing(chunks: tuple[int, ...], n_ctx: int, shape: AttentionShape) -> bool:
    """Whether decoding ``chunks`` one after the other makes no split-k request."""
    done = 0
    for rows in chunks:
        done += rows
        if split_k_scratch(rows, _n_kv(done, n_ctx), shape):
            return False
    return True


def warmup_plan(shape: AttentionShape, n_ctx: int, n_batch: int) -> WarmupPlan:
    """The cheapest warm-up (fewest tokens decoded, then fewest rows) whose one split-k request is
    the largest any batch of at most ``n_batch`` rows can make in a context of ``n_ctx`` cells.

    A batch of ``r`` rows sees the cache length of the cells it fills, so the prompt before it
    may be any length that puts the batch's last cell at the wanted length; its chunks must ask
    for nothing, which a batch of a few rows always does: with a small ``n_batch`` no warm-up may
    exist, and the plan is then the largest request on an empty cache (``complete`` False)."""
    n_ctx = max(1, n_ctx)
    lengths = sorted({_n_kv(c, n_ctx) for c in range(1, n_ctx + 1, KV_PAD)} | {_n_kv(n_ctx, n_ctx)})
    most_rows = min(n_batch, n_ctx)
    # beyond 2 * 16 workgroups' worth of rows ggml never splits: the sizes stop growing long before
    row_range = range(1, min(most_rows, 64 * _CORES) + 1)
    need = max((split_k_scratch(r, kv, shape) for kv in lengths for r in row_range if r <= kv),
               default=0)
    if need == 0:
        return WarmupPlan((), 0, 0)
    best: WarmupPlan | None = None
    for i, kv in enumerate(lengths):
        first_cell = lengths[i - 1] + 1 if i else 1  # the fewest cells giving this length
        if best is not None and first_cell > best.prompt + best.rows:
            break  # longer caches only cost more
        for r in row_range:
            if r > kv or split_k_scratch(r, kv, shape) != need:
                continue
            for cells in range(max(r, first_cell), kv + 1):
                if best is not None and cells >= best.prompt + best.rows:
                    break
                chunks = prompt_chunks(cells - r, n_batch)
                if _asks_nothing(chunks, n_ctx, shape):
                    best = WarmupPlan(chunks, r, need)
                    break
    if best is not None:
        return best
    on_empty = _n_kv(1, n_ctx)
    rows = [r for r in row_range if r <= on_empty]
    top = max(rows, key=lambda r: (split_k_scratch(r, on_empty, shape), -r))
    return WarmupPlan((), top, split_k_scratch(top, on_empty, shape), complete=False)
