"""Log-probabilities of the emitted tokens (a request's ``n_probs``; speculative/logprobs.py), on
the tiny pair (V = 281, float32): each token's value is the verifier's own at its position, read
from the verification batch's row, accepted drafts included; checked against a fresh verifier
decode of the whole output and the NumPy reference warp."""
from __future__ import annotations

import math

import numpy as np
import pytest

from cactus_gguf.errors import InputError
from cactus_gguf.sampling import reference
from cactus_gguf.server.logprobs import llama_probs, openai_chat
from cactus_gguf.speculative.logprobs import Alternative, TokenLogprob, top_ids

from support.harness import make_engine

PROMPT = "the cat sat on the mat"
WARPS = dict(temp=0.9, top_k=20, top_p=0.95, min_p=0.02)


@pytest.fixture(scope="module")
def engine(tiny_pair):
    ver, dft = tiny_pair
    with make_engine(ver, dft, k=4, **WARPS) as eng:
        yield eng


def verifier_rows(engine, tokens: list[int]) -> np.ndarray:
    """float64 [len(tokens), V]: row i = the verifier's logits before tokens[i], from one decode of
    the prompt and the output (batch shapes change float32 logits by ~1e-5 here)."""
    prompt = engine.tokenize(PROMPT)
    engine.reset()
    rows = engine.verifier.decode(prompt + tokens, n_logits=len(tokens) + 1)
    out = rows[:len(tokens)].astype(np.float64)
    engine.reset()
    return out


def test_top_ids_are_the_largest_above_the_floor_ties_to_the_lower_id():
    v = np.array([0.1, 0.3, 0.0, 0.3, 0.2, 0.0], dtype=np.float32)
    assert top_ids(v, 3, 0.0).tolist() == [1, 3, 4]
    assert top_ids(v, 10, 0.0).tolist() == [1, 3, 4, 0]  # only the 4 above the floor
    assert top_ids(v, 0, 0.0).tolist() == []
    assert top_ids(np.array([-np.inf, 2.0, 2.0]), 5, -np.inf).tolist() == [1, 2]


def test_each_emitted_token_has_the_verifiers_warped_log_probability(engine):
    r = engine.generate(PROMPT, n_predict=24, seed=5, n_probs=4)
    assert r.stats.n_accepted > 0  # accepted drafts are among the tokens checked
    assert len(r.logprobs) == len(r.tokens) == 24
    rows = verifier_rows(engine, r.tokens)
    V = rows.shape[1]
    for i, (tok, lp) in enumerate(zip(r.tokens, r.logprobs)):
        q = reference.warp(rows[i], V, 0.9, 20, 0.95, 0.02).astype(np.float64)
        assert lp.token == tok and lp.piece == engine.verifier.model.token_to_piece(tok)
        assert q[tok] > 0 and math.isfinite(lp.logprob)
        assert lp.logprob == pytest.approx(math.log(q[tok]), abs=1e-3), i
        want = top_ids(q, 4, 0.0)
        assert [a.token for a in lp.top] == want.tolist(), i
        assert [a.logprob for a in lp.top] == pytest.approx(np.log(q[want]).tolist(), abs=1e-3)
        assert lp.top[0].logprob >= lp.logprob - 1e-6  # the most likely first
    # reading them draws no random number: the same seed gives the same tokens without them
    again = engine.generate(PROMPT, n_predict=24, seed=5)
    assert again.tokens == r.tokens and again.logprobs is None


def test_raw_log_probabilities_are_the_unwarped_log_softmax(engine):
    r = engine.generate(PROMPT, n_predict=12, seed=2, n_probs=3, post_sampling_probs=False)
    rows = verifier_rows(engine, r.tokens)
    for i, (tok, lp) in enumerate(zip(r.tokens, r.logprobs)):
        x = rows[i]
        logsoftmax = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
        assert lp.logprob == pytest.approx(logsoftmax[tok], abs=1e-3)
        assert [a.token for a in lp.top] == top_ids(x, 3, -np.inf).tolist()
        assert len(lp.top) == 3  # every token has a raw probability: always n alternatives


def test_greedy_tokens_have_log_probability_zero_and_no_other_alternative(engine):
    r = engine.generate(PROMPT, n_predict=10, seed=1, temperature=0.0, n_probs=5, method="sps")
    assert all(lp.logprob == 0.0 and [a.token for a in lp.top] == [lp.token]
               for lp in r.logprobs)  # q is one-hot: the warp keeps one token


def test_every_rule_and_the_verifier_alone_report_one_per_token(engine):
    for overrides in (dict(method="none"), dict(method="ears"), dict(method="typical"),
                      dict(method="topk"), dict(method="greedy"), dict(drafter="ngram"),
                      dict(method="cactus", budget="output", protect_ends=0.1, top_gap=0.5)):
        r = engine.generate(PROMPT, n_predict=16, seed=3, n_probs=0, **overrides)
        assert len(r.logprobs) == len(r.tokens), overrides
        assert all(math.isfinite(lp.logprob) and lp.logprob <= 0 and lp.top == ()
                   for lp in r.logprobs), overrides


def test_under_a_grammar_only_legal_tokens_are_alternatives(engine):
    r = engine.generate(PROMPT, n_predict=6, seed=4, n_probs=10, json_object=True)
    first = r.logprobs[0]  # a JSON object starts with "{" (or whitespace before it)
    assert first.top and all(a.piece.lstrip()[:1] in (b"{", b"") for a in first.top), first.top


def test_stream_chunks_carry_their_tokens_and_log_probabilities(engine):
    stream = engine.stream(PROMPT, n_predict=20, seed=6, n_probs=2, stop="zz")
    chunks = list(stream.chunks())
    result = stream.result
    got = [t for c in chunks for t in c.tokens]
    assert got == result.tokens[:len(got)]  # in order; held-back text comes with a later chunk
    assert [lp for c in chunks for lp in c.logprobs] == result.logprobs[:len(got)]
    plain = engine.stream(PROMPT, n_predict=5, seed=6)
    assert all(c.logprobs == () and c.tokens for c in plain.chunks())


def test_bad_n_probs_are_refused():
    from cactus_gguf.options import Request

    for bad in (-1, 257, 2.5, True):
        with pytest.raises(InputError) as e:
            Request(n_probs=bad)
        assert e.value.param == "n_probs"


# ---- the tokens of the text returned (issue 52 item 6) -------------------------------------------

def test_tokens_within_counts_the_tokens_wholly_inside_a_cut_text():
    from cactus_gguf.speculative.session import tokens_within

    pieces = [b"ab", b"\xc3", b"\xa9x", b"y"]  # "é" spans the 2nd and 3rd tokens
    assert [tokens_within(pieces, n) for n in range(7)] == [0, 0, 1, 1, 3, 4, 4]
    assert tokens_within([b" cat", b" sat"], len(" cat ")) == 1  # " sat" straddles the cut
    assert tokens_within([b"\xff", b"a"], 1) == 1  # a bad byte is one character, U+FFFD


@pytest.fixture(scope="module")
def scripted(tmp_path_factory):
    """A bigram pair (the draft is the verifier: every draft accepted) spelling
    " cat sat on mat" after "▁the", then EOS."""
    from support.tiny_gguf import EOS, WORDS, chain, write_llama

    the, cat, sat, on, mat = (259 + WORDS.index(w) for w in ("▁the", "▁cat", "▁sat", "▁on",
                                                              "▁mat"))
    path = write_llama(tmp_path_factory.mktemp("script") / "s.gguf", seed=3,
                       bigram=chain([the, cat, sat, on, mat, EOS]))
    with make_engine(path, path, k=4, method="sps", temp=0.0) as eng:
        yield eng, [1, the]


@pytest.mark.parametrize("stop,text,pieces", [
    ("sat", " cat ", [b" cat"]),           # the cut splits " sat": it is not the text's
    (" on", " cat sat", [b" cat", b" sat"]),  # the cut falls between two tokens
    ("ca", " ", []),                        # the first token straddles the cut
])
def test_logprobs_stop_with_the_text_before_a_stop_string(scripted, stop, text, pieces):
    """Issue 52 item 6: the stop string's tokens were among the log-probabilities (their text
    joined to ... "sat"); now they cover the tokens of the text returned, streamed or not."""
    eng, prompt = scripted
    r = eng.generate(prompt, n_predict=8, seed=1, stop=stop, n_probs=1)
    assert r.text == text and r.stop_reason == "stop"
    assert [lp.piece for lp in r.logprobs] == pieces
    assert len(r.tokens) > len(pieces)  # the tokens themselves still hold the stop's
    stream = eng.stream(prompt, n_predict=8, seed=1, stop=stop, n_probs=1)
    chunks = list(stream.chunks())
    assert [lp.piece for c in chunks for lp in c.logprobs] == pieces
    assert stream.result.logprobs == r.logprobs


def test_a_lone_byte_of_a_longer_character_is_written_as_llama_server_writes_it():
    """llama-server's token text for a one-byte piece of a multi-byte UTF-8 character is
    ``byte: \\xNN``; ASCII and whole characters are their text; ``bytes`` is always exact."""
    entries = [TokenLogprob(1, b"\xe2", -0.5, (Alternative(1, b"\xe2", -0.5),
                                               Alternative(2, b"a", -1.0))),
               TokenLogprob(3, "é".encode(), -0.25, ())]
    chat = openai_chat(entries)["content"]
    assert [e["token"] for e in chat] == ["byte: \\xe2", "é"]
    assert chat[0]["bytes"] == [0xE2] and chat[1]["bytes"] == [0xC3, 0xA9]
    assert [a["token"] for a in chat[0]["top_logprobs"]] == ["byte: \\xe2", "a"]
    assert [e["token"] for e in llama_probs(entries, post_sampling=False)] == ["byte: \\xe2", "é"]
