"""Warps on the device (``backend_sampling``): when the request's warps truncate the vocabulary
(top-k K > 0), llama.cpp's backend sampler keeps each output row's K + 1 largest logits inside the
decode graph, and the host reads those instead of V logits per row (issue 41, item 2).

What llama.cpp does (the vendored 0.3.36 source, checked on a tiny GGUF on the CPU build): a
sampler chain attached with ``llama_set_sampler`` runs, for every output row of a decode (up to the
context's ``n_outputs_max_per_seq``; the context sets n_batch), ``ggml_top_k`` on the row's logits
and ``ggml_get_rows`` of them: ``llama_get_sampled_candidates_ith`` / ``_logits_ith`` return the
K' ids and their float32 logits, bit for bit the values ``llama_get_logits_ith`` gives without the
sampler, in no particular order (the CPU kernel is an unstable ``std::partial_sort`` and swaps the
first two); no full rows are copied out while it is attached. Among equal logits at the K'-th place
it keeps an arbitrary subset, not the lowest ids the native warps keep.

So the device keeps K' = K + 1: a row is **exact** when its (K + 1)-th logit is strictly below its
K-th, for then the K + 1 ids hold every id the native top-K can keep (whatever the ties inside the
top K). A row that is not exact (a tie at the K-th logit) is decoded again in full
(``Context.decode_full_again``), and that step runs the full path.

The compact step (issue 41, item 3: host work that does not grow with V) is two calls into the
native helper: ``read_rows`` reads the step's k + 1 rows through llama.cpp's accessors, checks
that each is exact and sorts it by id (``cg_read_rows``); ``NativeSampler.verify_compact`` builds
the union U of the verifier rows' ids, the draft rows' ids and the drafted ids (ascending, at most
(2k + 1)(K + 1) ids), gathers every row into U (-inf / 0 outside its own ids) with Cactus's end
set, and runs ``cg_verify`` on rows of |U| entries; the index it returns maps back to its id. The
warps and every draw go by (logit, id) order and skip zeros, so this is the full path's
computation, bit for bit, with the same uniforms: same tokens for the same seed. Requests with a
grammar, log-probabilities, a foreign or MTP draft, or a recurrent model keep the full path (they
need full rows or cannot roll a batch back), as do builds without the API and Vulkan builds (the
backend sampler of this llama.cpp aborts there: ``llama.device_top_k.vulkan_build``).
"""
from __future__ import annotations

import logging

import numpy as np

from ..sampling import NativeSampler
from ..sampling.native import StepResult
from ..sampling.native import read_rows as native_read_rows

__all__ = ["read_rows", "device_top_k", "verify_rows", "sample_row", "full_probs"]

log_ = logging.getLogger(__name__)
_said: set[str] = set()  # the reasons already logged (once each)


def read_rows(ctx, n_rows: int, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """The last decode's ``n_rows`` device rows of K + 1 = ``k`` + 1 candidates on ``ctx`` (a
    Context with that top-K attached) as (ids int32 [n_rows, k + 1] ascending per row, logits
    float32 [n_rows, k + 1]), or None when a row's top ``k`` is not exact (fewer than k + 1
    candidates, a NaN, or the (k + 1)-th largest logit equal to the k-th: a tie llama.cpp broke
    its own way)."""
    got = native_read_rows(ctx.row_reader, n_rows, k + 1, ctx.model.n_vocab)
    return None if isinstance(got, int) else got


def _say(reason: str, loud: bool) -> None:
    if reason not in _said:
        _said.add(reason)
        log_.log(logging.WARNING if loud else logging.DEBUG,
                 "backend sampling: the full path (%s)", reason)


def device_top_k(request, ver, drafter, *, logprobs: bool, grammar: bool,
                 biased: bool = False) -> int:
    """The request's top-K when its rows come from the device (``backend_sampling`` auto / on and
    every condition above holds), else 0; says why not once per reason (``on``: a warning).
    ``biased``: the request has a logit bias, which the device's top-K would not see (its rows
    are then read in full and biased on the host: the bias is honoured, on the host)."""
    mode = getattr(request, "backend_sampling", "off")
    if mode == "off":
        return 0
    loud = mode == "on"
    k = request.top_k
    why = ("top-k 0: the warps do not truncate the vocabulary" if k <= 0
           else "top-k + 1 not below the vocabulary size" if k + 1 >= ver.n_vocab
           else "a grammar" if grammar else "log-probabilities" if logprobs
           else "a logit bias (the device's top-K does not see it)" if biased
           else "no backend sampling in this llama.cpp, a Vulkan build (its backend sampler "
                "aborts), or a recurrent / remote verifier"
           if not ver.can_sample_on_device
           else "the topk acceptance rule with accept-top-k above top-k"
           if request.speculates and request.method == "topk" and request.accept_top_k > k
           else "synthetic acceptance (it samples the verifier's full row)"
           if request.speculates and (request.spec_synth_rates is not None
                                      or request.spec_synth_len is not None)
           else None)
    if why is None and drafter is not None:
        model = getattr(drafter, "model", drafter)  # a hybrid drafter's model
        if getattr(drafter, "shared_v", None) is not None or (
                hasattr(model, "ctx") and not getattr(model, "device_rows", False)):
            why = "a draft that cannot sample on the device (foreign, MTP, recurrent)"
    if why is not None:
        _say(why, loud)
        return 0
    return k


def sample_row(sampler: NativeSampler, ctx, k: int) -> StepResult | None:
    """The verifier's own token from its one device row on ``ctx`` (a step that does not
    speculate) as a StepResult; None when the row is not exact."""
    got = read_rows(ctx, 1, k)
    if got is None:
        return None
    ids, logits = got[0][0], got[1][0]
    return StepResult(0, int(ids[sampler.sample_compact(logits)]), 0, 0.0, 0.0)


def verify_rows(sampler: NativeSampler, draft, ctx, k: int) -> StepResult | None:
    """``NativeSampler.verify`` of ``draft`` (a Draft with ``compact`` rows, or none for a
    deterministic proposal) against the verifier's last len(draft) + 1 device rows on ``ctx``
    (its top ``k`` + 1 attached), over their union (``NativeSampler.verify_device``); the
    StepResult's ``next_token`` is the token id. None, with no uniform drawn, when a row is not
    exact."""
    c_ids, c_p = draft.compact if draft.compact is not None else (None, None)
    if draft.compact is None and draft.probs is not None:  # a full [k, V] proposal: its support
        support = [np.flatnonzero(row) for row in draft.probs]
        width = max(len(x) for x in support)
        c_ids = np.full((len(draft), width), -1, np.int32)
        c_p = np.zeros((len(draft), width), np.float32)
        for i, x in enumerate(support):
            c_ids[i, :len(x)], c_p[i, :len(x)] = x, draft.probs[i][x]
    return sampler.verify_device(ctx.row_reader, k + 1, c_ids, c_p,
                                 np.ascontiguousarray(draft.tokens, np.int32))


def full_probs(draft, n_vocab: int) -> np.ndarray | None:
    """A compact draft's p rows as float32 [k, V] (the full path after a verifier row was not
    exact); None for a deterministic proposal."""
    if draft.compact is None:
        return draft.probs
    c_ids, c_p = draft.compact
    out = np.zeros((len(draft), n_vocab), np.float32)
    for i in range(len(draft)):
        used = c_ids[i] >= 0
        out[i, c_ids[i][used]] = c_p[i][used]
    return out
