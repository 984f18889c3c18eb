"""Issue #6, kind 6: termination and text.

Scripted *bigram* GGUFs (tests/support/tiny_gguf.py, write_llama(bigram=...)) make llama.cpp emit
chosen tokens, so each case is forced deterministically: an end-of-generation token inside an
accepted block ends the output there; a drafted EOS that the verifier rejects does not end it; stop
strings match across token boundaries and never reach a streamed chunk; chunks hold whole UTF-8
characters only and join to exactly the final text.
"""
from __future__ import annotations

import numpy as np
import pytest

from support.tiny_gguf import BOS, EOS, byte_token, chain, text_tokens, write_llama
from support.harness import KvShadow, StepLog, make_engine

T = byte_token  # token id of a byte
A, B, C, D = (T(ord(c)) for c in "abcd")
SCRIPT = "xyz<STOP>jk"  # distinct bytes: a bigram chain can spell it
UTF8 = "é 中😀!"          # 2-, 1-, 3- and 4-byte characters, all bytes distinct


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("termination")
    letters = [T(ord(c)) for c in "efghilmnopqrstuv"]
    eos_mid = {A: B, B: EOS, EOS: C, C: D, D: A}  # ... a b EOS c d a ...
    return {
        "eos_mid": write_llama(d / "eos_mid.gguf", seed=41, bigram=eos_mid),
        "eos_mid_2": write_llama(d / "eos_mid_2.gguf", seed=42, bigram=eos_mid),
        # the verifier spells a b e f g ...; the draft believes EOS follows a
        "long": write_llama(d / "long.gguf", seed=43, bigram=chain([A, B] + letters)),
        "eos_after_a": write_llama(d / "eos_after_a.gguf", seed=44,
                                   bigram={**chain([A, B] + letters), A: EOS}),
        "script": write_llama(d / "script.gguf", seed=45, bigram=chain(
            [T(ord("w"))] + text_tokens(SCRIPT) + [EOS])),
        "script_2": write_llama(d / "script_2.gguf", seed=46, bigram=chain(
            [T(ord("w"))] + text_tokens(SCRIPT) + [EOS])),
        "utf8": write_llama(d / "utf8.gguf", seed=47, bigram=chain(
            [T(ord("h"))] + text_tokens(UTF8) + [EOS])),
        "utf8_2": write_llama(d / "utf8_2.gguf", seed=48, bigram=chain(
            [T(ord("h"))] + text_tokens(UTF8) + [EOS])),
        "eot": write_llama(d / "eot.gguf", seed=49, eot_id=T(ord("q")),
                           bigram=chain([A, B, T(ord("q")), C, D])),
        "rand_ver": write_llama(d / "rand_ver.gguf", seed=11),
        "rand_dft": write_llama(d / "rand_dft.gguf", seed=11, noise=0.1, noise_seed=12),
    }


def stream(dec, prompt, **kw) -> tuple[list[str], object]:
    s = dec.stream(prompt, **kw)
    chunks = list(s)
    return chunks, s.result


# ---- end of generation ----------------------------------------------------------------------------

@pytest.mark.parametrize("drafter,temp", [("ngram", 0.0), ("ngram", 1.0), ("model", 0.0),
                                          ("model", 1.0)])
def test_eos_inside_an_accepted_block_ends_the_output_there(models, monkeypatch, drafter, temp):
    steps = StepLog.install(monkeypatch)
    shadow = KvShadow.install(monkeypatch)
    # the n-gram drafter proposes what followed the earlier "a": b EOS c d
    prompt = [BOS, A, B, EOS, C, D, A]
    with make_engine(models["eos_mid"], models["eos_mid_2"], k=4, drafter=drafter,
                      temp=temp) as dec:
        chunks, res = stream(dec, prompt, n_predict=50, seed=0)
        ver_held = shadow.held(dec.verifier)
    assert res.stop_reason == "eos"
    assert res.tokens == [B] and res.text == "b" and "".join(chunks) == "b"
    n_drafted, n_acc, _, drafted = steps.steps[0]
    assert drafted[:2] == [B, EOS] and n_acc >= 2  # EOS accepted inside the block ...
    if drafter == "ngram":
        assert drafted == [B, EOS, C, D] and n_acc == 4  # ... with accepted drafts after it
    assert ver_held == prompt  # the verifier keeps nothing past the end: committed[:-1]
    with make_engine(models["eos_mid"], method="none", temp=temp) as alone:
        assert alone.generate(prompt, n_predict=50, seed=0).tokens == [B]


def test_end_of_turn_token_also_ends_the_output(models):
    with make_engine(models["eot"], models["eot"], k=4, temp=0.0) as dec:
        assert dec.verifier.model.eot == T(ord("q"))
        res = dec.generate([BOS, A], n_predict=20, seed=0)
    assert res.stop_reason == "eos" and res.tokens == [B] and res.text == "b"


@pytest.mark.parametrize("temp,method", [(0.0, "cactus"), (1.0, "sps"), (1.0, "cactus")])
def test_a_drafted_eos_the_verifier_rejects_does_not_end_generation(models, monkeypatch, temp,
                                                                  method):
    steps = StepLog.install(monkeypatch)
    with make_engine(models["long"], models["eos_after_a"], k=4, method=method, delta=1.0,
                      temp=temp) as dec:
        res = dec.generate([BOS, A], n_predict=10, seed=0)
    assert res.stop_reason == "length"
    assert res.tokens == [B] + [T(ord(c)) for c in "efghilmno"]
    n_drafted, n_acc, _, drafted = steps.steps[0]
    assert drafted == [EOS] and n_acc == 0  # drafted, rejected, replaced by the verifier's b


# ---- stop strings --------------------------------------------------------------------------------

@pytest.mark.parametrize("stops,text", [
    (["<STOP>"], "xyz"),
    (["z<S"], "xy"),
    (["TOP>j"], "xyz<S"),
    (["OP>", "yz<"], "x"),            # the earliest match wins
    (["xyz"], ""),                    # from the first character
    (["k"], "xyz<STOP>j"),            # the last character
    (["<STAR"], "xyz<STOP>jk"),       # a partial match is held back, then released
    (["jkl"], "xyz<STOP>jk"),         # a partial match at the very end
])
@pytest.mark.parametrize("setup", ["alone", "model k=5", "model k=2", "ngram"])
def test_stop_strings_match_across_tokens_and_never_leak(models, stops, text, setup):
    method = "none" if setup == "alone" else "cactus"
    drafter = "ngram" if setup == "ngram" else "model"
    k = int(setup[-1]) if setup.startswith("model") else 4
    # an n-gram drafter needs the script in the prompt to propose it
    prompt = [BOS, T(ord("w"))] + text_tokens(SCRIPT) + [T(ord("w"))] if drafter == "ngram" \
        else [BOS, T(ord("w"))]
    with make_engine(models["script"], models["script_2"], k=k, method=method, drafter=drafter,
                      temp=0.0) as dec:
        chunks, res = stream(dec, prompt, n_predict=40, stop=stops, seed=0)
    assert "".join(chunks) == res.text == text
    assert res.stop_reason == ("stop" if text != SCRIPT else "eos")
    for s in stops:
        assert s not in "".join(chunks)
    if "<STAR" in stops:
        # only the possible start of a stop string is held back: "xyz" streams before it
        first = next(i for i, c in enumerate(chunks) if "<" in c)
        assert "".join(chunks[:first]) == "xyz" and chunks[first].startswith("<STO")


def test_stop_strings_on_random_text_cut_exactly_at_the_first_match(models):
    """Random tiny models at temperature 0.8 (byte tokens, invalid UTF-8 and all): cutting a run at
    a substring of its own text gives exactly the text before its first occurrence."""
    rng = np.random.default_rng(0)
    checked = 0
    with make_engine(models["rand_ver"], models["rand_dft"], k=4, temp=0.8) as dec:
        for seed in range(30):
            full = dec.generate("the cat sat on", n_predict=40, seed=seed).text
            if len(full) < 6:
                continue
            a = int(rng.integers(1, len(full) - 2))
            stop = full[a:a + int(rng.integers(2, 5))]
            chunks, res = stream(dec, "the cat sat on", n_predict=40, stop=[stop], seed=seed)
            assert res.text == full[:full.find(stop)] == "".join(chunks)
            assert res.stop_reason == "stop"
            checked += 1
    assert checked >= 20


# ---- UTF-8 -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("setup", ["alone", "model k=1", "model k=3", "model k=8", "ngram"])
def test_streamed_chunks_hold_whole_characters_and_join_to_the_text(models, setup):
    method = "none" if setup == "alone" else "cactus"
    drafter = "ngram" if setup == "ngram" else "model"
    k = int(setup[-1]) if setup.startswith("model") else 4
    prompt = [BOS, T(ord("h"))] + text_tokens(UTF8) + [T(ord("h"))] if drafter == "ngram" \
        else [BOS, T(ord("h"))]
    with make_engine(models["utf8"], models["utf8_2"], k=k, method=method, drafter=drafter,
                      temp=0.0) as dec:
        chunks, res = stream(dec, prompt, n_predict=40, seed=0)
        pieces: list[str] = []
        again = dec.generate(prompt, n_predict=40, seed=0, on_text=pieces.append)
    assert res.stop_reason == "eos" and res.text == UTF8 and res.tokens == text_tokens(UTF8)
    assert "".join(chunks) == UTF8 and "".join(pieces) == again.text == UTF8
    for c in chunks + pieces:
        assert c and "\ufffd" not in c
        c.encode("utf-8")  # whole characters only (a lone surrogate would raise)
    assert len(chunks) >= 2


@pytest.mark.parametrize("stop,text", [("😀", "é 中"), ("中😀", "é "), ("\u00e9", ""),
                                       ("😀!", "é 中"), ("!", "é 中😀")])
def test_stop_strings_with_multibyte_characters(models, stop, text):
    with make_engine(models["utf8"], models["utf8_2"], k=3, temp=0.0) as dec:
        chunks, res = stream(dec, [BOS, T(ord("h"))], n_predict=40, stop=[stop], seed=0)
    assert res.stop_reason == "stop" and res.text == text == "".join(chunks)


@pytest.mark.parametrize("n,text", [(1, "\ufffd"), (2, "é"), (4, "é \ufffd"), (5, "é \ufffd"),
                                    (6, "é 中"), (9, "é 中\ufffd")])
def test_a_length_cut_inside_a_character_ends_with_one_replacement_character(models, n, text):
    """Choice: an unfinished UTF-8 character at the very end (the -n limit fell inside it) becomes
    U+FFFD, like Python's errors="replace"; nothing earlier is ever replaced."""
    with make_engine(models["utf8"], models["utf8_2"], k=3, temp=0.0) as dec:
        chunks, res = stream(dec, [BOS, T(ord("h"))], n_predict=n, seed=0)
    assert res.stop_reason == "length" and res.text == text == "".join(chunks)
