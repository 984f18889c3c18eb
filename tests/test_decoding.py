"""The decoding loop on tiny generated GGUF models that llama.cpp loads and runs for real.

Statistical tests use Pearson's chi-square at significance alpha = 0.001 with fixed seeds, so each
is deterministic; the expected distributions come from the NumPy reference (cactus_gguf/sampling/reference.py).
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps_stats

from cactus_gguf.llama import Context, ContextOptions
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams
from cactus_gguf.sampling import reference
from cactus_gguf.speculative import VocabMismatchError

from support.harness import make_engine

ALPHA = 0.001
CTX = ContextOptions(n_ctx=512, n_batch=64, n_threads=1)
PROMPT = "the cat sat on"


def decoder(ver, dft, *, temp=1.0, top_k=8, **kw):
    """An engine over the tiny pair at temperature 1, top-k 8 unless told otherwise."""
    return make_engine(ver, dft, temp=temp, top_k=top_k, **kw)


def first_position_dists(ver_path, dft_path, sampling):
    """Warped verifier and draft distributions q, p (float32 [V]) after PROMPT."""
    out = []
    for path in (ver_path, dft_path):
        with Context.load(path, context_options=CTX) as m:
            toks = m.model.tokenize(PROMPT)
            row = np.array(m.decode(toks, 1)[0])
            out.append(NativeSampler(m.n_vocab, sampling, AcceptanceParams(), 0).warp(row))
    return out


def first_token_histogram(dec, n_runs, V):
    counts = np.zeros(V, np.int64)
    for seed in range(n_runs):
        res = dec.generate(PROMPT, n_predict=2, seed=seed)
        counts[res.tokens[0] if res.tokens else dec.verifier.model.eos] += 1
    return counts


def chisquare_pvalue(counts, expected_probs, strict=True):
    """Pearson chi-square p-value of ``counts`` against ``expected_probs``; an emitted token outside
    the expected support fails (strict) or gives p = 0."""
    support = expected_probs > 0
    if counts[~support].sum():
        assert not strict, "a token outside the expected support was emitted"
        return 0.0
    if support.sum() == 1:
        return 1.0  # a point mass, and every count is on it
    exp = expected_probs[support] / expected_probs[support].sum() * counts.sum()
    return sps_stats.chisquare(counts[support], exp).pvalue


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
