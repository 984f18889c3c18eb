"""Grammar constraints: the allowed-token masks of a GBNF- or JSON-schema-constrained generation.

The grammar engine is llguidance (a Rust library with Python bindings: the token masks of a
context-free grammar over a tokenizer's byte strings, and rollback). It was chosen by measurement on
the Qwen2 vocabulary (V = 151,936), against llama.cpp's own grammar sampler through
llama-cpp-python: 0.05 ms per mask (median) against 36 ms, rollback and copy ~0.02 ms, JSON schema
bounds (``minimum``...) kept where llama-cpp-python's schema converter drops them. xgrammar needs
torch. See docs/server.md "Structured output".

How a constrained step uses it (speculative/step.py), for committed tokens t_0 .. t_{L-1}:

    row 0           = the mask after t_0 .. t_{L-1} (the committed state)
    push(d_i)       the draft samples d_i under row i-1; the state advances along the drafted path
                    and row i = the mask after d_1 .. d_i
    verify          rows 0 .. n mask verifier rows 0 .. n (float32 [n+1, V] logits): the acceptance
                    test sees p and q over the same legal set, so the residual and the bonus token
                    are legal by construction
    commit(a, x)    roll back the n - a rejected drafts, then advance by the emitted token x

A mask is ``uint32 [ceil(V / 32)]``: bit ``i % 32`` of word ``i // 32`` set = token ``i`` allowed (the
native helper's layout, read in place). End-of-generation tokens are allowed only where the grammar
accepts: the generation can end only with a complete sentence of the grammar.

Constraint kinds (``Request`` fields): ``grammar`` (llama.cpp GBNF text, or llguidance's Lark
after ``%llguidance``, as llama.cpp takes it), ``json_schema`` (JSON Schema text), ``json_object``
(any JSON object).
"""
from __future__ import annotations

import time
import warnings
from typing import Any

import numpy as np

from ..errors import EngineError
# the constraint options' compilation (no model needed), re-exported: the options validate through it
from ..options.grammar import (_JSON_OPTIONS, GrammarSpec, _byte_tokenizer,  # noqa: F401
                               _one_line, grammar_spec, json_matches)

__all__ = ["GrammarSpec", "grammar_spec", "Constraint", "tokenizer_for", "mask_words", "json_matches"]


def mask_words(n_vocab: int) -> int:
    """uint32 words per allowed-token mask row: ceil(n_vocab / 32)."""
    return (n_vocab + 31) // 32


def tokenizer_for(model) -> Any:
    """llguidance's tokenizer for a loaded model's vocabulary (a Model of llama/model.py): every
    token's bytes from the GGUF, every end-of-generation id as its EOS. About 1.5 s at V = 152k:
    build it once per model."""
    import llama_cpp
    from llguidance.llamacpp import lltokenizer_from_vocab

    eog = [t for t in range(model.n_vocab) if llama_cpp.llama_vocab_is_eog(model.vocab, t)]
    with warnings.catch_warnings():  # the helper calls a llama-cpp-python alias deprecated in
        warnings.simplefilter("ignore", DeprecationWarning)  # 0.3.x, once per token
        return lltokenizer_from_vocab(model.vocab, n_vocab=model.n_vocab,
                                      eos_token=eog or model.eos)


class Constraint:
    """The grammar state of one generation and its masks, ``uint32 [k_max + 1, ceil(V / 32)]``.

    Lifecycle per step: :meth:`start` (row 0 for the committed state), :meth:`push` per drafted
    token (advances; row i for the state after i drafts), :meth:`rows` for the verification,
    :meth:`commit` (roll back the rejected drafts, advance by the emitted token). ``seconds``
    accumulates the time spent in the grammar engine (masks, advances, rollbacks).

    Raises EngineError when the grammar engine fails (a token the mask allowed but the matcher
    refuses: a bug, never silent).
    """

    def __init__(self, spec: GrammarSpec, tokenizer, n_vocab: int, is_eog) -> None:
        from llguidance import LLMatcher

        self.spec = spec
        self._matcher = LLMatcher(tokenizer, spec.compiled, log_level=0)
        if self._matcher.is_error():
            self._fail("start")
        self.n_vocab = n_vocab
        self._words = mask_words(n_vocab)
        self._masks = np.zeros((1, self._words), dtype=np.uint32)
        self._is_eog = is_eog
        self.pushed = 0     # drafted tokens the state has advanced by this step
        self._consumed = 0  # ... of which the matcher consumed (all but an end-of-generation one)
        self.seconds = 0.0  # time in the grammar engine
        self._ended = False  # an end-of-generation token was pushed (the grammar is complete)

    # -- the step ----------------------------------------------------------------------------------

    def start(self, k_max: int) -> None:
        """Begin a step that drafts at most ``k_max`` tokens: row 0 = the committed state's mask."""
        if self._masks.shape[0] < k_max + 1:
            self._masks = np.zeros((k_max + 1, self._words), dtype=np.uint32)
        self.pushed = self._consumed = 0
        t = time.perf_counter()
        self._fill(0)
        self.seconds += time.perf_counter() - t

    def allowed(self, i: int | None = None) -> np.ndarray:
        """Row ``i`` (default: the current one, ``pushed``): uint32 [ceil(V / 32)], a view."""
        return self._masks[self.pushed if i is None else i]

    def allows(self, token: int, i: int | None = None) -> bool:
        """Whether row ``i`` (default: the current) allows ``token``."""
        row = self.allowed(i)
        return bool((int(row[token >> 5]) >> (token & 31)) & 1)

    def push(self, token: int) -> bool:
        """Advance along the drafted path by ``token`` if the current row allows it (then the next
        row is computed); False (nothing changes) if it does not."""
        if self._ended or not self.allows(token):
            return False
        t = time.perf_counter()
        self._consume(token, "a drafted token")
        self.pushed += 1
        self._fill(self.pushed)
        self.seconds += time.perf_counter() - t
        return True

    def extend(self, tokens: np.ndarray, n: int) -> int:
        """Push ``tokens[:n]`` in order, up to the first one the grammar refuses; how many went."""
        for i in range(n):
            if not self.push(int(tokens[i])):
                return i
        return n

    def rows(self, n: int) -> np.ndarray:
        """The masks of verifier rows 0 .. n: uint32 [n + 1, ceil(V / 32)], C-contiguous."""
        return self._masks[:n + 1]

    def commit(self, n_accepted: int, token: int) -> None:
        """End the step: keep the first ``n_accepted`` pushed drafts, then advance by the emitted
        ``token`` (the residual or bonus token; legal by construction)."""
        t = time.perf_counter()
        if n_accepted < self.pushed:  # an end-of-generation draft is always the last one pushed
            self._ended = False
            back = self._consumed - n_accepted
            if back > 0 and not self._matcher.rollback(back):
                self._fail("rollback")
        self.pushed = self._consumed = 0
        if not self._ended:
            self._consume(token, "the emitted token")
        self.seconds += time.perf_counter() - t

    # -- state -----------------------------------------------------------------------------------

    def is_accepting(self) -> bool:
        """The committed output is a complete sentence of the grammar."""
        return self._ended or self._matcher.is_accepting()

    def copy_state_for_test(self):
        """A deep copy of the grammar matcher (tests compare states)."""
        return self._matcher.deep_copy()

    def _fill(self, i: int) -> None:
        row = self._masks[i]
        if self._ended:  # after an end-of-generation token nothing follows: any row will do
            row.fill(0xFFFFFFFF)
            return
        self._matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if self._matcher.is_error():
            self._fail("mask")

    def _consume(self, token: int, what: str) -> None:
        if self._is_eog(token):
            # An end-of-generation token: allowed only where the grammar accepts (the mask said
            # so); the generation ends there, so the matcher need not consume it.
            if not self._matcher.is_accepting():
                raise EngineError(f"grammar engine: {what} {token} ends the output where the "
                                  "grammar does not accept")
            self._ended = True
            return
        if not self._matcher.consume_token(token):
            self._fail(f"advance by {what} {token}")
        self._consumed += 1

    def _fail(self, where: str) -> None:
        why = _one_line(self._matcher.get_error()) or "refused"
        raise EngineError(f"grammar engine failed ({where}): {why}")
