"""The constraint options' values compiled and checked, without a model.

A Request's ``grammar`` (GBNF, or llguidance's Lark after ``%llguidance``), ``json_schema`` or
``json_object`` becomes a :class:`GrammarSpec` through llguidance, tried on a 257-token byte
vocabulary, so a bad grammar is refused (InputError, one line) when the Request is made, before
any model loads.

The option records (records.py) validate through it; sampling/constraints.py turns a GrammarSpec
into the token masks of a generation over a model's vocabulary (and re-exports these names).
"""
from __future__ import annotations

import functools
import json
from typing import Any

from ..errors import InputError

__all__ = ["GrammarSpec", "grammar_spec", "json_matches"]

# Whitespace between JSON tokens: one space, or one or two newlines and up to 20 spaces / tabs of
# indentation (llama.cpp's json-schema-to-grammar SPACE_RULE). Unbounded whitespace (llguidance's
# default) lets a small model pad forever: seen on the Qwen2.5-Coder pair, "{\n" then blanks until
# n_predict. Keywords llguidance does not implement are ignored (lenient), as most schema-guided
# decoders do (format annotations such as "email" are then unchecked).
_JSON_OPTIONS = {"whitespace_pattern": r"(?:\n{1,2}[ \t]{0,20}| ?)", "lenient": True}

def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


class GrammarSpec:
    """A validated constraint: ``kind`` (grammar, json_schema or json_object), its source text and
    the compiled llguidance grammar (``compiled``: str). Made by :func:`grammar_spec`."""

    __slots__ = ("kind", "source", "compiled")

    def __init__(self, kind: str, source: str, compiled: str) -> None:
        self.kind, self.source, self.compiled = kind, source, compiled

    def __repr__(self) -> str:
        return f"GrammarSpec({self.kind}, {len(self.source)} chars)"


@functools.lru_cache(maxsize=64)
def grammar_spec(kind: str, source: str) -> GrammarSpec:
    """Compile and validate a constraint, without any model (so a bad grammar is refused before
    one loads). ``kind``: "grammar" (GBNF text), "json_schema" (JSON text), "json_object" (source
    ignored). Raises InputError (param = kind) with llguidance's reason on one line."""
    from llguidance import LLMatcher, grammar_from

    try:
        if kind == "grammar":
            if not source.strip():
                raise InputError("{grammar} is empty: give a GBNF grammar (a `root ::= ...` rule)",
                                 param="grammar")
            # llama.cpp's convention: a grammar opening with %llguidance is llguidance's Lark
            # (what tool calls use: JSON schemas inside, special tokens by name)
            compiled = (LLMatcher.grammar_from_lark(source) if _is_lark(source)
                        else grammar_from("gbnf", source))
        elif kind in ("json_schema", "json_object"):
            schema = source if kind == "json_schema" else '{"type":"object"}'
            compiled = LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        else:
            raise ValueError(f"unknown constraint kind {kind!r}")
    except InputError:
        raise
    except ValueError as e:
        raise InputError(f"{{{kind}}} is invalid: {_one_line(e)}", param=kind) from None
    what = "GBNF grammar" if kind == "grammar" else "JSON schema"
    is_error, messages = LLMatcher.validate_grammar_with_warnings(compiled)
    if is_error:
        raise InputError(f"{{{kind}}}: the {what} is invalid: {_one_line(messages[0])}",
                         param=kind)
    problem = _probe(compiled)
    if problem and _is_lark(source) and "unknown special token" in problem:
        problem = None  # it names the model's special tokens: the probe's bytes have none
    if problem:
        raise InputError(f"{{{kind}}}: the {what} {problem}", param=kind)
    return GrammarSpec(kind, source, compiled)


def _is_lark(source: str) -> bool:
    return source.lstrip().startswith("%llguidance")


class _ByteVocabulary:
    """A 257-token vocabulary (the 256 bytes and an end token) to try a grammar on before any
    model is loaded."""

    eos_token_id, bos_token_id = 256, None
    tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"]
    special_token_ids = [256]

    def __call__(self, data: bytes) -> list[int]:
        return list(data)


@functools.lru_cache(maxsize=1)
def _byte_tokenizer():
    from llguidance import LLTokenizer, TokenizerWrapper

    return LLTokenizer(TokenizerWrapper(_ByteVocabulary()))


def json_matches(schema: Any, value: Any) -> bool:
    """Whether JSON data ``value`` is valid under the JSON Schema ``schema`` as the grammar
    engine enforces it (``--json-schema``'s keywords and leniency): its compact text walked byte
    by byte. False for a schema the engine refuses. Tool calls check what no grammar bound."""
    from llguidance import LLMatcher

    try:
        spec = grammar_spec("json_schema", json.dumps(schema))
    except InputError:
        return False
    m = LLMatcher(_byte_tokenizer(), spec.compiled, log_level=0)
    data = json.dumps(value, ensure_ascii=False).encode("utf-8")
    return all(m.consume_token(b) for b in data) and m.is_accepting()


def _probe(compiled: str, steps: int = 4) -> str | None:
    """What stops the grammar engine from following a grammar that compiles, found by walking a
    few bytes into it (always the lowest allowed byte): a phrase, or None. Catches grammars
    that match nothing (``root ::= root``) and ones whose every sentence is infinite
    (``root ::= "a" root``), which would otherwise fail mid-generation."""
    import numpy as np
    from llguidance import LLMatcher

    m = LLMatcher(_byte_tokenizer(), compiled, log_level=0)
    for _ in range(steps):
        mask = np.frombuffer(m.compute_bitmask(), dtype=np.uint8) if not m.is_error() else None
        if m.is_error():
            break
        allowed = np.flatnonzero(np.unpackbits(mask, bitorder="little")[:256])
        if allowed.size == 0:
            return None  # only the end is allowed: a complete sentence
        if not m.consume_token(int(allowed[0])):
            break
    if not m.is_error():
        return None
    why = _one_line(m.get_error())
    if why.startswith("NoExtensionBias"):
        return "matches no text (every rule expands forever): give it an alternative that ends"
    if "Too many items" in why:
        return ("never lets the output end (every sentence is infinite), which the grammar "
                "engine cannot follow: add an alternative that ends, e.g. `root ::= \"a\" root | "
                "\"a\"`")
    return f"cannot be followed by the grammar engine: {why.split('<state>')[0].strip()}"
