"""The vocabulary map (cactus_gguf/speculative/vocab_map.py) and `cactus-gguf vocab`: exact maps between
constructed vocabulary-only GGUFs, the cache, and the real Qwen / SmolLM2 files."""
from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from cactus_gguf.cli import main
from cactus_gguf.errors import InputError
from cactus_gguf.speculative import vocab_map as vmod

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
