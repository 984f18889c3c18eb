"""Drafts from a model whose vocabulary is not the verifier's (docs/models.md "Foreign drafts").

Three ways a draft's tokens reach the verifier, chosen per request (``draft_vocab``):

- ``map`` / ``intersect`` (Timor et al., ICML 2025, "token-level intersection"): the draft samples
  from its warped distribution restricted to the draft ids that have a verifier counterpart
  (renormalised: a disallowed id is a -inf logit to the native warp); the sampled id is mapped to
  the verifier's, and the row p is scattered into verifier ids. p is then an ordinary proposal
  distribution over the verifier's vocabulary, so SpS over it emits exactly q and Cactus emits
  exactly the mixture law the native helper computes. ``map`` is the case where every text token
  has a counterpart (a fine-tune's extra special tokens, moved ids): only draft special tokens
  without a counterpart are excluded, no text is re-encoded.
- ``text`` (SLEM-like, after Timor et al.'s string-level exact match): the draft samples freely in
  its own vocabulary; its text is re-tokenised by the verifier's tokenizer and proposed as
  deterministic tokens (p one-hot, like prompt lookup): exact under SpS, and Cactus's law is the
  one-hot one at each proposal.

The draft model's context holds the committed tokens *translated* into draft ids, token by token
(:class:`Translator`): a verifier id with a counterpart becomes that id, any other becomes its bytes
spelled with the draft's tokens (longest match first; byte tokens at worst). The translation of
the committed tokens only grows between steps, so re-synchronising the draft after a step decodes
only the tokens committed since (the context keeps the longest common prefix), never the whole
text again.

Shapes: V_v / V_d are the verifier's / draft's vocabulary sizes; k the draft length.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..llama import Context, Model
from ..sampling import AcceptanceParams, NativeSampler, SamplingParams
from ..sampling.constraints import Constraint
from ..sampling.native import pack_allowed
from .draft import Draft, DraftPlan, SamplingDrafter
from .vocab import VocabMismatchError, first_difference
from .vocab_map import _BYTE, _CONTROL, _TEXT_TYPES, VocabInfo, VocabMap, piece_bytes, vocab_map

__all__ = ["PairVocab", "Spelling", "Translator", "ForeignDrafter", "FOREIGN_AUTO"]

# What ``draft_vocab auto`` uses for a pair with different tokenizers (docs/models.md
# "Foreign drafts": the measured comparison of the two methods)
FOREIGN_AUTO = "intersect"
# a seed offset for the draft's own random stream (the verifier's sampler keeps the request seed)
_DRAFT_SEED_OFFSET = 0x9E3779B9


def _utf8_complete(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n  # ASCII: complete
        if b >= 0xC0:  # a lead byte: its character needs 2, 3 or 4 bytes
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n  # continuation bytes only (invalid anyway): keep them


# llama.h's token attributes -> GGUF token types (vocab_map.py), in llama.cpp's order of precedence
_ATTR_TYPES = ((1 << 3, _CONTROL), (1 << 5, _BYTE), (1 << 4, 4), (1 << 2, 1), (1 << 1, 5), (1 << 0, 2))


def vocab_info(model: Model) -> VocabInfo:
    """A loaded model's vocabulary as :class:`VocabInfo` (token strings and types through
    llama.cpp: a fraction of a second, where reading the GGUF's metadata again takes seconds).
    Its merges hash and whole hash are left empty (they key the map's cache, built from files)."""
    pieces, types = [], np.zeros(model.n_vocab, dtype=np.int32)
    for i in range(model.n_vocab):
        pieces.append(model.token_text(i).decode("utf-8", "replace"))
        attr = model.token_attr(i)
        types[i] = next((t for bit, t in _ATTR_TYPES if attr & bit), 0)
    kind = model.metadata("tokenizer.ggml.model") or ""
    return VocabInfo(os.fspath(model.path), kind, tuple(pieces), types, {}, "", "")


class Spelling:
    """Any bytes as a vocabulary's text tokens, longest match first: the ids of ``info``'s text
    tokens by their bytes (the lowest id of each, a byte-fallback token only where no other token
    spells the same byte, as a tokenizer would choose)."""

    def __init__(self, info: VocabInfo) -> None:
        self._by_bytes: dict[bytes, int] = {}
        types = info.types.tolist()
        for fallback in (False, True):
            for i, (piece, t) in enumerate(zip(info.pieces, types)):
                if t in _TEXT_TYPES and (t == _BYTE) == fallback:
                    self._by_bytes.setdefault(piece_bytes(piece, info.model, t), i)
        self._longest = max((len(b) for b in self._by_bytes), default=1)

    def spell(self, data: bytes) -> list[int]:
        """Token ids spelling ``data``, longest match first; a byte no token covers is dropped
        (a vocabulary without byte tokens)."""
        out, i, n = [], 0, len(data)
        while i < n:
            for j in range(min(n, i + self._longest), i, -1):
                t = self._by_bytes.get(data[i:j])
                if t is not None:
                    out.append(t)
                    i = j
                    break
            else:
                i += 1
        return out


class Translator:
    """Token ids of one vocabulary in terms of the other's, from both GGUFs' token strings.

    d2v: int32 [V_d], the verifier id of each draft id (-1: none); v2d: int32 [V_v], the draft id
    of each verifier id (-1: none; the lowest draft id when several spell the same bytes);
    shared_v: bool [V_v], the verifier ids some draft id maps to (the intersection, where the
    coverage Σ q over it is measured); draftable: uint32 [ceil(V_d / 32)], the packed mask of the
    draft ids that may be proposed under ``intersect`` / ``map`` (those with a counterpart).
    """

    def __init__(self, verifier: VocabInfo, draft: VocabInfo, vm: VocabMap) -> None:
        self.verifier, self.draft = verifier, draft
        self.d2v = np.asarray(vm.draft_to_verifier, dtype=np.int32)
        self.v2d = np.full(verifier.n_vocab, -1, dtype=np.int32)
        ids = np.flatnonzero(self.d2v >= 0)
        targets, first = np.unique(self.d2v[ids], return_index=True)
        self.v2d[targets] = ids[first]
        self.shared_v = np.zeros(verifier.n_vocab, dtype=bool)
        self.shared_v[targets] = True
        self.draftable = pack_allowed(self.d2v >= 0)
        self.draft_spelling = Spelling(draft)
        self._verifier_spelling: Spelling | None = None
        self._to_draft: dict[int, tuple[int, ...]] = {}

    @property
    def verifier_spelling(self) -> "Spelling":
        """The verifier's :class:`Spelling` (built on first use: only ``text`` needs it)."""
        if self._verifier_spelling is None:
            self._verifier_spelling = Spelling(self.verifier)
        return self._verifier_spelling

    @classmethod
    def of(cls, verifier: Model, draft: Model) -> "Translator":
        """Built from two loaded models (their token strings through llama.cpp; the map from the
        GGUF files, cached: speculative/vocab_map.py)."""
        return cls(vocab_info(verifier), vocab_info(draft),
                   vocab_map(verifier.path, draft.path))

    @staticmethod
    def token_bytes(info: VocabInfo, token: int) -> bytes:
        """The bytes ``token`` of vocabulary ``info`` stands for: a text token's bytes, a control
        token's text (e.g. ``<|im_start|>``), nothing for unused ids."""
        t = int(info.types[token])
        if t in _TEXT_TYPES:
            return piece_bytes(info.pieces[token], info.model, t)
        return info.pieces[token].encode("utf-8") if t == _CONTROL else b""

    def to_draft(self, token: int) -> tuple[int, ...]:
        """The draft ids standing for verifier id ``token``: its counterpart, else its bytes
        spelled in draft tokens (cached)."""
        got = self._to_draft.get(token)
        if got is None:
            d = int(self.v2d[token]) if 0 <= token < len(self.v2d) else -1
            got = (d,) if d >= 0 else tuple(self.draft_spelling.spell(
                self.token_bytes(self.verifier, token)))
            self._to_draft[token] = got
        return got


@dataclass
class PairVocab:
    """How a loaded pair's vocabularies relate, and which method a request's ``draft_vocab``
    resolves to.

    kind: ``same`` (one vocabulary, padding tails aside), ``map`` (the same text tokens, other ids
    or special tokens) or ``intersect`` (different tokenizers); why: what differs (empty for
    ``same``); coverage: the share of the draft's text tokens the verifier has.
    """

    kind: str
    why: str
    verifier_path: str
    draft_path: str
    coverage: float = 1.0
    _translator: Translator | None = field(default=None, repr=False)

    @classmethod
    def of(cls, verifier: Model, draft: Model) -> "PairVocab":
        """Compare two loaded models: the id-for-id check first (cheap, no file read); only a pair
        it refuses is mapped from the GGUFs' token strings. Raises VocabMismatchError for a pair
        that shares no text token (nothing could ever be proposed)."""
        vp, dp = os.fspath(verifier.path), os.fspath(draft.path)
        difference = first_difference(verifier, draft)
        if difference is None:
            return cls("same", "", vp, dp)
        vm = vocab_map(vp, dp)
        if vm.n_text_shared == 0:
            raise VocabMismatchError(
                f"draft {draft.path.name} and verifier {verifier.path.name} share no text token "
                f"(`cactus-gguf vocab {vp} {dp}` shows both): pick another draft")
        if vm.method in ("same", "map"):
            return cls("map", difference, vp, dp, vm.draft_coverage)
        why = (f"{difference}; the tokenizers differ ({vm.n_text_shared} of the draft's "
               f"{vm.n_text_draft} text tokens are the verifier's, merges "
               f"{'the same' if vm.same_merges else 'differ'})")
        return cls("intersect", why, vp, dp, vm.draft_coverage)

    def method_for(self, requested: str) -> str:
        """The method a request's ``draft_vocab`` runs with on this pair: ``same``, ``map``,
        ``intersect`` or ``text``. Raises InputError (param draft_vocab) for a method the pair
        cannot use (``same`` on a pair that is not; ``map`` across tokenizers)."""
        if requested == "auto":
            return FOREIGN_AUTO if self.kind == "intersect" else self.kind
        if requested == "same" and self.kind != "same":
            raise VocabMismatchError(f"{{draft_vocab}} same, but {self.why}: use {{draft_vocab}} "
                                     f"auto ({self._use()})", param="draft_vocab")
        if requested == "map" and self.kind == "intersect":
            raise VocabMismatchError(f"{{draft_vocab}} map needs the same text tokens in both "
                                     f"vocabularies, but {self.why}: use {{draft_vocab}} "
                                     "intersect or text", param="draft_vocab")
        if requested == "map" and self.kind == "same":
            return "same"  # the identity map
        return requested

    def _use(self) -> str:
        return (f"it uses {self.method_for('auto')}; `cactus-gguf vocab {self.verifier_path} "
                f"{self.draft_path}` shows every difference")

    def translator(self, verifier: Model, draft: Model) -> Translator:
        """The pair's :class:`Translator` (of these, its loaded models), built on first use."""
        if self._translator is None:
            self._translator = Translator.of(verifier, draft)
        return self._translator


class ForeignDrafter(SamplingDrafter):
    """A draft model with its own vocabulary, drafting for the verifier (module docstring).

    ``mode``: ``intersect`` (also ``map``) or ``text``. The draft context holds the translation of
    the committed tokens (a prefix of it); ``propose`` brings it up to date and samples with its
    own NativeSampler over the draft's V_d (its own random stream, from the request's seed).

    Args:
        ctx: the draft model's context. translator: the pair's Translator. mode: as above.
        sampling: the request's warps. seed: the request's seed. draft_temp: the temperature
            its proposals are sampled at (None: the request's; NativeSampler's ``draft_temp``).
        tokenize: the verifier's tokenizer (text -> ids, no BOS, no special-token parsing), for
            ``text``. n_vocab: V_v, the width of the probability rows ``propose`` returns.
    """

    def __init__(self, ctx: Context, translator: Translator, mode: str, sampling: SamplingParams,
                 seed: int, tokenize: Callable[[str], list[int]], n_vocab: int, *,
                 draft_temp: float | None = None) -> None:
        if mode not in ("intersect", "map", "text"):
            raise ValueError(f"mode must be intersect, map or text, got {mode!r}")
        self.ctx, self.tr, self.mode = ctx, translator, mode
        self.vocab_method, self.shared_v = mode, translator.shared_v
        self.n_vocab = n_vocab
        self.n_logits = min(ctx.n_vocab, len(translator.d2v))
        self.sampler = NativeSampler(ctx.n_vocab, sampling, AcceptanceParams(method="sps"),
                                     (seed + _DRAFT_SEED_OFFSET) % 2**64, draft_temp=draft_temp)
        self._tokenize = tokenize
        # the committed tokens translated so far: their verifier ids, the draft ids, and the
        # number of draft ids up to and including each committed token
        self._src: list[int] = []
        self._seq: list[int] = []
        self._ends: list[int] = []
        self._rows_d = np.zeros((0, ctx.n_vocab), dtype=np.float32)  # p_i over the draft's ids
        self._rows_v = np.zeros((0, n_vocab), dtype=np.float32)  # .. and over the verifier's
        self._text_end: int | None = None  # text: the special token that ended the draft

    # -- the translation of the committed tokens --------------------------------------------------

    def _translate(self, committed: Sequence[int]) -> list[int]:
        """The draft ids of ``committed`` (incremental: only tokens past the longest prefix
        already translated are looked up)."""
        src, n = self._src, 0
        limit = min(len(src), len(committed))
        if src[:limit] == list(committed[:limit]):  # the usual case: the tokens only grew
            n = limit
        else:
            while n < limit and src[n] == committed[n]:
                n += 1
        if n < len(src):
            del src[n:]
            del self._ends[n:]
            del self._seq[self._ends[-1] if self._ends else 0:]
        for t in committed[n:]:
            src.append(int(t))
            self._seq.extend(self.tr.to_draft(int(t)))
            self._ends.append(len(self._seq))
        return self._seq

    # -- the Drafter protocol ----------------------------------------------------------------------

    def reset(self, prompt: Sequence[int], *, reuse: bool, lazy: bool = False) -> int | None:
        seq = self._translate(prompt)
        if len(seq) + 1 > self.ctx.n_ctx or not seq:
            self.ctx.clear()
            return None
        held = seq[:-1]
        self.deferred_prompt = len(held) if lazy else 0
        if lazy:
            n = self.ctx.shared_prefix(held) if reuse else 0
            return self.ctx.sync(held[:n], reuse=True)
        return self.ctx.sync(held, reuse=reuse)

    def resync(self, committed: Sequence[int]) -> bool:
        if self.room(committed) < 1:
            return False
        self.ctx.sync(self._translate(committed)[:-1])
        return True

    def room(self, committed: Sequence[int]) -> int:
        # it decodes the translation plus d_1 .. d_{k-1}
        return self.ctx.n_ctx - len(self._translate(committed)) + 1

    def why_no_room(self, committed: Sequence[int]) -> str:
        return "draft context full"

    def rollback(self, n_keep: int) -> None:
        """Keep at most the translation of the first ``n_keep`` committed tokens."""
        n_keep = min(n_keep, len(self._ends))
        held = self._seq[:self._ends[n_keep - 1]] if n_keep > 0 else []
        self.ctx.forget(self.ctx.shared_prefix(held))

    # -- the draft loop's model (SamplingDrafter) -------------------------------------------------

    def _start(self, committed: Sequence[int]) -> np.ndarray:
        """Bring the context up to the committed tokens' translation; the draft's logits after
        it: float32 [V_d] (a view, valid until the next decode)."""
        seq = self._translate(committed)
        n = self.ctx.forget(min(self.ctx.shared_prefix(seq), len(seq) - 1))
        return self.ctx.decode(seq[n:], n_logits=1)[0]

    def _sampler(self, sampler: NativeSampler) -> NativeSampler:
        return self.sampler  # its own, over V_d

    def _allowed(self, grammar: Constraint | None) -> np.ndarray | None:
        """The packed draft ids that may be sampled: those with a counterpart, and under a
        grammar only those whose counterpart it allows now (``text``: every id; the grammar
        checks the re-tokenised text after)."""
        if self.mode == "text":
            return None
        if grammar is None:
            return self.tr.draftable
        legal_v = np.unpackbits(grammar.allowed().view(np.uint8), bitorder="little")
        d2v = self.tr.d2v
        legal_d = (d2v >= 0) & (legal_v[np.maximum(d2v, 0)] == 1)
        return pack_allowed(legal_d)

    def _to_verifier(self, i: int, token: int) -> tuple[int, float] | None:
        """The hook of a foreign vocabulary. ``intersect`` / ``map``: the verifier's id, and p_i
        scattered into verifier ids (draft ids sharing a verifier id add up). ``text``: the draft
        id itself (its text is re-tokenised after the loop, p one-hot: 1), None at an end of
        generation or another special token (the text ends there)."""
        if self.mode == "text":
            if self.ctx.model.is_eog(token) or int(self.tr.draft.types[token]) not in _TEXT_TYPES:
                self._text_end = token
                return None
            return token, 1.0
        rows_v = self._rows_v
        if len(rows_v) < len(self._rows_d):
            rows_v = self._rows_v = np.zeros((len(self._rows_d), self.n_vocab), dtype=np.float32)
        v, row_d, d2v = int(self.tr.d2v[token]), self._rows_d[i], self.tr.d2v
        kept = np.flatnonzero(row_d)
        rows_v[i].fill(0.0)
        np.add.at(rows_v[i], d2v[kept], row_d[kept])
        return v, float(rows_v[i, v])

    def _proposal(self, n: int) -> np.ndarray | None:
        return None if self.mode == "text" else self._rows_v[:n]

    def propose(self, committed: list[int], plan: DraftPlan, sampler: NativeSampler,
                grammar: Constraint | None = None) -> Draft:
        if self.mode != "text":
            return super().propose(committed, plan, sampler, grammar)
        self._text_end = None
        drafted = super().propose(committed, plan, sampler, None)
        tokens = self._verifier_tokens(b"".join(Translator.token_bytes(self.tr.draft, int(d))
                                                for d in drafted.tokens))[:plan.k]
        end = self._text_end
        if end is not None and len(tokens) < plan.k and self.ctx.model.is_eog(end) \
                and self.tr.d2v[end] >= 0:
            tokens.append(int(self.tr.d2v[end]))  # the verifier's end-of-generation token
        if not tokens:
            return Draft.empty(drafted.n_forwards)
        n = len(tokens)
        return Draft(np.array(tokens, dtype=np.int32), None, ("model",) * n,
                     np.ones(n, dtype=np.float32), drafted.n_forwards)

    def _verifier_tokens(self, data: bytes) -> list[int]:
        """The verifier's tokens for the drafted bytes: its tokenizer's, when they spell the bytes
        back exactly, else the bytes spelled greedily with its own text tokens (a tokenizer that
        adds a leading space, say). An unfinished UTF-8 character at the end is left out."""
        data = data[:_utf8_complete(data)]
        if not data:
            return []
        ids = self._tokenize(data.decode("utf-8", "replace"))
        v = self.tr.verifier
        if b"".join(Translator.token_bytes(v, t) for t in ids) == data:
            return ids
        return self.tr.verifier_spelling.spell(data)
