"""Speculative decoding: the engine and its parts.

- ``engine``: Engine (two loaded models, their KV caches with prefix reuse, one generation at a
  time); ``stream``: Stream, one generation's text step by step; ``prefill``: prompt processing;
- ``loading``: loading the pair (paths or registry names, offload, the vocabulary check);
- ``step``: the draft-verify-accept-commit step, top to bottom;
- ``session``: one generation's state (committed ids, RNG, text, statistics);
- ``draft``: the Draft a proposal is, the step's DraftPlan, and the one draft loop;
- ``drafters``: the Drafter interface; the draft-model, n-gram (prompt lookup) and hybrid
  drafters (``foreign``: a draft with another vocabulary; ``mtp``: the verifier's MTP head);
- ``policy``: the draft-length policy (fixed k, draft_min, draft_p_min; cost-aware ``auto``);
- ``costs``: the forward-cost probe and its cache;
- ``vocab``: the check that a draft can speculate for a verifier.
"""
from .draft import Draft, DraftPlan
from .drafters import Drafter, ModelDrafter, NgramDrafter
from .engine import Chunk, Engine, Stream
from .policy import DraftPolicy, FixedDraftLength
from .vocab import VocabMismatchError

__all__ = ["Engine", "Stream", "Chunk", "Draft", "DraftPlan", "Drafter", "ModelDrafter",
           "NgramDrafter", "DraftPolicy", "FixedDraftLength", "VocabMismatchError"]
