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

The compact step: the union U of the verifier rows' ids, the draft rows' ids and the drafted ids,
in ascending id order (at most (2k + 1)(K + 1) ids), every row gathered into U (-inf / 0 outside
its own ids), the native helper run on rows of |U| entries (``NativeSampler.verify_compact``), the
index it returns mapped back to its id. The warps and every draw go by (logit, id) order and skip
zeros, so this is the full path's computation, bit for bit, with the same uniforms: same tokens
for the same seed. Cactus's end set is gathered into U too. Requests with a grammar, log-
probabilities, a foreign or MTP draft, or a recurrent model keep the full path (they need full rows
or cannot roll a batch back), as do builds without the API.
"""
from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np

from ..sampling import NativeSampler
from ..sampling.native import StepResult, pack_allowed

__all__ = ["exact_row", "device_top_k", "verify_rows", "sample_row", "full_probs"]

log_ = logging.getLogger(__name__)
_said: set[str] = set()  # the reasons already logged (once each)


def exact_row(ids: np.ndarray, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A device row of K + 1 candidates as (ids int32 ascending, their logits float32), or None
    when its top ``k`` is not exact: fewer than k + 1 candidates, a NaN, or the (k + 1)-th largest
    logit equal to the k-th (a tie llama.cpp broke its own way)."""
    if len(ids) != k + 1 or np.isnan(logits).any():
        return None
    v = np.partition(logits, 0)  # the smallest of the k + 1 against the k-th largest
    if not v[0] < np.min(v[1:]):
        return None
    order = np.argsort(ids, kind="stable")
    return np.ascontiguousarray(ids[order]), np.ascontiguousarray(logits[order])


def _say(reason: str, loud: bool) -> None:
    if reason not in _said:
        _said.add(reason)
        log_.log(logging.WARNING if loud else logging.DEBUG,
                 "backend sampling: the full path (%s)", reason)


def device_top_k(request, ver, drafter, *, logprobs: bool, grammar: bool) -> int:
    """The request's top-K when its rows come from the device (``backend_sampling`` auto / on and
    every condition above holds), else 0; says why not once per reason (``on``: a warning)."""
    mode = getattr(request, "backend_sampling", "off")
    if mode == "off":
        return 0
    loud = mode == "on"
    k = request.top_k
    why = ("top-k 0: the warps do not truncate the vocabulary" if k <= 0
           else "top-k + 1 not below the vocabulary size" if k + 1 >= ver.n_vocab
           else "a grammar" if grammar else "log-probabilities" if logprobs
           else "no backend sampling in this llama.cpp, or a recurrent / remote verifier"
           if not ver.can_sample_on_device
           else "the topk acceptance rule with accept-top-k above top-k"
           if request.speculates and request.method == "topk" and request.accept_top_k > k
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


def sample_row(sampler: NativeSampler, row: tuple[np.ndarray, np.ndarray]) -> int:
    """The verifier's own token from one exact device row (a step that does not speculate)."""
    ids, logits = row
    return int(ids[sampler.sample_compact(logits)])


def verify_rows(sampler: NativeSampler, draft, rows: list[tuple[np.ndarray, np.ndarray]]
                ) -> StepResult:
    """``NativeSampler.verify`` of ``draft`` (a Draft: ``compact`` rows, or none for a
    deterministic proposal) against the verifier's exact device ``rows`` (k + 1 of them), over
    their union U; the StepResult's ``next_token`` is the token id."""
    k = len(draft)
    parts = [r[0] for r in rows] + [draft.tokens.astype(np.int32)]
    if draft.compact is not None:
        parts += [c[0] for c in draft.compact]
    elif draft.probs is not None:  # a full [k, V] proposal (not a device drafter): its support
        parts += [np.flatnonzero(draft.probs[i]).astype(np.int32) for i in range(k)]
    ids = np.unique(np.concatenate(parts))
    n = len(ids)
    logits = np.full((k + 1, n), -np.inf, np.float32)
    for i, (r_ids, r_logits) in enumerate(rows):
        logits[i, np.searchsorted(ids, r_ids)] = r_logits
    probs = None
    if draft.compact is not None or draft.probs is not None:
        probs = np.zeros((k, n), np.float32)
        for i in range(k):
            if draft.compact is not None:
                c_ids, c_p = draft.compact[i]
                probs[i, np.searchsorted(ids, c_ids)] = c_p
            else:
                probs[i] = draft.probs[i][ids]
    index = np.searchsorted(ids, draft.tokens).astype(np.int32)
    end = sampler.acceptance.end_mask
    end_c = None
    if end is not None:  # the end set's bits at U
        end_c = pack_allowed(((end[ids >> 5] >> (ids & 31).astype(np.uint32)) & 1).astype(bool))
    res = sampler.verify_compact(probs, index, logits, end_mask=end_c)
    return replace(res, next_token=int(ids[res.next_token]))


def full_probs(draft, n_vocab: int) -> np.ndarray | None:
    """A compact draft's p rows as float32 [k, V] (the full path after a verifier row was not
    exact); None for a deterministic proposal."""
    if draft.compact is None:
        return draft.probs
    out = np.zeros((len(draft), n_vocab), np.float32)
    for i, (c_ids, c_p) in enumerate(draft.compact):
        out[i, c_ids] = c_p
    return out
