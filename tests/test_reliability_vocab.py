"""Issue #6, kind 1: vocabulary compatibility of the draft and the verifier.

Under ``draft_vocab same``, refused before any decoding (naming the first difference): shared ids
with different text, a different BOS / EOS / EOT id or add-BOS flag, a longer vocabulary whose
extra ids are real tokens. Under ``auto`` (the default) such pairs are served through a vocabulary
map (tests/test_foreign_drafts.py).
Accepted: vocabularies that differ only by unused padding ids at the end, on either side; the draft
then gives the missing ids probability 0, and if the verifier emits one of its padding ids the
draft cannot follow and the verifier decodes alone for the rest of that generation.
Both contexts receive exactly the prompt ids the verifier alone gets (BOS included).
"""
from __future__ import annotations

import pytest

from cactus_gguf.llama import Context
from cactus_gguf.speculative import VocabMismatchError
from support.tiny_gguf import WORDS

from support.tiny_gguf import BOS, EOS, write_llama
from support.harness import KvShadow, StepLog, ctx, make_engine

V = 281
PROMPT = "the cat sat on"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("vocab")
    return {
        "ver": write_llama(d / "ver.gguf", seed=11),
        "dft": write_llama(d / "dft.gguf", seed=11, noise=0.5, noise_seed=12),
        "no_bos": write_llama(d / "no_bos.gguf", seed=11, add_bos=False),
        "no_bos_dft": write_llama(d / "no_bos_dft.gguf", seed=11, add_bos=False, noise=0.5,
                                  noise_seed=12),
        "padded_ver": write_llama(d / "padded_ver.gguf", seed=11, n_pad=16),
        "padded_dft": write_llama(d / "padded_dft.gguf", seed=11, n_pad=16, noise=0.5, noise_seed=12),
    }


# ---- refused under draft_vocab same, before any decoding ----------------------------------------------------------------

@pytest.mark.parametrize("knob,what", [
    (dict(add_bos=False), "add_bos"),
    (dict(bos_id=0), "bos"),
    (dict(eos_id=0), "eos"),
    (dict(eot_id=EOS), "eot"),
])
def test_special_token_disagreement_is_refused_before_decoding(models, tmp_path, monkeypatch,
                                                               knob, what):
    other = write_llama(tmp_path / "other.gguf", seed=5, **knob)
    shadow = KvShadow.install(monkeypatch)
    with pytest.raises(VocabMismatchError, match=rf"disagree on {what} \(verifier"):
        make_engine(models["ver"], other, draft_vocab="same")
    assert shadow.decodes == []


@pytest.mark.parametrize("index", [0, len(WORDS) - 1])
def test_first_differing_shared_id_is_named(models, tmp_path, monkeypatch, index):
    """The first and the last shared word: the check covers the whole shared range."""
    words = list(WORDS)
    words[index] = "▁zebra"
    other = write_llama(tmp_path / "other.gguf", seed=5, words=words)
    shadow = KvShadow.install(monkeypatch)
    token_id = 259 + index
    with pytest.raises(VocabMismatchError, match=rf"token id {token_id} is '{WORDS[index]}' in the "
                                                 r"verifier and '▁zebra' in the draft"):
        make_engine(models["ver"], other, draft_vocab="same")
    assert shadow.decodes == []


def test_a_real_token_past_the_shared_range_is_refused(models, tmp_path):
    longer = write_llama(tmp_path / "longer.gguf", seed=5, words=WORDS + ["▁zebra"])
    for ver, dft in ((models["ver"], longer), (longer, models["ver"])):
        with pytest.raises(VocabMismatchError, match=r"id 281 of longer.gguf \('▁zebra'\) is a real"):
            make_engine(ver, dft, draft_vocab="same")


def test_refused_pair_frees_both_models(models, tmp_path, monkeypatch):
    other = write_llama(tmp_path / "other.gguf", seed=5, eos_id=0)
    from cactus_gguf.llama import Model
    from support.harness import track_loads

    opened = track_loads(monkeypatch)
    with pytest.raises(VocabMismatchError):
        make_engine(models["ver"], other, draft_vocab="same")
    assert sum(isinstance(m, Model) for m in opened) == 2
    assert all(m.closed for m in opened)


# ---- the prompt ids both contexts receive ----------------------------------------------------------

def _prompt_ids_given(shadow: KvShadow, model, n_prompt: int) -> list[int]:
    """The ids a context decoded before its first generated token: the prefill plus the first
    token(s) of its first later decode that belong to the prompt."""
    calls = [toks for m, toks, _ in shadow.decodes if m is model]
    seen: list[int] = []
    for toks in calls:
        seen += toks
        if len(seen) >= n_prompt:
            break
    return seen[:n_prompt]


@pytest.mark.parametrize("pair", [("ver", "dft"), ("no_bos", "no_bos_dft")])
@pytest.mark.parametrize("prompt", [PROMPT, "<s>the cat", " leading space", "é中😀"])
def test_both_contexts_receive_the_verifier_alone_prompt_ids(models, monkeypatch, pair, prompt):
    ver, dft = (models[p] for p in pair)
    shadow = KvShadow.install(monkeypatch)
    with make_engine(ver, method="none", temp=0.0) as alone:
        want = alone.tokenize(prompt)
        alone.generate(prompt, n_predict=3, seed=0)
        got_alone = _prompt_ids_given(shadow, alone.verifier, len(want))
    with make_engine(ver, dft, k=3, temp=0.0) as dec:
        assert dec.tokenize(prompt) == want
        dec.generate(prompt, n_predict=3, seed=0)
        got_ver = _prompt_ids_given(shadow, dec.verifier, len(want))
        got_dft = _prompt_ids_given(shadow, dec.draft, len(want))
    assert got_alone == got_ver == got_dft == want
    with Context.load(ver, context_options=ctx()) as m:
        add_bos = m.model.add_bos
    # BOS exactly once when the model asks for it (also when the text starts with "<s>"), else never
    assert want.count(BOS) == (1 if add_bos else prompt.count("<s>"))
    assert (want[0] == BOS) == (add_bos or prompt.startswith("<s>"))


# ---- padding ids at the end -----------------------------------------------------------------------

def test_padded_verifier_is_accepted_and_the_draft_gives_its_tail_zero(models, monkeypatch):
    steps = StepLog.install(monkeypatch, keep_probs=True)
    with make_engine(models["padded_ver"], models["dft"], k=3, temp=1.0) as dec:
        assert (dec.verifier.n_vocab, dec.draft.n_vocab) == (V + 16, V)
        results = [dec.generate(PROMPT, n_predict=40, seed=s) for s in range(12)]
    drafted = [s for s in steps.steps if s[0] > 0]
    assert drafted
    for n, _, probs, toks in drafted:
        assert probs.shape == (n, V + 16)
        assert not probs[:, V:].any()  # the ids the draft lacks: probability exactly 0
        assert max(toks) < V
    # the verifier does emit its padding ids (random weights): the run goes on without the draft
    assert any(max(r.tokens) >= V for r in results)


def test_after_the_verifier_emits_a_padding_id_the_verifier_decodes_alone(models, monkeypatch):
    steps = StepLog.install(monkeypatch)
    with make_engine(models["padded_ver"], models["dft"], k=3, temp=1.0) as dec:
        for seed in range(20):
            steps.steps.clear()
            res = dec.generate(PROMPT, n_predict=60, seed=seed)
            first_pad = next((i for i, t in enumerate(res.tokens) if t >= V), None)
            if first_pad is not None and first_pad < len(res.tokens) - 5:
                break
        else:
            pytest.fail("no run emitted a padding id early")
    # map steps to output positions: a step emits n_accepted + 1 tokens
    pos = 0
    for n_drafted, n_acc, _, _ in steps.steps:
        if pos > first_pad:
            assert n_drafted == 0, "drafted after the verifier emitted an id the draft lacks"
        pos += n_acc + 1
    assert res.stop_reason in ("length", "eos")


def test_padded_draft_never_proposes_its_tail(models, monkeypatch):
    steps = StepLog.install(monkeypatch, keep_probs=True)
    with make_engine(models["ver"], models["padded_dft"], k=4, temp=1.5) as dec:
        assert dec.draft.n_vocab == V + 16
        for seed in range(10):
            dec.generate(PROMPT, n_predict=40, seed=seed)
    drafted = [s for s in steps.steps if s[0] > 0]
    assert sum(s[0] for s in drafted) > 50
    for n, _, probs, toks in drafted:
        assert probs.shape == (n, V) and max(toks) < V


@pytest.mark.parametrize("k", [1, 4])
def test_padded_verifier_greedy_equals_verifier_alone(models, k):
    with make_engine(models["padded_ver"], method="none", temp=0.0) as alone:
        want = [alone.generate(p, n_predict=50, seed=0).tokens for p in (PROMPT, "hello")]
    with make_engine(models["padded_ver"], models["dft"], k=k, temp=0.0) as dec:
        got = [dec.generate(p, n_predict=50, seed=0).tokens for p in (PROMPT, "hello")]
    assert got == want


def test_token_id_prompts_outside_the_vocabulary_are_a_clear_error(models, monkeypatch):
    shadow = KvShadow.install(monkeypatch)
    with make_engine(models["ver"], models["dft"]) as dec:
        for bad in (V, -1, 10**6):
            with pytest.raises(ValueError, match=rf"prompt token id {bad} is outside the verifier's "
                                                 rf"vocabulary \[0, {V}\)"):
                dec.generate([BOS, 100, bad], n_predict=4, seed=0)
    assert shadow.decodes == []


def test_token_id_prompt_with_a_verifier_padding_id_skips_the_draft(models, monkeypatch):
    """An id only the (padded) verifier has, inside the prompt: the draft cannot take the prompt,
    the verifier decodes alone instead of failing."""
    steps = StepLog.install(monkeypatch)
    with make_engine(models["padded_ver"], models["dft"], k=3, temp=0.0) as dec:
        res = dec.generate([BOS, 100, V + 3, 101], n_predict=10, seed=0)
        assert dec.draft.n_past == 0
    assert res.stats.n_tokens >= 1 and all(s[0] == 0 for s in steps.steps)
    with make_engine(models["padded_ver"], method="none", temp=0.0) as alone:
        assert alone.generate([BOS, 100, V + 3, 101], n_predict=10, seed=0).tokens == res.tokens
