"""The default rule's top gap in code only (``--top-gap-scope code``, speculative/scope.py): which
text is code, and that a Cactus step uses the prose rule (no top gap) only in a chat answer's
prose, on tiny models loaded by llama.cpp."""
from __future__ import annotations

import math

import pytest

from cactus_gguf.sampling import AcceptanceParams
from cactus_gguf.speculative.scope import CodeScope, chat_opening, opens_chat_answer

from support.harness import make_engine
from support.tiny_gguf import CHAT_TEMPLATE


def test_a_run_of_three_backticks_toggles_code_and_prose_even_split_over_tokens():
    scope = CodeScope(AcceptanceParams("cactus", 1.0, top_gap=0.5))
    seen = []
    for piece in (b"Here", b" `x`", b" `", b"``", b"python\n", b"a = 1\n", b"````", b"\nok",
                  b"```", b"\n"):
        scope.feed(piece)
        seen.append((scope.inside_code, scope.rule.top_gap))
    prose, code = (False, math.inf), (True, 0.5)
    # inline `x` is not a fence; "`" + "``" is one; four backticks close once
    assert seen == [prose, prose, prose, code, code, code, prose, prose, code, code]
    assert scope.rule.delta == 1.0 and scope.rule.method == "cactus"


def test_a_chat_answer_is_a_prompt_ending_with_the_text_the_template_opens_it_with():
    chatml = ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nPROBE"
              "<|im_end|>\n<|im_start|>assistant\n")
    opening = chat_opening(chatml, "PROBE")
    assert opening == "<|im_end|>\n<|im_start|>assistant\n"
    assert chat_opening("no probe here", "PROBE") == ""
    pieces = ["<|im_start|>", "user", "\nhi", "<|im_end|>", "\n", "<|im_start|>", "assistant",
              "\n"]  # token i spells pieces[i]
    detok = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    assert opens_chat_answer(list(range(8)), opening, detok)
    assert not opens_chat_answer(list(range(7)), opening, detok)  # "\n" missing
    assert not opens_chat_answer(list(range(8)) + [2], opening, detok)  # a prefilled answer
    assert not opens_chat_answer(list(range(8)), "", detok)  # no chat template


@pytest.fixture(scope="module")
def chat_pair(tmp_path_factory):
    from support.tiny_gguf import write_llama

    d = tmp_path_factory.mktemp("scope")
    return (write_llama(d / "ver.gguf", seed=11, logit_scale=2.0, chat_template=CHAT_TEMPLATE),
            write_llama(d / "dft.gguf", seed=11, logit_scale=2.0, noise=0.1, noise_seed=12,
                        chat_template=CHAT_TEMPLATE))


def _tokens(engine, prompt, **request):
    return engine.generate(prompt, n_predict=48, seed=2, **request).tokens


def test_a_chat_answers_prose_runs_the_papers_relaxation_and_a_raw_prompt_the_top_gap(chat_pair):
    """The tiny template opens an answer with "\\nassistant:". Its random bytes write no fence in
    these 48 tokens (asserted), so a chat answer is prose throughout: the code-only top gap there
    gives the tokens of no top gap; a raw prompt is code throughout: those of ``scope all``. A top
    gap of 0 (only the verifier's top token relaxed) makes the difference visible on tiny models."""
    gap = {"top_gap": 0.0}
    with make_engine(*chat_pair, temp=1.0, top_k=20) as engine:
        chat = engine.format_chat([{"role": "user", "content": "the cat sat on"}])
        assert chat.endswith("\nassistant:")
        raw = "the cat sat on"
        scoped = _tokens(engine, chat, **gap)
        assert b"```" not in engine.generate(chat, n_predict=48, seed=2, **gap).text.encode()
        assert scoped == _tokens(engine, chat, top_gap=math.inf)
        assert scoped != _tokens(engine, chat, **gap, top_gap_scope="all")  # the gap bites
        assert _tokens(engine, raw, **gap) == _tokens(engine, raw, **gap, top_gap_scope="all")
        assert _tokens(engine, raw, **gap) != _tokens(engine, raw, top_gap=math.inf)
