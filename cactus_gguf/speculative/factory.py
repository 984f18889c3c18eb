"""The drafter a request drafts with, from the request and the loaded models: one function, as
llama.cpp's ``common_speculative_init`` picks its drafter.

``ngram``: prompt lookup (drafters.py NgramDrafter); ``mtp``: the verifier's own next-token head
(mtp.py); ``model``: the draft model (drafters.py ModelDrafter, or foreign.py ForeignDrafter when
its vocabulary is not the verifier's and ``draft_vocab`` says how to cross); ``hybrid``: prompt
lookup first, the draft model otherwise. Any of them under llama-server's synthetic acceptance
(``spec_synth_rates`` / ``spec_synth_len``, benchmarking only): drafters.py SynthDrafter.
"""
from __future__ import annotations

import contextlib
import logging

from ..errors import InputError
from ..options import Request
from ..sampling import sampling_params
from .drafters import HybridDrafter, ModelDrafter, NgramDrafter, SynthDrafter, synth_rates
from .foreign import ForeignDrafter
from .mtp import MtpDrafter

__all__ = ["make_drafter", "model_drafter"]

log = logging.getLogger("cactus_gguf.speculative.engine")


def make_drafter(req: Request, seed: int, *, verifier, draft=None, mtp=None, pair_vocab=None,
                 lock=None):
    """The drafter of ``req`` on these models: ``verifier`` and ``draft`` (Contexts; draft None
    without a draft model), ``mtp`` (the verifier's MtpHead, or None), ``pair_vocab`` (how the
    two vocabularies meet; loading.py) and ``lock`` (held while a vocabulary translator is built).
    The request was checked against the models (options/speculation.py ``check_speculation``: the
    head, or the draft model, its drafter needs is loaded). Raises InputError (a draft ceiling at
    or above the draft's n_batch; :func:`model_drafter`'s)."""
    drafter = _drafter(req, seed, verifier=verifier, draft=draft, mtp=mtp, pair_vocab=pair_vocab,
                       lock=lock)
    rates = synth_rates(req.spec_synth_rates, req.spec_synth_len, req.draft_ceiling)
    return SynthDrafter(drafter, rates, seed) if rates else drafter


def _drafter(req: Request, seed: int, *, verifier, draft, mtp, pair_vocab, lock):
    if req.drafter == "ngram":
        return NgramDrafter(req.ngram_max, req.ngram_min)
    if req.drafter == "mtp":
        return MtpDrafter(mtp, verifier.n_vocab)
    drafter = model_drafter(req, seed, verifier=verifier, draft=draft, pair_vocab=pair_vocab,
                            lock=lock)  # model or hybrid
    if req.drafter == "hybrid":
        drafter = HybridDrafter(drafter, req.ngram_max)
    if req.draft_ceiling >= draft.n_batch:
        name = req.draft_ceiling_option
        raise InputError(f"{{{name}}}={req.draft_ceiling} must be below the draft's "
                         f"n_batch={draft.n_batch}", param=name)
    return drafter


def model_drafter(req: Request, seed: int, *, verifier, draft, pair_vocab, lock=None):
    """The draft model's drafter for ``req``: the plain one when the pair shares one vocabulary
    (or ``draft_vocab`` resolves to ``same``), else a ForeignDrafter in the method ``draft_vocab``
    resolves to (speculative/foreign.py). Raises InputError (a method the pair cannot use;
    ``draft_window`` with a foreign draft)."""
    method = pair_vocab.method_for(req.draft_vocab)
    log.debug("draft vocabulary: %s (draft_vocab %s)", method, req.draft_vocab)
    if method == "same":
        return ModelDrafter(draft, verifier.n_vocab, req.draft_window)
    if req.draft_window:
        raise InputError(f"{{draft_window}} works only with a draft of the verifier's "
                         f"vocabulary, and this request drafts with {{draft_vocab}} {method}: "
                         "set {draft_window} 0", param="draft_window",
                         options=("draft_vocab",))
    with lock if lock is not None else contextlib.nullcontext():
        translator = pair_vocab.translator(verifier.model, draft.model)
    return ForeignDrafter(draft, translator, method, sampling_params(req), seed,
                          lambda text: verifier.model.tokenize(text, add_special=False,
                                                               parse_special=False),
                          verifier.n_vocab, draft_temp=req.draft_temp)
