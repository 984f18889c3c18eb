"""Where Cactus's top gap applies (``--top-gap-scope code``): in code, not in a chat answer's prose.

The top gap (``--top-gap G``) keeps code answers the verifier's: a draft far below the verifier's
top token is accepted as SpS would (docs/benchmarks.md "Which rule is the default": without it
the answers drift toward the draft's style, longer, with test sections). In a chat answer's prose that
caution costs most of Cactus's gain and buys no quality that was measured, so there every draft
may be relaxed, as in the paper's rule; the protected ends apply everywhere.

What counts as code, from the prompt and the answer's committed text:

- a completion of a raw prompt (not ending with the chat template's generation prompt: source
  code, a prefilled answer such as HumanEval's opened code block): all of it;
- a chat answer (the prompt ends with the generation prompt): inside a fenced block, from a run
  of three or more backticks the answer wrote to the next one.

A step's rows all use the rule of the step's start (the committed text). Each position's law is
a Cactus law under one of the two rules, so the KL budget δ holds at every position either way.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from ..sampling import AcceptanceParams

__all__ = ["CodeScope", "chat_opening", "gap_words", "opens_chat_answer"]

_BACKTICK = 0x60
_FENCE = 3  # backticks in a row that open or close a fenced code block


class CodeScope:
    """The acceptance rule of each step of one chat answer: ``code`` (the request's, top gap
    included) inside fenced code blocks, the same rule without the top gap in prose.

    code: the request's AcceptanceParams (method cactus, a finite top gap). Feed it every
    emitted token's bytes in order (``feed``); ``rule`` is the rule for the next step.
    """

    __slots__ = ("_rules", "_inside", "_run")

    def __init__(self, code: AcceptanceParams) -> None:
        self._rules = (replace(code, top_gap=float("inf")), code)  # (prose, code)
        self._inside = False  # a chat answer starts in prose
        self._run = 0  # backticks at the end of the text so far

    @property
    def inside_code(self) -> bool:
        """Whether the answer's text so far ends inside a fenced code block."""
        return self._inside

    @property
    def rule(self) -> AcceptanceParams:
        """The acceptance rule for the next step: the code rule inside a block, else prose's."""
        return self._rules[self._inside]

    def feed(self, piece: bytes) -> None:
        """Advance over one emitted token's bytes: a run of backticks reaching three toggles
        between prose and code (a fence split over tokens counts once)."""
        for byte in piece:
            if byte == _BACKTICK:
                self._run += 1
                if self._run == _FENCE:
                    self._inside = not self._inside
            else:
                self._run = 0


def chat_opening(rendered: str, probe: str) -> str:
    """The text a chat template writes after a user's message to open the assistant's answer
    (ChatML: ``<|im_end|>\\n<|im_start|>assistant\\n``): ``rendered`` is the template over one
    user message ``probe`` with the generation prompt. "" when the probe is not in the text."""
    at = rendered.rfind(probe)
    return rendered[at + len(probe):] if at >= 0 else ""


def opens_chat_answer(prompt: Sequence[int], opening: str,
                      detokenize: Callable[[Sequence[int]], str]) -> bool:
    """Whether the token ids ``prompt`` end with the text ``opening`` (``chat_opening``), read
    back through ``detokenize`` (special tokens as text): the tokens a prompt ends with depend on
    what precedes them, their text does not. False for an empty ``opening``."""
    if not opening:
        return False
    tail = prompt[-len(opening.encode("utf-8")):]  # every token spells at least one byte
    return detokenize(tail).endswith(opening)


def gap_words(acceptance: AcceptanceParams | None, scope: CodeScope | None) -> str:
    """Where a request's top gap applies, for the ``-v`` rule line ("" without one)."""
    if acceptance is None or acceptance.method != "cactus" or math.isinf(acceptance.top_gap):
        return ""
    if scope is not None:
        return "; the prompt opens a chat answer: the top gap applies in its code blocks only"
    return "; the top gap applies to the whole answer"
