"""Issue #6, kind 4 in the decoding loop: what the native fuzz (tests/test_native_fuzz.py) cannot see.

The draft samples each token from exactly the warped row that the acceptance test later receives,
warped with the same top-k / top-p / min-p / temperature as the verifier; non-finite logits from a
model are a clear error, never a token; two decoders in one process never share random state.
"""
from __future__ import annotations

import numpy as np
import pytest

from cactus_gguf.llama import Context
from cactus_gguf.sampling import (AcceptanceParams, NativeSampler, NonFiniteLogitsError,
                                SamplingParams)

from support.harness import StepLog, make_engine
from support.tiny_gguf import write_llama

PROMPT = "the cat sat on"
WARPS = dict(temp=0.7, top_k=5, top_p=0.8, min_p=0.05)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("sampling")
    return {"ver": write_llama(d / "ver.gguf", seed=11),
            "dft": write_llama(d / "dft.gguf", seed=11, noise=0.1, noise_seed=12)}


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
    with make_engine(models["ver"], models["dft"], k=4, **WARPS) as dec:
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
    with make_engine(models["ver"], models["dft"], k=3, **WARPS) as dec:
        target["model"] = getattr(dec, who)
        chunks: list[str] = []
        with pytest.raises(NonFiniteLogitsError, match="non-finite logits"):
            for piece in dec.stream(PROMPT, n_predict=40, seed=0):
                chunks.append(piece)
        monkeypatch.undo()
        # the decoder stays usable
        assert dec.generate(PROMPT, n_predict=10, seed=0).stats.n_tokens == 10


def test_two_decoders_in_one_process_never_share_random_state(models):
    with make_engine(models["ver"], models["dft"], k=3, temp=1.0) as a:
        alone = [a.generate(PROMPT, n_predict=30, seed=s).tokens for s in (1, 2)]
    with make_engine(models["ver"], models["dft"], k=3, temp=1.0) as a, \
            make_engine(models["ver"], models["dft"], k=3, temp=1.0) as b:
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
