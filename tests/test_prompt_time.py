"""Where a generation's time goes in its statistics (stats/generation.py): the draft's prompt, decoded late
under ``-k auto`` (a lazy reset: at the first step that drafts), is prompt processing
(``prefill_seconds``, llama-server's ``prompt_ms``), not decoding (``decode_seconds``,
``predicted_ms``) nor drafting (issue 52: ``/infill`` with a large ``input_extra`` reported 8
tokens in ``predicted_ms`` of 87 s). On the tiny pair, the draft's prompt decode slowed by a known
amount."""
from __future__ import annotations

import time

from cactus_gguf.speculative.policy import ForwardCosts

from support.harness import make_engine

PROMPT = "the cat sat on the mat " * 8
SLOW = 1.5  # seconds added to the draft's decode of the prompt


def test_the_drafts_late_prompt_decode_is_prompt_time(tiny_pair, monkeypatch):
    ver, dft = tiny_pair
    with make_engine(ver, dft, temp=0.0, k="auto", method="sps") as eng:
        # costs that make drafting pay from the first step (no probe): the draft's prompt is
        # deferred at the reset and decoded by the first step's drafting
        eng._costs, eng._costs_k = ForwardCosts({1: 0.05, 64: 0.05}, 1e-4), 1 << 20
        n_prompt = len(eng.tokenize(PROMPT))
        decode, slowed = eng.draft.decode, []

        def slow_decode(tokens, *a, **kw):
            if len(tokens) >= n_prompt // 2:  # the prompt, not a step's few tokens
                slowed.append(len(tokens))
                time.sleep(SLOW)
            return decode(tokens, *a, **kw)

        monkeypatch.setattr(eng.draft, "decode", slow_decode)
        s = eng.generate(PROMPT, n_predict=12, seed=0).stats
    assert len(slowed) == 1 and slowed[0] >= n_prompt - 1  # decoded once, late: in a step
    assert s.n_drafted > 0 and s.n_draft_prompt_tokens_reused == 0
    assert s.prefill_seconds >= SLOW
    assert s.decode_seconds < SLOW and s.draft_seconds < SLOW
    assert s.answer_seconds >= SLOW
