"""A map between two GGUFs' vocabularies, from their token strings alone (no model loaded).

Which draft token is which verifier token, the first step of speculating with a draft whose
tokenizer is not the verifier's (docs/models.md "Foreign drafts"). Built once per pair from the GGUF
metadata (``tokenizer.ggml.tokens`` / ``token_type`` / ``merges`` and the special-token ids) and
cached under ``~/.cache/cactus-gguf/vocab-maps``.

Terms. V_v, V_d: the verifier's and the draft's vocabulary sizes. A *text token* (llama.cpp token
type normal, byte or user-defined) stands for a byte string: its piece decoded from the tokenizer's
byte-level alphabet (GPT-2 style BPE: ``Ġ`` is a space; SentencePiece: ``▁`` is a space and
``<0x0A>`` one byte). Two text tokens are the same token when their bytes are equal. A *special
token* (type control) is matched by role first (BOS, EOS, EOT, EOM, padding, unknown) and then by
its exact text (chat markers such as ``<|im_start|>``). Unused and undefined ids (padding tails)
map to nothing.

The method the pair needs (``VocabMap.method``):

- ``same``: every id means the same in both (today's path; padding tails aside);
- ``map``: the same text tokens and merges, but specials or ids differ (a fine-tune's extra special
  tokens): draft ids are translated, no text re-encoded;
- ``intersect``: the tokenizers differ (other merges or text tokens); drafting must be restricted to
  the vocabularies' intersection (Timor et al., ICML 2025, "token-level intersection") or go
  through text.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..errors import InputError

__all__ = ["VocabInfo", "VocabMap", "read_vocab", "build_map", "vocab_map", "describe"]

# llama.cpp's token types (gguf TokenType / llama_vocab.h LLAMA_TOKEN_TYPE_*)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_TEXT_TYPES = (_NORMAL, _BYTE, _USER_DEFINED)
# the special-token roles of the GGUF metadata (tokenizer.ggml.<role>_token_id)
ROLES = ("bos", "eos", "eot", "eom", "padding", "unknown")
_FORMAT = 2  # version of the cached map's layout (2: every text id mapped, byte tokens to bytes)


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character each byte is written as -> the byte
    (printable bytes stand for themselves; the others are shifted to code points from 256 up)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def piece_bytes(piece: str, model: str, token_type: int) -> bytes:
    """The bytes a text token stands for. ``model``: the GGUF's ``tokenizer.ggml.model`` (``gpt2``
    byte-level BPE, ``llama`` SentencePiece; any other: the piece's UTF-8). User-defined tokens are
    stored as plain text by every converter."""
    if token_type == _USER_DEFINED:
        return piece.encode("utf-8")
    if model == "gpt2":
        dec = _byte_decoder()
        if all(c in dec for c in piece):
            return bytes(dec[c] for c in piece)
        return piece.encode("utf-8")
    if model == "llama":
        if token_type == _BYTE and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode("utf-8")
    return piece.encode("utf-8")


@dataclass(frozen=True)
class VocabInfo:
    """One GGUF's vocabulary, as its metadata gives it.

    pieces: str [V] (the stored token strings); types: int32 [V] (llama.cpp token types);
    model: ``tokenizer.ggml.model``; specials: role -> id for the roles the file sets;
    merges_sha256: a hash of the BPE merges ("" when the file has none); sha256: a hash of all of
    it (the part of the file the map depends on)."""

    path: str
    model: str
    pieces: tuple[str, ...]
    types: np.ndarray
    specials: dict[str, int]
    merges_sha256: str
    sha256: str

    @property
    def n_vocab(self) -> int:
        return len(self.pieces)


def _strings(field_) -> list[str]:
    """A GGUF string-array field's items, decoded (its raw parts: much faster than contents())."""
    return [bytes(field_.parts[i]).decode("utf-8", "replace") for i in field_.data]


def read_vocab(path: str | os.PathLike[str]) -> VocabInfo:
    """Read a GGUF's vocabulary metadata with the ``gguf`` package (memory-mapped; no weights read).

    Raises InputError for a file that is not a readable GGUF or has no token list."""
    import gguf

    try:
        reader = gguf.GGUFReader(os.fspath(path))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable GGUF file ({e}): give a .gguf model file") from None
    fields = reader.fields
    if "tokenizer.ggml.tokens" not in fields:
        raise InputError(f"{path}: the GGUF has no tokenizer.ggml.tokens: it carries no vocabulary")
    pieces = _strings(fields["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.token_type" in fields:
        tt = fields["tokenizer.ggml.token_type"]
        types = np.array([int(tt.parts[i][0]) for i in tt.data], dtype=np.int32)
    else:
        types = np.full(len(pieces), _NORMAL, dtype=np.int32)
    model = (bytes(fields["tokenizer.ggml.model"].parts[-1]).decode()
             if "tokenizer.ggml.model" in fields else "")
    specials = {}
    for role in ROLES:
        key = f"tokenizer.ggml.{role}_token_id"
        if key in fields:
            specials[role] = int(fields[key].parts[-1][0])
    h = hashlib.sha256()
    if "tokenizer.ggml.merges" in fields:
        for m in _strings(fields["tokenizer.ggml.merges"]):
            h.update(m.encode() + b"\n")
        merges = h.hexdigest()
    else:
        merges = ""
    whole = hashlib.sha256(json.dumps([model, pieces, types.tolist(), specials, merges],
                                      ensure_ascii=False).encode())
    return VocabInfo(os.fspath(path), model, tuple(pieces), types, specials, merges,
                     whole.hexdigest())


@dataclass(frozen=True)
class VocabMap:
    """Draft ids -> verifier ids.

    draft_to_verifier: int32 [V_d], the verifier id of each draft id, -1 where the verifier has no
    such token (and for the draft's unused ids); method: ``same`` / ``map`` / ``intersect`` (module
    docstring); n_text_shared: text tokens in both; n_text_draft / n_text_verifier: text tokens of
    each; specials: role -> (draft id, verifier id) for the roles either sets; draft_only /
    verifier_only: the first few text tokens each way that have no counterpart, as (id, text)
    pairs (the token's bytes as UTF-8, other bytes as \\x escapes)."""

    method: str
    draft_to_verifier: np.ndarray
    n_vocab_draft: int
    n_vocab_verifier: int
    n_text_draft: int
    n_text_verifier: int
    n_text_shared: int
    same_merges: bool
    specials: dict[str, tuple[int | None, int | None]]
    draft_only: list[tuple[int, str]] = field(default_factory=list)
    verifier_only: list[tuple[int, str]] = field(default_factory=list)

    @property
    def draft_coverage(self) -> float:
        """Share of the draft's text tokens the verifier has."""
        return self.n_text_shared / self.n_text_draft if self.n_text_draft else 0.0

    def to_dict(self) -> dict:
        return {"method": self.method, "n_vocab_draft": self.n_vocab_draft,
                "n_vocab_verifier": self.n_vocab_verifier, "n_text_draft": self.n_text_draft,
                "n_text_verifier": self.n_text_verifier, "n_text_shared": self.n_text_shared,
                "draft_coverage": self.draft_coverage, "same_merges": self.same_merges,
                "specials": {r: list(v) for r, v in self.specials.items()},
                "draft_only": [list(x) for x in self.draft_only],
                "verifier_only": [list(x) for x in self.verifier_only]}


def _keys(v: VocabInfo) -> tuple[dict[bytes, int], dict[tuple[bytes, bool], int], dict[str, int]]:
    """text bytes -> the id a tokenizer would use for them (the first id that is not a
    byte-fallback token, else the byte token); (text bytes, is a byte token) -> first id; control
    text -> id."""
    text: dict[bytes, int] = {}
    exact: dict[tuple[bytes, bool], int] = {}
    control: dict[str, int] = {}
    for i, (piece, t) in enumerate(zip(v.pieces, v.types.tolist())):
        if t in _TEXT_TYPES:
            b = piece_bytes(piece, v.model, t)
            exact.setdefault((b, t == _BYTE), i)
            if t != _BYTE:
                text.setdefault(b, i)
        elif t == _CONTROL:
            control.setdefault(piece, i)
    for (b, _), i in exact.items():  # bytes only a byte-fallback token spells
        text.setdefault(b, i)
    return text, exact, control


def build_map(verifier: VocabInfo, draft: VocabInfo, n_examples: int = 5) -> VocabMap:
    """The map from ``draft``'s ids to ``verifier``'s (see :class:`VocabMap`). Pure."""
    v_text, v_exact, v_control = _keys(verifier)
    d_text, d_exact, d_control = _keys(draft)
    d2v = np.full(draft.n_vocab, -1, dtype=np.int32)
    # every draft text token: the verifier's token of the same bytes and kind (a byte-fallback
    # token for a byte-fallback token), else the one its tokenizer would use for those bytes
    for (b, is_byte), i in d_exact.items():
        d2v[i] = v_exact.get((b, is_byte), v_text.get(b, -1))
    # specials: by role, then by text
    specials: dict[str, tuple[int | None, int | None]] = {}
    for role in ROLES:
        d, v = draft.specials.get(role), verifier.specials.get(role)
        if d is None and v is None:
            continue
        specials[role] = (d, v)
    for text, i in d_control.items():
        if text in v_control:
            d2v[i] = v_control[text]
    for role, (d, v) in specials.items():
        if d is not None and v is not None and 0 <= d < draft.n_vocab \
                and draft.types[d] == _CONTROL and d2v[d] < 0:
            d2v[d] = v
    n_shared = int(sum(1 for b in d_text if b in v_text))
    d_only = [(i, b.decode("utf-8", "backslashreplace")) for b, i in
              sorted(d_text.items(), key=lambda x: x[1]) if b not in v_text][:n_examples]
    v_only = [(i, b.decode("utf-8", "backslashreplace")) for b, i in
              sorted(v_text.items(), key=lambda x: x[1]) if b not in d_text][:n_examples]
    same_text = n_shared == len(d_text) == len(v_text)
    same_merges = draft.merges_sha256 == verifier.merges_sha256 and draft.model == verifier.model
    used = np.flatnonzero(np.isin(draft.types, (*_TEXT_TYPES, _CONTROL)))
    identity = bool(np.all(d2v[used] == used)) and all(
        d == v for d, v in specials.values() if d is not None and v is not None) and \
        len(d_control) == len(v_control)
    if same_text and same_merges and identity:
        method = "same"
    elif same_text and same_merges:
        method = "map"
    else:
        method = "intersect"
    return VocabMap(method, d2v, draft.n_vocab, verifier.n_vocab, len(d_text), len(v_text),
                    n_shared, same_merges, specials, d_only, v_only)


def _cache_dir() -> Path:
    from ..registry import cache_dir

    return cache_dir() / "vocab-maps"


def _file_key(path: str | os.PathLike[str]) -> str:
    """The file's sha256 where the model cache has verified it, else its path, size and mtime
    (hashing a multi-GB file on every run would cost more than reading its vocabulary)."""
    from ..registry.cache import verified_sha256

    sha = verified_sha256(path)
    if sha:
        return sha
    st = os.stat(path)
    return hashlib.sha256(f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}".encode()
                          ).hexdigest()


def vocab_map(verifier_path: str | os.PathLike[str], draft_path: str | os.PathLike[str]) -> VocabMap:
    """:func:`build_map` of two GGUF files, cached by both files' keys (:func:`_file_key`).

    Raises InputError (see :func:`read_vocab`)."""
    for p in (verifier_path, draft_path):
        if not os.path.isfile(p):
            raise InputError(f"{p}: no such file: give a GGUF model path")
    key = hashlib.sha256(f"{_FORMAT}\0{_file_key(verifier_path)}\0{_file_key(draft_path)}"
                         .encode()).hexdigest()[:32]
    cached = _cache_dir() / f"{key}.npz"
    if cached.is_file():
        try:
            with np.load(cached, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                return VocabMap(meta["method"], z["draft_to_verifier"], meta["n_vocab_draft"],
                                meta["n_vocab_verifier"], meta["n_text_draft"],
                                meta["n_text_verifier"], meta["n_text_shared"],
                                meta["same_merges"],
                                {r: tuple(v) for r, v in meta["specials"].items()},
                                [tuple(x) for x in meta["draft_only"]],
                                [tuple(x) for x in meta["verifier_only"]])
        except (OSError, ValueError, KeyError):
            pass  # a damaged cache entry: build it again
    vm = build_map(read_vocab(verifier_path), read_vocab(draft_path))
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f"{cached.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, draft_to_verifier=vm.draft_to_verifier,
                 meta=np.array(json.dumps(vm.to_dict(), ensure_ascii=False)))
        os.replace(tmp, cached)
    except OSError:
        pass  # a read-only cache: the map is simply built again next time
    return vm


_METHOD_TEXT = {
    "same": "same: every id means the same token; the pair speculates as it is",
    "map": "map: the same text tokens and merges, other special tokens or ids; draft ids are "
           "translated (`--draft-vocab auto` uses map)",
    "intersect": "intersect: different tokenizers; `--draft-vocab auto` drafts only the shared "
                 "tokens (intersect), `--draft-vocab text` re-tokenises the draft's text instead "
                 "(docs/models.md \"Foreign drafts\")",
}


def _shown(text: str) -> str:
    """A token's text quoted for the report: a byte that is not UTF-8 is already written ``\\x80``
    (build_map's backslashreplace), so only unprintable characters are escaped here (repr would
    escape that backslash a second time: ``'\\\\x80'``)."""
    return "'" + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text) + "'"


def describe(vm: VocabMap, verifier: str, draft: str) -> list[str]:
    """The report ``cactus-gguf vocab`` prints, as lines."""
    lines = [f"verifier {verifier}: {vm.n_vocab_verifier} ids, {vm.n_text_verifier} text tokens",
             f"draft    {draft}: {vm.n_vocab_draft} ids, {vm.n_text_draft} text tokens",
             f"shared text tokens: {vm.n_text_shared} ({vm.draft_coverage:.1%} of the draft's); "
             f"merges {'the same' if vm.same_merges else 'differ'}"]
    for role, (d, v) in vm.specials.items():
        lines.append(f"  {role:8s} draft {d if d is not None else '-':>7}  verifier "
                     f"{v if v is not None else '-':>7}")
    if vm.draft_only:
        lines.append("draft only: " + ", ".join(f"{i} {_shown(p)}" for i, p in vm.draft_only))
    if vm.verifier_only:
        lines.append("verifier only: " + ", ".join(f"{i} {_shown(p)}" for i, p in vm.verifier_only))
    lines.append("method: " + _METHOD_TEXT[vm.method])
    return lines
