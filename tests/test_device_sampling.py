"""Warps on the device (``backend_sampling``, speculative/device.py) on tiny GGUF models that
llama.cpp loads and runs: the device's top-K rows are the full rows' values, a tie at the K-th
logit is detected, and generation gives the same tokens for the same seed as the full rows (SpS,
Cactus, the verifier alone, several drafters and settings), falling back in full exactly where a
row is tied; the first emitted token follows the exact law on the device path (chi-square).
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from cactus_gguf.llama import Context, ContextOptions
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams, reference
from cactus_gguf.sampling.native import NativeArgumentError, pack_allowed, read_rows
from cactus_gguf.speculative import device

from support.harness import make_engine
from support.tiny_gguf import write_llama

CTX = ContextOptions(n_ctx=512, n_batch=64, n_threads=1)
PROMPT = "the cat sat on"
ALPHA = 0.001


@pytest.fixture(scope="module")
def tied_pair(tmp_path_factory):
    """A pair whose output rows are 0 for ids 3 .. 79: logit exactly 0 there, so a row whose
    K-th largest logit falls among them is tied at the K-th place (top-k 110 often does)."""
    d = tmp_path_factory.mktemp("tied")
    zero = range(3, 80)
    return (write_llama(d / "v.gguf", seed=11, zero_output_rows=zero),
            write_llama(d / "d.gguf", seed=11, noise=0.5, noise_seed=12, zero_output_rows=zero))


class Calls:
    """Counts the compact verifications and the full decodes again of an engine's steps."""

    def __init__(self, monkeypatch):
        self.compact = self.full_again = 0
        verify, again = NativeSampler.verify_device, Context.decode_full_again

        def counted_verify(s, *a, **kw):
            got = verify(s, *a, **kw)
            self.compact += got is not None  # a step run on the device's rows
            return got

        def counted_again(c):
            self.full_again += 1
            return again(c)

        monkeypatch.setattr(NativeSampler, "verify_device", counted_verify)
        monkeypatch.setattr(Context, "decode_full_again", counted_again)


def both_ways(engine, seeds, n_predict=40, **request):
    """(full-row tokens, device tokens) per seed."""
    return [(engine.generate(PROMPT, n_predict=n_predict, seed=s, backend_sampling="off", **request
                             ).tokens,
             engine.generate(PROMPT, n_predict=n_predict, seed=s, backend_sampling="on", **request
                             ).tokens) for s in seeds]


def test_device_rows_hold_the_full_rows_top_k_with_their_logits(tiny_pair):
    """Every output row of a multi-row decode: the K + 1 device candidates hold the full row's
    top K (lowest ids first on ties), with bit-identical float32 logits."""
    K, tokens = 20, [1, 40, 50, 60, 70, 80, 90, 100, 110, 120]
    with Context.load(tiny_pair[0], context_options=CTX) as full, \
            Context.load(tiny_pair[0], context_options=CTX) as dev:
        rows = np.array(full.decode(tokens, n_logits=8))
        assert dev.can_sample_on_device and dev.set_device_top_k(K + 1)
        dev.decode(tokens, n_logits=8)
        got = device.read_rows(dev, 8, K)
        assert got is not None and got[0].shape == (8, K + 1)
        for row, ids, logits, (raw_ids, _) in zip(rows, *got, dev.candidates(8)):
            assert np.array_equal(logits.view(np.uint32), row[ids].view(np.uint32))
            assert ids.tolist() == sorted(raw_ids.tolist())  # sorted by id, nothing lost
            top = np.lexsort((np.arange(len(row)), -row))[:K]
            assert set(top) <= set(ids.tolist())
        dev.set_device_top_k(0)
        assert np.array_equal(np.array(dev.decode([7], n_logits=1))[0],
                              np.array(full.decode([7], n_logits=1))[0])


class FakeRows:
    """A ``Context.row_reader`` over rows given as lists: the native reader's inputs without a
    model (ctypes callbacks standing in for llama.cpp's accessors)."""

    def __init__(self, rows):
        self.ids = [np.array(i, np.int32) for i, _ in rows]
        self.logits = [np.array(v, np.float32) for _, v in rows]
        ptr = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)
        count = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int32)
        self._fns = (ptr(lambda _, i: self.ids[i].ctypes.data),
                     count(lambda _, i: len(self.ids[i])),
                     ptr(lambda _, i: self.logits[i].ctypes.data),
                     count(lambda _, i: len(self.logits[i])))
        self.reader = (0, *(ctypes.cast(f, ctypes.c_void_p).value for f in self._fns))

    def read(self, width=3, n_vocab=100):
        return read_rows(self.reader, len(self.ids), width, n_vocab)


def test_a_tie_at_the_kth_logit_is_not_exact():
    ids = [5, 3, 9]
    good = (ids, [1.0, 2.0, 0.5])
    got = FakeRows([good, (ids, [2.0, 2.0, 1.0])]).read()  # a tie inside the top K is exact
    assert got[0].tolist() == [[3, 5, 9]] * 2
    assert got[1].tolist() == [[2.0, 1.0, 0.5], [2.0, 2.0, 1.0]]
    assert FakeRows([good, (ids, [1.0, 2.0, 1.0])]).read() == 1  # row 1's K-th is tied
    assert FakeRows([(ids[:2], [2.0, 1.0]), good]).read() == 0  # too few candidates
    assert FakeRows([good, (ids, [1.0, float("nan"), 0.5])]).read() == 1
    assert FakeRows([([5, 5, 9], [1.0, 2.0, 0.5])]).read() == 0  # a repeated id
    assert FakeRows([good]).read(n_vocab=9) == 0  # an id outside the vocabulary


@pytest.mark.parametrize("k", [0, 1, 4, 16])
@pytest.mark.parametrize("method", ["sps", "cactus"])
def test_compact_verification_is_the_full_one(method, k):
    """``verify_compact`` on the rows' top K + 1 (and the draft's p over its own ids) against
    ``verify`` on the full rows: the same result, field for field, and the same uniforms used,
    over 40 random steps; with Cactus's end set at random ids."""
    V, K, rng = 300, 8, np.random.default_rng(k)
    sp = SamplingParams(temperature=0.8, top_k=K, top_p=0.95, min_p=0.02)
    end = np.zeros(V, bool)
    end[rng.choice(V, 20, replace=False)] = True
    acc = AcceptanceParams(method=method, delta=1.0, top_gap=0.5, output_kl=True, end_tau=0.05,
                           end_mask=pack_allowed(end))
    full, compact, drafter = (NativeSampler(V, sp, acc, 7) for _ in range(3))
    for _ in range(40):
        base = 2 * rng.standard_normal(V)
        rows = (base + rng.standard_normal((k + 1, V))).astype(np.float32)
        top = np.sort(np.argsort(-rows, axis=1, kind="stable")[:, :K + 1], axis=1).astype(np.int32)
        probs = np.zeros((k, V), np.float32)
        tokens = np.zeros(k, np.int32)
        d_ids = np.full((k, K + 1), -1, np.int32)
        for i in range(k):
            tokens[i] = drafter.draft((base + rng.standard_normal(V)).astype(np.float32), probs[i])
            support = np.flatnonzero(probs[i])
            d_ids[i, :len(support)] = support
        d_p = np.where(d_ids >= 0, np.take_along_axis(probs, np.maximum(d_ids, 0), 1), 0)
        want = full.verify(probs, tokens, rows)
        got = compact.verify_compact(top, np.take_along_axis(rows, top, 1), d_ids,
                                     d_p.astype(np.float32), tokens)
        assert got == want
        assert compact.peek_uniforms(1) == full.peek_uniforms(1)


def test_compact_verification_refuses_rows_out_of_order():
    s = NativeSampler(50, SamplingParams(temperature=1.0, top_k=2), AcceptanceParams(), 0)
    ids, logits = np.array([[4, 2, 9]], np.int32), np.zeros((1, 3), np.float32)
    with pytest.raises(NativeArgumentError):
        s.verify_compact(ids, logits, None, None, np.zeros(0, np.int32))


@pytest.mark.parametrize("k", [4, 16])
@pytest.mark.parametrize("method", ["sps", "cactus", "none"])
def test_same_tokens_as_the_full_rows(tiny_pair, monkeypatch, method, k):
    calls = Calls(monkeypatch)
    with make_engine(*tiny_pair, temp=1.0, top_k=8, top_p=0.95, min_p=0.05, k=k,
                     method=method) as eng:
        for full, dev in both_ways(eng, range(3)):
            assert full == dev and len(full) > 10
    # (a tie at the K-th logit does happen here: ids 3 and 275 share a logit at one step of k 16,
    # and that step runs in full)
    assert (calls.compact > 0) == (method != "none")


@pytest.mark.parametrize("request_", [
    {"drafter": "hybrid", "ngram_max": 2},
    {"draft_temp": 0.3, "k": 3},  # (a fixed k: -k auto drafts by measured seconds, so two
    # runs of a seed may draft differently and spend the random stream differently)
    {"draft_temp": 0.0},
    {"method": "cactus", "protect_ends": 0.1, "stop": [" cat"], "top_gap": 0.5},
    {"method": "ears", "ears_alpha": 0.5},
    {"method": "typical"},
], ids=["hybrid", "draft-temp", "greedy-draft", "cactus-ends", "ears", "typical"])
def test_same_tokens_with_other_settings(tiny_pair, monkeypatch, request_):
    calls = Calls(monkeypatch)
    with make_engine(*tiny_pair, temp=0.8, top_k=12, **{"k": 4, "method": "sps", **request_}
                     ) as eng:
        for full, dev in both_ways(eng, range(2)):
            assert full == dev
    assert calls.compact > 0


def test_ties_fall_back_to_the_full_rows_with_the_same_tokens(tied_pair, monkeypatch):
    calls = Calls(monkeypatch)
    with make_engine(*tied_pair, temp=1.0, top_k=110, k=4, method="sps") as eng:
        for full, dev in both_ways(eng, range(4), n_predict=30):
            assert full == dev
    assert calls.full_again > 0 and calls.compact > 0  # some rows tied, others not


def test_untruncated_requests_keep_the_full_rows(tiny_pair, monkeypatch):
    calls = Calls(monkeypatch)
    with make_engine(*tiny_pair, temp=1.0, top_k=0, k=4, method="sps") as eng:
        for full, dev in both_ways(eng, range(2), n_predict=20):
            assert full == dev
        for grammar_free in both_ways(eng, [0], n_predict=10, top_k=8, n_probs=2):
            assert grammar_free[0] == grammar_free[1]
    assert calls.compact == 0


def test_first_emitted_token_follows_the_sps_law_on_the_device(tiny_pair):
    ver, dft = tiny_pair
    sampling = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    dists = []
    for path in (ver, dft):
        with Context.load(path, context_options=CTX) as m:
            row = np.array(m.decode(m.model.tokenize(PROMPT), 1)[0])
            dists.append(NativeSampler(m.n_vocab, sampling, AcceptanceParams(), 0).warp(row))
    q, p = dists
    expected = reference.emitted_first_token_distribution(p, q, "sps")
    counts = np.zeros(len(q), np.int64)
    with make_engine(ver, dft, temp=1.0, top_k=8, k=1, method="sps",
                     backend_sampling="on") as eng:
        for seed in range(4000):
            counts[eng.generate(PROMPT, n_predict=2, seed=seed).tokens[0]] += 1
    from scipy import stats
    support = expected > 0
    assert counts[~support].sum() == 0
    exp = expected[support] / expected[support].sum() * counts.sum()
    assert stats.chisquare(counts[support], exp).pvalue > ALPHA


def test_the_statistics_say_whether_the_device_rows_were_used(tiny_pair, tied_pair):
    """Issue 52: ``--json`` did not say whether ``--backend-sampling`` was used (it falls back to
    the full rows silently under ``auto``: a grammar, log-probabilities, top-k 0 ...)."""
    with make_engine(*tiny_pair, temp=0.8, top_k=20, k=4, method="sps",
                     context=CTX) as eng:
        on = eng.generate(PROMPT, n_predict=16, seed=1, backend_sampling="on").stats
        off = eng.generate(PROMPT, n_predict=16, seed=1, backend_sampling="off").stats
        logprobs = eng.generate(PROMPT, n_predict=16, seed=1, backend_sampling="auto",
                                n_probs=1).stats
    assert (on.n_device_steps, on.n_device_fallbacks) == (on.n_steps, 0)
    assert on.backend_sampling_used is True and on.as_dict()["backend_sampling_used"] is True
    for s in (off, logprobs):
        assert (s.n_device_steps, s.backend_sampling_used) == (0, False)
    with make_engine(*tied_pair, temp=0.8, top_k=110, k=2, method="sps", context=CTX) as eng:
        tied = eng.generate(PROMPT, n_predict=30, seed=0, backend_sampling="on").stats
    assert tied.n_device_steps == tied.n_steps and 0 < tied.n_device_fallbacks
    assert tied.backend_sampling_used == (tied.n_device_fallbacks < tied.n_steps)
    from support.harness import run_cli
    import json

    r = run_cli("run", str(tiny_pair[0]), str(tiny_pair[1]), "-p", PROMPT, "-n", "8", "-t", "1",
                "-c", "256", "--top-k", "20", "--backend-sampling", "on", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["backend_sampling_used"] is True and out["n_device_steps"] == out["n_steps"]
