"""Models with a recurrent state (hybrids of attention with short convolutions, gated delta-net or
Mamba-2; tiny random-weight GGUFs of tests/support/tiny_gguf.py that llama.cpp runs for real):
every rollback the context makes leaves the state a fresh prefill of the same tokens gives.

"Equal to a fresh prefill" is measured on the logits of one more token decoded after the rollback,
against a new context that decoded the same tokens from empty (max |difference|; these models'
logits spread over about +-15 and a wrong state moves them by several units, see
test_llama_cpp_alone_restores_a_wrong_state_outside_the_window).
"""
from __future__ import annotations

import numpy as np
import pytest

import llama_cpp

from cactus_gguf.llama import Context

from support.recurrent import TOL, error_after, opts
from support.tiny_gguf import text_tokens, write_lfm2, write_llama, write_nemotron_h, write_qwen35

WRITERS = {"lfm2": write_lfm2, "qwen35": write_qwen35, "nemotron_h": write_nemotron_h}
ARCHS = tuple(WRITERS)
PROMPT = text_tokens("the cat sat on the mat")  # 22 byte tokens


@pytest.fixture(scope="module")
def hybrid_paths(tmp_path_factory):
    """{arch: path} of one tiny model per hybrid architecture, and "llama": a KV-only one."""
    d = tmp_path_factory.mktemp("hybrids")
    out = {arch: write(d / f"{arch}.gguf", seed=11) for arch, write in WRITERS.items()}
    out["llama"] = write_llama(d / "llama.gguf", seed=11)
    return out


@pytest.mark.parametrize("arch", ARCHS + ("llama",))
def test_recurrent_is_llama_cpps_own_answer(hybrid_paths, arch):
    with Context.load(hybrid_paths[arch], context_options=opts(n_rs_seq=6)) as c:
        assert c.recurrent is (arch != "llama")
        assert c.recurrent is bool(llama_cpp.llama_model_is_hybrid(c.model.ptr))
        # llama.cpp keeps snapshots for the architectures it can roll back in place
        assert c.n_rs_seq == {"llama": 0, "nemotron_h": 6, "lfm2": 6, "qwen35": 6}[arch]
    with Context.load(hybrid_paths["qwen35"], context_options=opts(n_rs_seq=40, n_batch=16)) as c:
        assert c.n_rs_seq == 14  # n_batch - 2: llama.cpp aborts unless n_ubatch > n_rs_seq + 1


# (batches decoded after the prompt, tokens dropped at once or one drop after another)
CASES = {
    "in the window: 1 of a 5-token batch": ([5], [1]),
    "in the window: 4 of a 5-token batch": ([5], [4]),
    "the whole batch": ([5], [5]),
    "a batch of 3 then 1, drop 3": ([3, 1], [3]),
    "three one-token decodes, drop 2": ([1, 1, 1], [2]),
    "twice before the next decode": ([5], [1, 2]),
    "into the prompt": ([5], [12]),
    "everything": ([5], [27]),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", list(CASES))
def test_every_truncation_equals_a_fresh_prefill(hybrid_paths, arch, case):
    batches, drops = CASES[case]
    with Context.load(hybrid_paths[arch], context_options=opts()) as c:
        c.sync(PROMPT)
        extra = text_tokens(" and the dog sat")
        for n in batches:
            c.decode(extra[:n], n_logits=1)
            extra = extra[n:]
        for d in drops:
            c.truncate(c.n_past - d)
        assert c.n_past == len(PROMPT) + sum(batches) - sum(drops)
        assert error_after(c, hybrid_paths[arch]) < TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_llama_cpp_alone_restores_a_wrong_state_outside_the_window(hybrid_paths, arch):
    """The control: llama_memory_seq_rm says yes to dropping a whole batch of 5 (R = 8) and the
    state it leaves is far from a fresh prefill's; the context never asks it that."""
    with Context.load(hybrid_paths[arch], context_options=opts(n_rs_seq=8)) as c:
        c.decode(PROMPT, n_logits=0)
        c.decode(text_tokens(" and "), n_logits=1)
        assert llama_cpp.llama_memory_seq_rm(c.memory, 0, len(PROMPT), -1)
        del c.tokens[len(PROMPT):]
        assert error_after(c, hybrid_paths[arch]) > 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_a_declared_rollback_is_restored_from_a_checkpoint_without_decoding_from_empty(
        hybrid_paths, arch, monkeypatch):
    """A draft model's pattern: catch up, then one-token decodes each declaring every drafted
    token droppable; forget() lands on the checkpoint saved before the first draft, and
    truncate() decodes only the tokens between it and the kept length."""
    with Context.load(hybrid_paths[arch], context_options=opts(n_rs_seq=0)) as c:
        c.sync(PROMPT[:-1])
        c.decode(PROMPT[-1:], n_logits=1)  # the catch-up: committed, never dropped
        base = c.n_past
        for i, t in enumerate(text_tokens(" dog")):
            c.decode([t], n_logits=1, may_drop=i + 1)
        assert c.forget(base + 2) == base  # the checkpoint before d_1
        decoded = []
        decode = Context.decode
        monkeypatch.setattr(Context, "decode", lambda self, toks, *a, **kw: (
            decoded.append(list(toks)), decode(self, toks, *a, **kw))[1])
        c.decode(text_tokens(" d"), n_logits=1)
        c.decode(text_tokens("o"), n_logits=1, may_drop=1)
        c.truncate(base + 1)
        assert decoded[-1] == text_tokens(" ")  # from the checkpoint at base, not from empty
        monkeypatch.undo()
        assert error_after(c, hybrid_paths[arch]) < TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_thousands_of_tokens_of_random_rollbacks_equal_fresh_prefills(hybrid_paths, arch):
    """Verification-like batches of 1 .. 7 tokens and draft-like runs of one-token decodes,
    each rolled back by a random amount it declared (forget, then the rest decoded again, as the
    engine does) or any amount (truncate); the state is compared with a fresh prefill every 40
    operations."""
    rng = np.random.default_rng(5)
    vocab = np.arange(3 + 32, 3 + 127)  # printable ASCII byte tokens
    n_decoded = 0  # tokens decoded by the loop (then partly rolled back)
    with Context.load(hybrid_paths[arch], context_options=opts(n_rs_seq=4, n_batch=16)) as c:
        c.sync(PROMPT)
        for op in range(1, 601):
            if c.n_past > 400:
                c.truncate(int(rng.integers(1, 60)))
            if rng.random() < 0.5:  # a verification: pending + drafts, a prefix of drafts kept
                m = int(rng.integers(1, 8))
                c.decode(rng.choice(vocab, m).tolist(), n_logits=m, may_drop=m - 1)
                kept = c.forget(c.n_past - int(rng.integers(0, m)))
                n_decoded += m
            else:  # a draft: one-token decodes, then back to what the step kept
                base = c.n_past
                m = int(rng.integers(1, 6))
                for i in range(m):
                    c.decode(rng.choice(vocab, 1).tolist(), n_logits=1, may_drop=i + 1)
                kept = c.forget(base + int(rng.integers(0, m + 1)))
                n_decoded += m
            c.decode(rng.choice(vocab, 1 + int(rng.integers(0, 3))).tolist(), n_logits=1)
            assert kept <= c.n_past
            if op % 40 == 0:
                if rng.random() < 0.5:
                    c.truncate(c.n_past - int(rng.integers(1, 20)))
                assert error_after(c, hybrid_paths[arch]) < TOL, op
    assert n_decoded >= 1800
