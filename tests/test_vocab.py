"""Vocabularies: the map between two (cactus_gguf/speculative/vocab_map.py) and `cactus-gguf vocab`
(exact maps between constructed vocabulary-only GGUFs, the cache, the real Qwen / SmolLM2 files);
then, on tiny models llama.cpp runs, what a pair of the same vocabulary must agree on
(speculative/vocab.py), the prompt ids both contexts get, and padding ids at the end."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from cactus_gguf.cli import main
from cactus_gguf.errors import InputError
from cactus_gguf.llama import Context
from cactus_gguf.speculative import VocabMismatchError
from cactus_gguf.speculative import vocab_map as vmod

from support.harness import KvShadow, StepLog, ctx, make_engine
from support.tiny_gguf import BOS, EOS, WORDS, write_llama

N, C, U, B = 1, 3, 5, 6  # token types: normal, control, unused, byte
BASE = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "Ġa", "Ġb", "ab", "Ċ"]
BASE_TYPES = [C, C, C, N, N, N, N, N, N]
MERGES = ["a b", "Ġ a", "Ġ b"]


def write_vocab(path, tokens, types, *, model="gpt2", merges=MERGES, bos=0, eos=2):
    """A GGUF holding only a tokenizer (llama.cpp is not needed to read it)."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if merges is not None:
        w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_identical_vocabularies_and_a_padding_tail_are_the_same(tmp_path):
    v = write_vocab(tmp_path / "v.gguf", BASE + ["[PAD0]", "[PAD1]"], BASE_TYPES + [U, U])
    d = write_vocab(tmp_path / "d.gguf", BASE, BASE_TYPES)
    vm = vmod.build_map(vmod.read_vocab(v), vmod.read_vocab(d))
    assert vm.method == "same"
    assert vm.draft_to_verifier.tolist() == list(range(9))
    assert (vm.n_text_draft, vm.n_text_verifier, vm.n_text_shared) == (6, 6, 6)
    assert vm.specials == {"bos": (0, 0), "eos": (2, 2)}
    assert vm.draft_only == [] and vm.verifier_only == []


def test_moved_and_extra_special_tokens_need_a_map(tmp_path):
    # the draft: a fine-tune with one more special token, and its specials after the text tokens
    d_tokens = ["a", "b", "Ġa", "Ġb", "ab", "Ċ", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
                "<|tool|>"]
    d_types = [N] * 6 + [C] * 4
    v = write_vocab(tmp_path / "v.gguf", BASE, BASE_TYPES)
    d = write_vocab(tmp_path / "d.gguf", d_tokens, d_types, bos=6, eos=8)
    vm = vmod.build_map(vmod.read_vocab(v), vmod.read_vocab(d))
    assert vm.method == "map"
    # text by bytes, specials by role and text; the extra special has no counterpart
    assert vm.draft_to_verifier.tolist() == [3, 4, 5, 6, 7, 8, 0, 1, 2, -1]
    assert vm.specials == {"bos": (6, 0), "eos": (8, 2)}


def test_different_tokenizers_intersect_by_bytes(tmp_path):
    v = write_vocab(tmp_path / "v.gguf", BASE, BASE_TYPES)
    # SentencePiece spelling: '▁a' is ' a', <0x0A> the newline byte; 'ba' only in the draft
    d_tokens = ["<s>", "</s>", "a", "▁a", "<0x0A>", "ba", "▁b"]
    d_types = [C, C, N, N, B, N, N]
    d = write_vocab(tmp_path / "d.gguf", d_tokens, d_types, model="llama", merges=None,
                    bos=0, eos=1)
    vm = vmod.build_map(vmod.read_vocab(v), vmod.read_vocab(d))
    assert vm.method == "intersect" and not vm.same_merges
    assert vm.draft_to_verifier.tolist() == [0, 2, 3, 5, 8, -1, 6]
    assert (vm.n_text_draft, vm.n_text_shared) == (5, 4)
    assert vm.draft_coverage == pytest.approx(0.8)
    assert vm.draft_only == [(5, "ba")]
    assert vm.verifier_only == [(4, "b"), (7, "ab")]


def test_other_merges_over_the_same_tokens_intersect(tmp_path):
    v = write_vocab(tmp_path / "v.gguf", BASE, BASE_TYPES)
    d = write_vocab(tmp_path / "d.gguf", BASE, BASE_TYPES, merges=["Ġ a", "a b", "Ġ b"])
    vm = vmod.build_map(vmod.read_vocab(v), vmod.read_vocab(d))
    assert vm.method == "intersect" and vm.n_text_shared == 6


def test_the_map_is_cached_by_both_files(tmp_path, cache, monkeypatch):
    v = write_vocab(tmp_path / "v.gguf", BASE, BASE_TYPES)
    d = write_vocab(tmp_path / "d.gguf", BASE[:8], BASE_TYPES[:8])
    first = vmod.vocab_map(v, d)
    assert len(list((cache / "vocab-maps").glob("*.npz"))) == 1

    def no_build(*a, **k):
        raise AssertionError("built again")

    monkeypatch.setattr(vmod, "build_map", no_build)
    again = vmod.vocab_map(v, d)
    assert again.to_dict() == first.to_dict()
    assert np.array_equal(again.draft_to_verifier, first.draft_to_verifier)
    # another file is another key
    monkeypatch.undo()
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(cache))
    other = write_vocab(tmp_path / "d2.gguf", BASE, BASE_TYPES)
    assert vmod.vocab_map(v, other).method == "same"
    assert len(list((cache / "vocab-maps").glob("*.npz"))) == 2


def test_not_a_gguf_is_one_line_naming_the_file(tmp_path, cache):
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    v = write_vocab(tmp_path / "v.gguf", BASE, BASE_TYPES)
    with pytest.raises(InputError, match="notes.gguf: not a readable GGUF file"):
        vmod.vocab_map(v, bad)
    r = CliRunner().invoke(main, ["vocab", str(v), str(bad)])
    assert r.exit_code == 1
    assert "not a readable GGUF file" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["vocab", str(v), str(tmp_path / "missing.gguf")])
    assert r.exit_code == 1 and "no such file" in r.output


def test_vocab_command_on_the_real_files(qwen_pair, smollm_path):
    ver, dft = qwen_pair
    r = CliRunner().invoke(main, ["vocab", str(ver), str(dft)])
    assert r.exit_code == 0, r.output
    assert "shared text tokens: 151645 (100.0% of the draft's); merges the same" in r.output
    assert "method: same" in r.output
    r = CliRunner().invoke(main, ["vocab", str(ver), str(smollm_path), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert (data["method"], data["n_vocab_draft"], data["n_text_draft"],
            data["n_text_shared"]) == ("intersect", 49152, 49135, 39234)
    assert data["specials"]["eos"] == [2, 151645]


# ------------------------------------------------------------------------------------------------
# Same vocabularies: what draft_vocab same refuses, the prompt ids both contexts get, padding
# ------------------------------------------------------------------------------------------------
# Under ``draft_vocab same``, refused before any decoding (naming the first difference): shared ids
# with different text, a different BOS / EOS / EOT id or add-BOS flag, a longer vocabulary whose
# extra ids are real tokens. Under ``auto`` (the default) such pairs are served through a vocabulary
# map (above; tests/test_foreign_drafts.py). Accepted: vocabularies that differ only by unused
# padding ids at the end, on either side; the draft then gives the missing ids probability 0, and if
# the verifier emits one of its padding ids the draft cannot follow and the verifier decodes alone
# for the rest of that generation. Both contexts receive exactly the prompt ids the verifier alone
# gets (BOS included).

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


# ---- refused under draft_vocab same, before any decoding ----------------------------------------

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


# ---- the prompt ids both contexts receive -------------------------------------------------------

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


# ---- padding ids at the end ---------------------------------------------------------------------

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
