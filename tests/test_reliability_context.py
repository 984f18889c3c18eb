"""Issue #6, kind 5: context limits.

Neither context is ever decoded past its n_ctx: the draft length shrinks to the free space, drafting
stops for the rest of a generation when the draft's context is full (or the prompt does not fit it),
and generation stops with reason "length" ("context full") when the verifier's is. A prompt that
does not fit the verifier's context is a clear error before any decoding. The verification batch
(pending token + k drafts) is also kept within n_batch. (llama.cpp rounds n_ctx up to a multiple
of 256, so the tests use n_ctx = 256 / 512.)
"""
from __future__ import annotations

import numpy as np
import pytest

from cactus_gguf.llama import Context
from cactus_gguf.errors import ContextLengthError

from support.tiny_gguf import BOS, EOS, byte_token, write_llama
from support.harness import KvShadow, StepLog, ctx, make_engine


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("context")
    # EOS never sampled (zero output row): runs end only by length or a full context
    return {"ver": write_llama(d / "ver.gguf", seed=31, zero_output_rows=[EOS]),
            "dft": write_llama(d / "dft.gguf", seed=31, zero_output_rows=[EOS], noise=0.1,
                               noise_seed=32)}


def prompt_ids(n: int) -> list[int]:
    rng = np.random.default_rng(n)
    return [BOS] + [byte_token(int(b)) for b in rng.integers(0x61, 0x7B, n - 1)]


class Watch(KvShadow):
    """Checks, before every decode, that it fits the context (so a DecodeError never even arises)."""

    def before_decode(self, ctx, tokens, n_logits):
        assert ctx.n_past + len(tokens) <= ctx.n_ctx, (ctx.model.path.name, ctx.n_past, len(tokens))
        assert len(tokens) <= ctx.n_ctx
        self.max_batch = max(getattr(self, "max_batch", 0), n_logits)


def verifier_alone(models, ids, n_predict, n_ctx):
    with make_engine(models["ver"], method="none", temp=0.0, context=ctx(n_ctx)) as alone:
        return alone.generate(ids, n_predict=n_predict, seed=0)


@pytest.mark.parametrize("k", [1, 4, 9])
@pytest.mark.parametrize("n_prompt", [200, 254, 255])
def test_verifier_context_full_stops_with_length(models, monkeypatch, k, n_prompt):
    Watch.install(monkeypatch)  # asserts before every decode that it fits
    ids = prompt_ids(n_prompt)
    with make_engine(models["ver"], models["dft"], k=k, temp=0.0, context=ctx(256)) as dec:
        assert dec.verifier.n_ctx == dec.draft.n_ctx == 256
        res = dec.generate(ids, n_predict=1000, seed=0)
    assert res.stop_reason == "length" and res.message == "context full (n_ctx=256)"
    # the last token is sampled from a full context and never decoded: n_ctx + 1 committed
    assert len(ids) + len(res.tokens) == 257
    assert res.tokens == verifier_alone(models, ids, 1000, 256).tokens


def test_draft_context_smaller_than_the_verifiers(models, monkeypatch):
    watch = Watch.install(monkeypatch)
    steps = StepLog.install(monkeypatch)
    ids = prompt_ids(100)
    with make_engine(models["ver"], models["dft"], k=6, temp=0.0, context=ctx(512),
                      draft_context=ctx(256)) as dec:
        assert (dec.verifier.n_ctx, dec.draft.n_ctx) == (512, 256)
        res = dec.generate(ids, n_predict=1000, seed=0)
        assert dec.draft.n_past <= 256
    assert res.stop_reason == "length" and len(ids) + len(res.tokens) == 513
    # drafting happened while the draft had room, then the verifier went on alone
    drafted = [s[0] for s in steps.steps]
    last_draft = max(i for i, n in enumerate(drafted) if n > 0)
    assert sum(drafted) > 50 and last_draft < len(drafted) - 50
    assert not any(drafted[last_draft + 1:])
    assert res.tokens == verifier_alone(models, ids, 1000, 512).tokens
    assert max(n for m, t, n in watch.decodes if m.n_ctx == 256) == 1  # the draft: 1 logits row


def test_prompt_too_long_for_the_draft_skips_the_draft(models, monkeypatch):
    watch = Watch.install(monkeypatch)
    steps = StepLog.install(monkeypatch)
    ids = prompt_ids(300)
    with make_engine(models["ver"], models["dft"], k=4, temp=0.0, context=ctx(512),
                      draft_context=ctx(256)) as dec:
        res = dec.generate(ids, n_predict=50, seed=0)
        assert dec.draft.n_past == 0
    assert not any(w[0] is not None and w[0].n_ctx == 256 for w in watch.decodes)
    assert all(s[0] == 0 for s in steps.steps)
    assert res.tokens == verifier_alone(models, ids, 50, 512).tokens


@pytest.mark.parametrize("n_prompt", [256, 257, 1000])
def test_prompt_that_does_not_fit_is_an_error_before_any_decoding(models, monkeypatch, n_prompt):
    watch = Watch.install(monkeypatch)
    with make_engine(models["ver"], models["dft"], context=ctx(256)) as dec:
        with pytest.raises(ContextLengthError, match=rf"the prompt is {n_prompt} tokens and n_ctx "
                                                     rf"is 256: raise n_ctx above {n_prompt}"):
            dec.generate(prompt_ids(n_prompt), n_predict=10, seed=0)
        assert watch.decodes == []
        # text prompts too
        with pytest.raises(ContextLengthError):
            dec.generate("a" * 600, n_predict=10, seed=0)
        assert watch.decodes == []


@pytest.mark.parametrize("n_batch,k", [(4, 8), (2, 5), (1, 4), (4, 4)])
def test_draft_length_must_fit_the_batch(models, n_batch, k):
    """The k+1 verified tokens go in one llama_decode: k >= n_batch is refused up front (a silent
    cap would quietly turn speculation off with -b 1), before anything is decoded; with method
    none nothing is drafted and any k goes."""
    from cactus_gguf.errors import InputError
    from cactus_gguf.options import LoadOptions, Request, validate_pairing

    with pytest.raises(InputError, match=f"k={k} must be below n_batch={n_batch}"):
        validate_pairing(LoadOptions(n_batch=n_batch), Request(k=k))
    validate_pairing(LoadOptions(n_batch=n_batch), Request(k=k, method="none"))
    with make_engine(models["ver"], models["dft"], k=1, temp=0.0,
                     context=ctx(256, n_batch=n_batch)) as dec:
        with pytest.raises(InputError, match=f"k={k} must be below n_batch={n_batch}"):
            dec.generate("abc", n_predict=4, k=k)
        assert dec.verifier.n_past == 0
        assert len(dec.generate("abc", n_predict=4, k=k, method="none").tokens) == 4


def test_draft_length_is_kept_within_the_batch(models, monkeypatch):
    watch = Watch.install(monkeypatch)
    steps = StepLog.install(monkeypatch)
    ids = prompt_ids(40)
    n_batch, k = 4, 3
    with make_engine(models["ver"], models["dft"], k=k, temp=0.0,
                      context=ctx(256, n_batch=n_batch)) as dec:
        assert dec.verifier.n_batch == n_batch
        res = dec.generate(ids, n_predict=60, seed=0)
    assert res.stats.n_tokens == 60
    assert max(s[0] for s in steps.steps) == n_batch - 1  # pending token + drafts <= n_batch
    assert watch.max_batch <= n_batch
    assert res.tokens == verifier_alone(models, ids, 60, 256).tokens


def test_decode_returns_the_right_rows_when_the_batch_is_chunked(models):
    """Regression: with n tokens > n_batch the requested logits rows could straddle two
    llama_decode calls, and rows of the earlier call were read from a stale buffer."""
    toks = [BOS] + list(range(100, 109))  # 10 tokens
    with Context.load(models["ver"], context_options=ctx(256, n_batch=64)) as m:
        want = np.array(m.decode(toks, 5))
    for n_batch in (8, 4, 3, 5):
        with Context.load(models["ver"], context_options=ctx(256, n_batch=n_batch)) as m:
            got = np.array(m.decode(toks, min(5, n_batch)))
            np.testing.assert_allclose(got, want[-got.shape[0]:], atol=1e-3)
            assert m.n_past == 10 and m.kv_pos_max() == 9


def test_llama_log_captures_nest():
    """A capture inside another (a model load inside a caller's capture): each gets the lines of
    its own block, and leaving the inner one leaves the outer one in place (it removed the outer
    list when both held equal lines)."""
    from cactus_gguf.llama import log

    with log.capture() as outer:
        with log.capture() as inner:
            log._log_message(2, b"one\n", None)
        log._log_message(2, b"two\n", None)
    assert (outer, inner) == (["one", "two"], ["one"])
    assert log._captures == []
