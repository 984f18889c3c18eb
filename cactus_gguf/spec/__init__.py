"""Speculative decoding: the engine and its parts.

- ``engine``: Engine (two loaded models, their KV caches with prefix reuse, the draft-verify
  step, one generation at a time) and Stream;
- ``session``: one generation's state (committed ids, RNG, text, statistics);
- ``drafters``: the Drafter interface; the draft-model and n-gram (prompt lookup) drafters;
- ``policy``: the draft-length policy (fixed k, draft_min, draft_p_min);
- ``vocab``: the check that a draft can speculate for a verifier.
"""
from .drafters import Drafter, ModelDrafter, NgramDrafter
from .engine import Chunk, Engine, Stream
from .policy import DraftPolicy, FixedDraftLength
from .vocab import VocabMismatchError, check_vocab_compatible

__all__ = ["Engine", "Stream", "Chunk", "Drafter", "ModelDrafter", "NgramDrafter", "DraftPolicy",
           "FixedDraftLength", "VocabMismatchError", "check_vocab_compatible"]
