"""The decoding loop on tiny generated GGUF models that llama.cpp loads and runs for real: the law
of the emitted token, greedy output equal to the verifier's own for every k and rule, the rows the
draft samples from and the acceptance test gets, non-finite logits, random state per decoder, and
how a generation ends (end-of-generation tokens, stop strings, UTF-8 in streamed chunks).

Statistical tests use Pearson's chi-square at significance alpha = 0.001 with fixed seeds, so each
is deterministic; the expected distributions come from the NumPy reference
(cactus_gguf/sampling/reference.py).
"""
from __future__ import annotations

import numpy as np
import pytest

from cactus_gguf.llama import Context
from cactus_gguf.sampling import (AcceptanceParams, NativeSampler, NonFiniteLogitsError,
                                  SamplingParams)
from cactus_gguf.sampling import reference
from cactus_gguf.speculative import VocabMismatchError

from support.harness import KvShadow, StepLog, assert_greedy_equal, make_engine, top_two_gap
from support.stats import (ALPHA, CTX, PROMPT, chisquare_pvalue, decoder, first_position_dists,
                           first_token_histogram)
from support.tiny_gguf import BOS, EOS, byte_token, chain, text_tokens, write_llama


# ---- distribution of the emitted token --------------------------------------------------------

@pytest.mark.parametrize("method,delta,solver", [("sps", 0.0, "taylor"), ("cactus", 1.0, "taylor"),
                                                  ("cactus", 0.5, "exact"), ("typical", 0.0, "taylor"),
                                                  ("topk", 0.0, "taylor"), ("greedy", 0.0, "taylor"),
                                                  ("ears", 0.0, "taylor")])
def test_first_emitted_token_follows_the_method_distribution(tiny_pair, method, delta, solver):
    ver, dft = tiny_pair
    sampling = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    q, p = first_position_dists(ver, dft, sampling)
    expected = reference.emitted_first_token_distribution(p, q, method, delta=delta, solver=solver)
    with decoder(ver, dft, k=1, method=method, delta=delta, solver=solver) as dec:
        counts = first_token_histogram(dec, 6000, len(q))
    assert chisquare_pvalue(counts, expected) > ALPHA
    if method in ("cactus", "typical", "topk", "ears"):
        # These rules really move mass away from q (towards the draft): the histogram is not q's.
        assert chisquare_pvalue(counts, q.astype(np.float64), strict=False) < ALPHA


def test_the_end_set_is_end_of_generation_and_the_starts_of_stop_strings(tiny_pair):
    from cactus_gguf.speculative.vocab import end_set, token_pieces

    with Context.load(tiny_pair[0], context_options=CTX) as m:
        pieces = token_pieces(m.model)
        ends = end_set(m.model, pieces, (" cat", "xyz"), m.n_vocab)
        assert ends[m.model.eos]  # its piece is "" (a control token renders as nothing)
        # " cat" itself, the bare space (byte 0x20 and "▁": both a prefix of the stop string), and
        # "x" (a prefix of "xyz"); "cat" needs its space, "t" is no start
        want = {m.model.eos} | {t for t, x in enumerate(pieces) if x in (" cat", " ", "x")}
        assert set(np.flatnonzero(ends)) == want and len(want) == 5
        assert not end_set(m.model, pieces, (), m.n_vocab)[pieces.index(" cat")]


def test_protected_ends_first_token_follows_the_exact_law(tiny_pair):
    """With --protect-ends the first emitted token follows the exact law of native/law.c (a
    position where Cactus would lower the chance of ending runs SpS), and that law is not plain
    Cactus's: chi-square at ALPHA both ways."""
    from cactus_gguf.speculative.vocab import end_set, token_pieces

    ver, dft = tiny_pair
    sampling = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    q, p = first_position_dists(ver, dft, sampling)
    with Context.load(ver, context_options=CTX) as m:
        pieces = token_pieces(m.model)
        q_top = [pieces[t] for t in np.argsort(-q)[:3]]
    stops = tuple(x.lstrip() for x in q_top if x.strip())[:2]  # end set: the top of q, so
    with Context.load(ver, context_options=CTX) as m:          # ending is likely here
        ends = end_set(m.model, token_pieces(m.model), stops, m.n_vocab)
    assert q[ends].sum() > 0.2
    plain = reference.emitted_first_token_distribution(p, q, "cactus", delta=1.0)
    expected = reference.emitted_first_token_distribution(p, q, "cactus", delta=1.0,
                                                          end_set=ends, end_tau=0.0)
    assert expected[ends].sum() >= q[ends].sum() - 1e-6
    with decoder(ver, dft, k=1, method="cactus", delta=1.0, protect_ends=0.0,
                 stop=stops) as dec:
        counts = first_token_histogram(dec, 6000, len(q))
    assert chisquare_pvalue(counts, expected) > ALPHA
    if 6000 * ((plain - expected) ** 2 / np.maximum(expected, 1e-12)).sum() > 100:
        assert chisquare_pvalue(counts, plain, strict=False) < ALPHA


def test_sps_histogram_would_fail_against_a_wrong_distribution(tiny_pair):
    """The test above has power: the draft's own distribution p is rejected."""
    ver, dft = tiny_pair
    sampling = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    q, p = first_position_dists(ver, dft, sampling)
    with decoder(ver, dft, k=1, method="sps") as dec:
        counts = first_token_histogram(dec, 3000, len(q))
    mixed = 0.5 * (p + q).astype(np.float64)
    assert chisquare_pvalue(counts, mixed) < ALPHA


# ---- greedy equivalence, determinism, KV rollback -------------------------------------------

@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("method", ["sps", "cactus"])
def test_temperature_zero_equals_verifier_greedy(tiny_pair, k, method):
    ver, dft = tiny_pair
    with decoder(ver, dft, method="none", temp=0.0) as base:
        want = base.generate(PROMPT, n_predict=60, seed=0).tokens
    with decoder(ver, dft, k=k, method=method, temp=0.0) as dec:
        got = dec.generate(PROMPT, n_predict=60, seed=123)
    assert got.tokens == want
    assert len(want) > 10


def test_identical_draft_and_verifier_accept_everything_at_temperature_zero(tiny_pair):
    ver, _ = tiny_pair
    with decoder(ver, ver, k=4, method="sps", temp=0.0) as dec:
        res = dec.generate(PROMPT, n_predict=200, seed=0)
    s = res.stats
    assert s.n_drafted > 0 and s.n_accepted == s.n_drafted


def test_same_seed_same_text(tiny_pair):
    ver, dft = tiny_pair
    with decoder(ver, dft, k=3) as dec:
        a = dec.generate(PROMPT, n_predict=40, seed=7)
        b = dec.generate(PROMPT, n_predict=40, seed=7)
        c = dec.generate(PROMPT, n_predict=40, seed=8)
    assert a.tokens == b.tokens and a.text == b.text
    assert a.tokens != c.tokens


def test_kv_cache_rollback_matches_fresh_prefill(tiny_pair):
    ver, dft = tiny_pair
    with decoder(ver, dft, k=4, delta=2.0, top_k=8) as dec:
        # the first seed whose run is not cut short by an end-of-generation token
        res = next(r for r in (dec.generate(PROMPT, n_predict=150, seed=s) for s in range(20))
                   if r.stop_reason == "length")
        assert res.stats.n_steps > 20 and 0 < res.stats.n_accepted < res.stats.n_drafted
        prompt_ids = dec.tokenize(PROMPT)
        committed = prompt_ids + res.tokens
        v = dec.verifier
        # the loop left the verifier holding committed[:-1] with the newest token pending
        assert v.n_past == len(committed) - 1
        assert v.kv_pos_max() == v.n_past - 1
        after_loop = np.array(v.decode(committed[-1:], 1)[0])
    with Context.load(ver, context_options=CTX) as fresh:
        fresh_row = np.array(fresh.decode(committed, 1)[0])
        # control: one wrong token in the middle of the cache moves the logits far more
        fresh.clear()
        wrong = list(committed)
        wrong[len(wrong) // 2] = (wrong[len(wrong) // 2] + 1) % fresh.n_vocab
        wrong_row = np.array(fresh.decode(wrong, 1)[0])
    # Batches of different sizes sum in different orders: allow float noise, far below the
    # effect of a single stale KV entry.
    assert np.abs(after_loop - fresh_row).max() < 0.05
    assert np.abs(wrong_row - fresh_row).max() > 0.5


def test_stats_are_consistent(tiny_pair):
    ver, dft = tiny_pair
    with decoder(ver, dft, k=4) as dec:
        res = dec.generate(PROMPT, n_predict=50, seed=1)
    s = res.stats
    assert s.n_tokens == len(res.tokens) == 50
    assert res.stop_reason == "length"
    assert s.n_tokens <= s.n_accepted + s.n_steps  # each step emits AL + 1 (less at the end)
    assert 0 <= s.acceptance_rate <= 1 and 0 <= s.mean_accepted_length <= 4
    assert s.draft_seconds > 0 and s.verify_seconds > 0 and s.decode_seconds >= s.verify_seconds


# ---- vocabulary checks ------------------------------------------------------------------------

def test_vocab_mismatch_names_the_first_differing_id(tiny_pair, tmp_path):
    from support.tiny_gguf import WORDS, write_llama
    ver, _ = tiny_pair
    other_words = list(WORDS)
    other_words[3] = "▁bird"
    other = write_llama(tmp_path / "other.gguf", seed=5, words=other_words, logit_scale=1.0)
    with pytest.raises(VocabMismatchError, match=r"token id 262 is '▁cat' in the verifier and '▁bird'"):
        decoder(ver, other, draft_vocab="same")


def test_padded_vocabulary_is_accepted_and_tail_never_drafted(tiny_pair, tmp_path):
    from support.tiny_gguf import write_llama
    ver, _ = tiny_pair
    padded = write_llama(tmp_path / "padded.gguf", seed=2, n_pad=16, logit_scale=1.0)
    with decoder(ver, padded, k=3, temp=1.0, top_k=0) as dec:
        assert dec.draft.n_vocab == dec.verifier.n_vocab + 16
        res = dec.generate(PROMPT, n_predict=40, seed=0)
    assert max(res.tokens) < 281


def test_different_eos_is_refused(tiny_pair, tmp_path):
    from support.tiny_gguf import write_llama
    ver, _ = tiny_pair
    other = write_llama(tmp_path / "eos.gguf", seed=5, eos_id=0, logit_scale=1.0)
    with pytest.raises(VocabMismatchError, match="disagree on eos"):
        decoder(ver, other, draft_vocab="same")


# ------------------------------------------------------------------------------------------------
# Greedy, warps, randomness and endings on the loop's own tiny models
# ------------------------------------------------------------------------------------------------

PROMPTS = ["the cat sat on", "hello world", "def f(a):", "é中😀 a dog"]
N = 40  # tokens per run
TIE_GAP_TINY = 1e-3  # float32 tiny models: batch-size rounding differences are ~1e-5
# every acceptance rule reduces to exact match when q is one-hot (topk's accepted set stays within
# the verifier's support, so at temperature 0 it is the argmax alone)
LOSSLESS_AT_GREEDY = [("sps", 0.0, "taylor"), ("cactus", 1.0, "taylor"), ("cactus", 5.0, "exact"),
                      ("typical", 0.0, "taylor"), ("greedy", 0.0, "taylor"), ("topk", 0.0, "taylor")]
WARPS = dict(temp=0.7, top_k=5, top_p=0.8, min_p=0.05)
T = byte_token  # token id of a byte
A, B, C, D = (T(ord(c)) for c in "abcd")
SCRIPT = "xyz<STOP>jk"  # distinct bytes: a bigram chain can spell it
UTF8 = "é 中😀!"          # 2-, 1-, 3- and 4-byte characters, all bytes distinct


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny models of the sections below: ``ver`` and two noisy copies as drafts (``close``
    mostly agrees with it, ``far`` mostly not), and scripted *bigram* models
    (tests/support/tiny_gguf.py, write_llama(bigram=...)) that make llama.cpp emit chosen tokens."""
    d = tmp_path_factory.mktemp("decoding")
    letters = [T(ord(c)) for c in "efghilmnopqrstuv"]
    eos_mid = {A: B, B: EOS, EOS: C, C: D, D: A}  # ... a b EOS c d a ...
    return {
        "ver": write_llama(d / "ver.gguf", seed=11),
        "close": write_llama(d / "close.gguf", seed=11, noise=0.1, noise_seed=12),  # mostly agrees
        "far": write_llama(d / "far.gguf", seed=11, noise=0.6, noise_seed=13),      # mostly not
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
    }


@pytest.fixture(scope="module")
def greedy_base(models):
    with make_engine(models["ver"], method="none", temp=0.0) as alone:
        return {p: (alone.tokenize(p), alone.generate(p, n_predict=N, seed=0).tokens)
                for p in PROMPTS}


def stream(dec, prompt, **kw) -> tuple[list[str], object]:
    s = dec.stream(prompt, **kw)
    chunks = list(s)
    return chunks, s.result


# ---- greedy: the verifier's own ids at temperature <= 0 -----------------------------------------
# At temperature <= 0 (greedy, as in llama.cpp) the output ids equal the verifier's own greedy ids,
# for every k, acceptance rule that is lossless at temperature 0, drafter and prompt. The verifier
# scores drafts in batches of k+1 while the verifier alone decodes one token at a time; the kernels
# may round differently, so the only divergence allowed is at a position where the verifier's top
# two logits are within a hair of each other (a near-tie), and the tests check exactly that.

@pytest.mark.parametrize("k", [*range(1, 13), 16])
def test_temperature_zero_equals_the_verifier_greedy_for_every_k(models, greedy_base, k):
    n_runs = 0
    for draft, drafter in (("close", "model"), ("far", "model"), (None, "ngram")):
        for method, delta, solver in LOSSLESS_AT_GREEDY:
            with make_engine(models["ver"], draft and models[draft], k=k, method=method,
                              delta=delta, solver=solver, drafter=drafter, temp=0.0) as dec:
                for prompt, (ids, want) in greedy_base.items():
                    got = dec.generate(prompt, n_predict=N, seed=k).tokens
                    assert_greedy_equal(got, want, models["ver"], ids, TIE_GAP_TINY,
                                        what=f"{draft} {method} {drafter} {prompt!r}")
                    n_runs += 1
    assert n_runs == 3 * len(LOSSLESS_AT_GREEDY) * len(PROMPTS)


def test_the_speculative_runs_really_speculate(models, monkeypatch):
    """Control for the test above: drafts are proposed, and both accepted and rejected."""
    from support.harness import StepLog

    steps = StepLog.install(monkeypatch)
    for draft in ("close", "far"):
        with make_engine(models["ver"], models[draft], k=4, temp=0.0) as dec:
            for p in PROMPTS:
                dec.generate(p, n_predict=N, seed=0)
    drafted = sum(s[0] for s in steps.steps)
    accepted = sum(s[1] for s in steps.steps)
    assert drafted > 100 and 0 < accepted < drafted


@pytest.mark.parametrize("temp", [0.0, -1.0, -1e-9])
def test_negative_temperature_is_greedy_like_llama_cpp(models, greedy_base, temp):
    with make_engine(models["ver"], models["close"], k=5, temp=temp, top_k=3, top_p=0.5) as dec:
        for prompt, (ids, want) in greedy_base.items():
            assert_greedy_equal(dec.generate(prompt, n_predict=N, seed=1).tokens, want,
                                models["ver"], ids, TIE_GAP_TINY, what=f"temp {temp}")


def test_near_tie_check_has_power(models, greedy_base):
    """The near-tie allowance cannot hide a real divergence: a wrong token where the verifier is
    decided is reported."""
    prompt, (ids, want) = next(iter(greedy_base.items()))
    wrong = list(want)
    i = next(j for j in range(len(want)) if top_two_gap(models["ver"], ids + want[:j]) > 0.5)
    wrong[i] = (wrong[i] + 1) % 281
    with pytest.raises(AssertionError, match="top-two logit gap"):
        assert_greedy_equal(wrong, want, models["ver"], ids, TIE_GAP_TINY)


# ---- the rows the draft samples from and the acceptance test gets -------------------------------
# The draft samples each token from exactly the warped row that the acceptance test later
# receives, warped with the same top-k / top-p / min-p / temperature as the verifier; non-finite
# logits from a model are a clear error, never a token; two decoders in one process never share
# random state (what the native fuzz, tests/test_native_fuzz.py, cannot see).

def test_the_draft_samples_from_the_rows_the_acceptance_test_gets(models, monkeypatch):
    drafts: list[tuple[np.ndarray, np.ndarray, int]] = []  # (logits, probs written, token)
    draft = NativeSampler.draft

    def traced_draft(self, logits, probs_out, **kw):
        t = draft(self, logits, probs_out, **kw)
        drafts.append((np.array(logits), np.array(probs_out), t))
        return t

    monkeypatch.setattr(NativeSampler, "draft", traced_draft)
    steps = StepLog.install(monkeypatch, keep_probs=True)
    sp = SamplingParams(temperature=WARPS["temp"], top_k=WARPS["top_k"], top_p=WARPS["top_p"],
                        min_p=WARPS["min_p"])
    with make_engine(models["ver"], models["close"], k=4, **WARPS) as dec:
        for seed in range(5):
            drafts.clear()
            steps.steps.clear()
            dec.generate(PROMPT, n_predict=40, seed=seed)
            reference = NativeSampler(dec.verifier.n_vocab, sp, AcceptanceParams(), 0)
            i = 0
            for n, _, probs, tokens in steps.steps:
                for j in range(n):
                    logits, written, t = drafts[i + j]
                    assert tokens[j] == t                      # the token the draft sampled ...
                    np.testing.assert_array_equal(probs[j], written)  # ... from this very row
                    assert written[t] > 0
                    # the row is the draft's logits under the verifier's warps
                    np.testing.assert_array_equal(written, reference.warp(logits))
                    assert np.count_nonzero(written) <= WARPS["top_k"]
                i += n
            assert i == len(drafts) > 20  # every sampled draft was proposed (draft_p_min = 0)


def test_identical_models_accept_everything_under_aggressive_warps(models, monkeypatch):
    """Draft = verifier with top-k, top-p, min-p and temperature all active: if the two sides were
    warped differently, SpS would reject a share of the drafts."""
    steps = StepLog.install(monkeypatch)
    with make_engine(models["ver"], models["ver"], k=4, method="sps", **WARPS) as dec:
        for seed in range(10):
            dec.generate(PROMPT, n_predict=40, seed=seed)
    assert sum(s[0] for s in steps.steps) > 200
    assert steps.acceptance() >= 0.99


@pytest.mark.parametrize("who", ["verifier", "draft"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_model_logits_are_a_clear_error(models, monkeypatch, who, bad):
    decode = Context.decode
    target: dict[str, Context] = {}
    calls = []

    def poisoned(self, tokens, n_logits=1, **kw):
        out = decode(self, tokens, n_logits, **kw)
        if self is target.get("model") and n_logits:
            calls.append(1)
            if len(calls) == 3:  # a few steps in
                out = np.array(out)
                out[0, 7] = bad  # row 0 is always used (a later row only if reached)
        return out

    monkeypatch.setattr(Context, "decode", poisoned)
    with make_engine(models["ver"], models["close"], k=3, **WARPS) as dec:
        target["model"] = getattr(dec, who)
        chunks: list[str] = []
        with pytest.raises(NonFiniteLogitsError, match="non-finite logits"):
            for piece in dec.stream(PROMPT, n_predict=40, seed=0):
                chunks.append(piece)
        monkeypatch.undo()
        # the decoder stays usable
        assert dec.generate(PROMPT, n_predict=10, seed=0).stats.n_tokens == 10


def test_two_decoders_in_one_process_never_share_random_state(models):
    with make_engine(models["ver"], models["close"], k=3, temp=1.0) as a:
        alone = [a.generate(PROMPT, n_predict=30, seed=s).tokens for s in (1, 2)]
    with make_engine(models["ver"], models["close"], k=3, temp=1.0) as a, \
            make_engine(models["ver"], models["close"], k=3, temp=1.0) as b:
        # interleave the two streams piece by piece
        sa, sb = a.stream(PROMPT, n_predict=30, seed=1), b.stream(PROMPT, n_predict=30, seed=2)
        done_a = done_b = False
        while not (done_a and done_b):
            if not done_a:
                done_a = next(sa, None) is None
            if not done_b:
                done_b = next(sb, None) is None
        assert sa.result.tokens == alone[0]
        assert sb.result.tokens == alone[1]
        assert alone[0] != alone[1]


# ---- how a generation ends: end-of-generation tokens, stop strings, UTF-8 -----------------------
# Scripted bigram models force each case deterministically: an end-of-generation token inside an
# accepted block ends the output there; a drafted EOS that the verifier rejects does not end it;
# stop strings match across token boundaries and never reach a streamed chunk; chunks hold whole
# UTF-8 characters only and join to exactly the final text.

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
        # the rule accepted all four; the generation used b and the EOS that ended it
        assert (res.stats.n_accepted, res.stats.n_drafts_used) == (4, 2)
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
    a substring of its own text gives exactly the text before its first occurrence. Protected
    ends are off: they read the stop strings (a token that starts one is an end), so with them a
    stop string also changes the law of what comes before it."""
    rng = np.random.default_rng(0)
    checked = 0
    with make_engine(models["ver"], models["close"], k=4, temp=0.8, protect_ends="off") as dec:
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
