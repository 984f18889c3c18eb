"""Drafts whose vocabulary is not the verifier's (speculative/foreign.py, docs/models.md
"Foreign drafts").

Tiny GGUFs with constructed vocabularies: the verifier's (tests/support/tiny_gguf.py WORDS); a
*near-compatible* draft (the same text tokens, an extra control token that moves every id up by
one: method ``map``); a *foreign* draft (other words, the same extra control token: ``intersect``).
The laws: SpS emits q under both methods, Cactus the exact mixture law over the proposal
distribution each method really proposes from. Statistical tests are Pearson's chi-square at
ALPHA = 0.001 with fixed seeds (deterministic); the expected laws come from the NumPy reference.
"""
from __future__ import annotations

import numpy as np
import pytest

from cactus_gguf.llama import Context
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams, reference
from cactus_gguf.speculative import VocabMismatchError
from cactus_gguf.speculative.foreign import Translator, vocab_info
from support.harness import assert_one_line_error, bench_cli, ctx, make_engine, run_cli
from support.stats import ALPHA, chisquare_pvalue
from support.tiny_gguf import EXTRA, FOREIGN_WORDS, WORDS, write_llama

PROMPT = "the cat sat on"
SAMPLING = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("foreign")
    return {"ver": write_llama(d / "ver.gguf", seed=11),
            "near": write_llama(d / "near.gguf", seed=11, noise=0.5, noise_seed=12,
                                extra_control=EXTRA),
            "foreign": write_llama(d / "foreign.gguf", seed=5, words=FOREIGN_WORDS,
                                   extra_control=EXTRA)}


def _translator(ver, dft) -> Translator:
    with Context.load(ver, context_options=ctx()) as v, Context.load(dft, context_options=ctx()) as d:
        return Translator.of(v.model, d.model)


# ---- the pair and the translation: exact values -------------------------------------------------

def test_the_pairs_are_classified_and_every_method_resolves(models):
    with make_engine(models["ver"], models["near"]) as near, \
            make_engine(models["ver"], models["foreign"]) as foreign:
        assert near.pair_vocab.kind == "map"
        assert foreign.pair_vocab.kind == "intersect"
        assert [near.pair_vocab.method_for(m) for m in ("auto", "map", "intersect", "text")] == \
            ["map", "map", "intersect", "text"]
        assert [foreign.pair_vocab.method_for(m) for m in ("auto", "intersect", "text")] == \
            ["intersect", "intersect", "text"]
        with pytest.raises(VocabMismatchError, match=r"map needs the same text tokens"):
            foreign.pair_vocab.method_for("map")
        with pytest.raises(VocabMismatchError, match=r"same, but draft foreign.gguf and verifier "
                                                      r"ver.gguf have different vocabularies: "
                                                      r"token id 3 is '<0x00>' in the verifier"):
            foreign.pair_vocab.method_for("same")


def test_the_translation_of_every_kind_of_token(models):
    tr = _translator(models["ver"], models["foreign"])
    vw = {w: 259 + i for i, w in enumerate(WORDS)}            # verifier ids
    dw = {w: 260 + i for i, w in enumerate(FOREIGN_WORDS)}    # draft ids (one control token more)
    # a shared word and a byte: their counterparts; BOS / EOS: by role (the same ids here)
    assert tr.to_draft(vw["▁sat"]) == (dw["▁sat"],) and tr.to_draft(3 + 0x41) == (4 + 0x41,)
    assert tr.to_draft(1) == (1,) and tr.to_draft(2) == (2,)
    # a word the draft lacks: its bytes in draft tokens, longest match first (" " + "c" + "at")
    assert tr.to_draft(vw["▁cat"]) == (dw["▁"], 4 + ord("c"), dw["at"])
    assert tr.to_draft(vw["t"]) == (4 + ord("t"),)
    # draft -> verifier: the draft's own control token and its words the verifier lacks have none
    assert tr.d2v[3] == -1 and tr.d2v[dw["▁cats"]] == -1 and tr.d2v[dw["▁hat"]] == -1
    assert tr.d2v[dw["at"]] == -1 and tr.d2v[dw["▁dog"]] == vw["▁dog"]
    shared = set(np.flatnonzero(tr.shared_v))
    assert shared == {1, 2, *range(3, 259), *(vw[w] for w in set(WORDS) & set(FOREIGN_WORDS))}


def test_a_loaded_models_vocabulary_is_the_files(models):
    from cactus_gguf.speculative.vocab_map import read_vocab

    with Context.load(models["foreign"], context_options=ctx()) as c:
        live = vocab_info(c.model)
    stored = read_vocab(models["foreign"])
    assert live.pieces == stored.pieces and np.array_equal(live.types, stored.types)
    assert live.model == stored.model == "llama"


# ---- greedy: the verifier's own tokens -------------------------------------------------------------

@pytest.mark.parametrize("draft,vocab", [("near", "auto"), ("foreign", "intersect"),
                                         ("foreign", "text")])
@pytest.mark.parametrize("method,k", [("sps", 1), ("cactus", 4)])
def test_greedy_equals_the_verifier_alone(models, draft, vocab, method, k):
    with make_engine(models["ver"], None, temp=0.0, method="none") as alone:
        base = alone.generate(PROMPT, n_predict=40, seed=0)
    with make_engine(models["ver"], models[draft], temp=0.0, k=k, method=method,
                     draft_vocab=vocab) as spec:
        out = spec.generate(PROMPT, n_predict=40, seed=3)
        again = spec.generate(PROMPT, n_predict=40, seed=3)  # prefix reuse of both contexts
    assert out.tokens == base.tokens == again.tokens
    assert out.stats.draft_vocab == ("map" if vocab == "auto" else vocab)
    assert out.stats.n_drafted > 0 and out.stats.n_steps < 40 + 1


# ---- sampled: the exact laws ---------------------------------------------------------------------

def _first_position(models, draft, sampling=SAMPLING):
    """(q float32 [V_v], the draft's logits after the translated prompt float32 [V_d], the
    translator)."""
    tr = _translator(models["ver"], models[draft])
    with Context.load(models["ver"], context_options=ctx()) as v:
        ids = v.model.tokenize(PROMPT)
        q = NativeSampler(v.n_vocab, sampling, AcceptanceParams(), 0).warp(
            np.array(v.decode(ids, 1)[0]))
    with Context.load(models[draft], context_options=ctx()) as d:
        row = np.array(d.decode([t for i in ids for t in tr.to_draft(i)], 1)[0])
    return q, row, tr


def _histogram(models, draft, vocab, method, n_runs=6000):
    counts = None
    with make_engine(models["ver"], models[draft], temp=1.0, top_k=8, k=1, method=method,
                     delta=1.0, draft_vocab=vocab) as eng:
        counts = np.zeros(eng.verifier.n_vocab, np.int64)
        for seed in range(n_runs):
            res = eng.generate(PROMPT, n_predict=1, seed=seed)
            counts[res.tokens[0] if res.tokens else eng.verifier.model.eos] += 1
    return counts


@pytest.mark.parametrize("draft,vocab", [("near", "map"), ("foreign", "intersect")])
@pytest.mark.parametrize("method", ["sps", "cactus"])
def test_intersection_sampling_emits_the_exact_law(models, draft, vocab, method):
    """p is the draft's warped distribution restricted to the ids with a counterpart (a
    disallowed id is a -inf logit), scattered into verifier ids."""
    q, row, tr = _first_position(models, draft)
    p_d = NativeSampler(len(row), SAMPLING, AcceptanceParams(), 0).warp(row,
                                                                        allowed=tr.draftable)
    assert p_d[tr.d2v < 0].sum() == 0.0
    p = np.zeros(len(q))
    np.add.at(p, tr.d2v[p_d > 0], p_d[p_d > 0])
    expected = reference.emitted_first_token_distribution(p, q, method, delta=1.0)
    counts = _histogram(models, draft, vocab, method)
    assert chisquare_pvalue(counts, expected) > ALPHA
    if method == "cactus" and 6000 * ((q - expected) ** 2 / np.maximum(expected, 1e-12)).sum() > 100:
        assert chisquare_pvalue(counts, q.astype(np.float64), strict=False) < ALPHA


@pytest.mark.parametrize("method", ["sps", "cactus"])
def test_text_translation_emits_the_exact_law(models, method):
    """The draft samples freely; its token's bytes are re-tokenised by the verifier and proposed
    one-hot. The law: the mixture over the draft's token d of the one-hot law at the proposal
    v(d) (q itself where d spells no complete character: no proposal)."""
    q, row, tr = _first_position(models, "foreign")
    p_d = NativeSampler(len(row), SAMPLING, AcceptanceParams(), 0).warp(row)
    with make_engine(models["ver"], models["foreign"], temp=1.0, top_k=8, k=1,
                     draft_vocab="text") as eng:
        drafter = eng._make_drafter(eng.request(), 0, eng.slots[0])
        is_eog = eng.draft.model.is_eog
        expected = np.zeros(len(q))
        for d in np.flatnonzero(p_d):
            if is_eog(int(d)):
                proposed = [int(tr.d2v[d])] if tr.d2v[d] >= 0 else []
            else:
                proposed = drafter._verifier_tokens(Translator.token_bytes(tr.draft, int(d)))
            if not proposed:
                law = q.astype(np.float64)
            else:
                onehot = np.zeros(len(q))
                onehot[proposed[0]] = 1.0
                law = reference.emitted_first_token_distribution(onehot, q, method, delta=1.0)
            expected += p_d[d] * law
    counts = _histogram(models, "foreign", "text", method)
    assert chisquare_pvalue(counts, expected) > ALPHA
    if method == "sps":
        np.testing.assert_allclose(expected, q, atol=1e-6)  # any proposal: q exactly
    elif 6000 * ((q - expected) ** 2 / np.maximum(expected, 1e-12)).sum() > 100:
        assert chisquare_pvalue(counts, q.astype(np.float64), strict=False) < ALPHA


def test_coverage_is_the_verifiers_mass_on_the_shared_tokens(models):
    untruncated = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    q, _, tr = _first_position(models, "foreign", untruncated)
    with make_engine(models["ver"], models["foreign"], temp=1.0, top_k=0, k=2,
                     draft_vocab="intersect") as eng:
        one = eng.generate(PROMPT, n_predict=1, seed=0)  # one step: the first position's q
    assert one.stats.n_steps == 1
    assert one.stats.vocab_coverage == pytest.approx(q[tr.shared_v].sum(dtype=np.float64),
                                                     abs=1e-6)
    assert 0.0 < one.stats.vocab_coverage < 1.0  # "▁cat" and "t" are the verifier's alone
    with make_engine(models["ver"], models["near"], temp=1.0, top_k=8, k=2) as same_text:
        assert same_text.generate(PROMPT, n_predict=4, seed=0).stats.vocab_coverage == \
            pytest.approx(1.0, abs=1e-6)


def test_vocab_coverage_is_a_mass_at_most_one():
    from cactus_gguf.stats import GenerationStats

    s = GenerationStats(coverage_sum=3.000000012, n_coverage=3)
    assert s.vocab_coverage == 1.0
    assert GenerationStats().vocab_coverage is None


def test_a_grammar_with_a_foreign_draft_keeps_to_the_grammar(models):
    with make_engine(models["ver"], models["foreign"], temp=1.0, top_k=0, k=3,
                     grammar='root ::= ("the" | " cat" | " sat")+') as eng:
        for vocab in ("intersect", "text"):
            out = eng.generate(PROMPT, n_predict=12, seed=1, draft_vocab=vocab)
            assert out.text.replace("the", "").replace(" cat", "").replace(" sat", "") == ""
            assert out.stats.draft_vocab == vocab


# ---- refused, and the surfaces ---------------------------------------------------------------------

def test_draft_window_with_a_foreign_draft_is_a_clear_error(models):
    from cactus_gguf.errors import InputError

    with make_engine(models["ver"], models["foreign"], temp=1.0) as eng:
        with pytest.raises(InputError, match=r"^draft_window works only with a draft of the "
                           r"verifier.s vocabulary, and this request drafts with draft_vocab "
                           r"intersect: set draft_window 0$"):
            eng.generate(PROMPT, n_predict=4, seed=0, draft_window=8)


def test_serve_refuses_a_draft_window_with_a_foreign_draft_before_serving(models):
    """A client cannot change ``draft_window``: a server started with it and a foreign draft
    (explicit --draft-vocab, or auto on a foreign pair) would have answered every request with a
    400; it is refused at start, in one line, and never says it is serving."""
    from cactus_gguf.errors import InputError
    from cactus_gguf.options import Request

    with pytest.raises(InputError, match=r"draft_window works only .* draft_vocab text"):
        Request(draft_window=5, draft_vocab="text")
    for vocab in ("text", "auto"):
        r = run_cli("serve", models["ver"], models["foreign"], "--draft-window", "5",
                    "--draft-vocab", vocab, "-t", "1", "--port", "0", timeout=60)
        line = assert_one_line_error(r, "--draft-window works only with a draft of the verifier")
        assert "serving" not in r.stdout + r.stderr, line


def test_cli_serves_a_foreign_pair_and_names_what_differs_under_same(models):
    r = run_cli("run", models["ver"], models["foreign"], "-p", PROMPT, "-n", "8", "-k", "2",
                "-t", "1", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert "draft vocabulary: intersect, the verifier's mass on the shared tokens" in r.stderr
    r = run_cli("run", models["ver"], models["foreign"], "-p", PROMPT, "-n", "8",
                "--draft-vocab", "same")
    assert_one_line_error(r, "--draft-vocab same, but draft foreign.gguf and verifier ver.gguf "
                             "have different vocabularies", "cactus-gguf vocab")


# ---- the real models: Qwen2.5-Coder-1.5B verifier, SmolLM2-135M draft ------------------------------

def test_real_foreign_draft_greedy_equals_the_verifier_alone(qwen_pair, smollm_path):
    """Both methods, SpS and Cactus, on the quantized pair: the verifier's own greedy tokens
    (this prompt has no near-tie within the batch shapes' rounding: docs/behaviour.md
    "Greedy equivalence"), with drafts accepted."""
    from cactus_gguf import Engine, LoadOptions, Request

    greedy = Request(k=4, temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, n_predict=64)
    with Engine(qwen_pair[0], smollm_path, LoadOptions(n_ctx=1024), defaults=greedy) as eng:
        assert eng.pair_vocab.kind == "intersect"
        base = eng.generate("def quicksort(arr):", seed=0, method="none")
        for vocab in ("intersect", "text"):
            for method in ("sps", "cactus"):
                out = eng.generate("def quicksort(arr):", seed=5, method=method, draft_vocab=vocab)
                assert out.tokens == base.tokens, (vocab, method)
                assert out.stats.draft_vocab == vocab and out.stats.acceptance_rate > 0.2
                assert 0.5 < out.stats.vocab_coverage <= 1.0 + 1e-6


def test_bench_and_the_cost_probe_run_a_foreign_pair(models, tmp_path, monkeypatch):
    """The probe times the draft on its own tokens, and the draft-alone configuration reads the
    prompt with its own tokenizer (both used the verifier's ids: the foreign draft failed to
    decode them, or the draft configuration was refused naming the wrong vocabulary)."""
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(tmp_path / "cache"))
    report = bench_cli(tmp_path, models["ver"], models["foreign"], "-n", "8", "--configs",
                       "none,sps,draft", "-k", "2,auto", prompts=["def f(a): the cat sat on"])
    assert {row["config"] for row in report["runs"]} == {"none", "sps-k2", "sps-kauto", "draft"}
    assert report["forward_ms"]["before"]["draft"]["1"] > 0
