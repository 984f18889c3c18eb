"""The verifier drafts for itself: ``--drafter mtp`` on tiny random-weight ``qwen35`` GGUFs with one
next-n (MTP) layer (tests/support/tiny_gguf.py), through the engine, the CLI, bench and serve.

Two heads: a random one (it rarely agrees with the verifier: mostly rejections) and a
``mimic`` one whose trunk is a bigram model and whose next-n block mostly copies it (it often
agrees). Greedy runs equal the verifier alone; the first emitted token follows the exact law of
SpS / Cactus over the head's real probabilities (chi-square, alpha = 0.001, fixed seeds); the
head's state after a long run of rollbacks equals a fresh catch-up's.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from cactus_gguf.llama import Context, ContextOptions, ModelLoadError, ModelOptions, nextn
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams, reference

from support.harness import assert_one_line_error, bench_cli, make_engine, run_cli
from support.server import LiveServer, client
from support.stats import ALPHA, chisquare_pvalue
from support.tiny_gguf import write_llama, write_qwen35

PROMPT = "the cat sat on"
N = 40


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtp")
    return {"random": write_qwen35(d / "random.gguf", seed=11, n_nextn=1),
            "mimic": write_qwen35(d / "mimic.gguf", seed=11, n_nextn=1, mimic=0.3),
            "plain": write_qwen35(d / "plain.gguf", seed=11),
            "llama": write_llama(d / "llama.gguf", seed=11)}


def test_the_hidden_rows_come_from_the_bound_functions(models):
    """llama_get_embeddings_nextn (bound by its C++ name): one row per token of the batch, the
    trunk's hidden state; an MTP context on the same model decodes a token with a state row."""
    with Context.load(models["random"], ModelOptions(load_mtp=True),
                      ContextOptions(n_ctx=128, n_batch=32, n_threads=1)) as ver:
        nextn.set_embeddings_nextn(ver.ptr, True, False)
        ver.decode(ver.model.tokenize(PROMPT), n_logits=1)
        n, E = ver.n_past, ver.model.n_embd_out
        rows = np.array(nextn.embeddings_nextn(ver.ptr, n, E))
        assert rows.shape == (n, 64) and np.all(np.isfinite(rows)) and rows.std() > 0.1
        assert len({r.tobytes() for r in rows}) == n  # a row per position
        head = Context(ver.model, ContextOptions(n_ctx=128, n_batch=32, n_threads=1, mtp=True))
        try:
            a = np.array(head.decode_states([5], rows[-1:]))
            head.clear()
            b = np.array(head.decode_states([5], rows[:1]))
            assert np.all(np.isfinite(a)) and np.abs(a - b).max() > 0.1  # the state matters
        finally:
            head.close()


@pytest.mark.parametrize("name", ["plain", "llama"])
def test_a_model_without_next_n_layers_is_a_one_line_error_not_an_abort(models, name):
    with pytest.raises(ModelLoadError, match="has no next-n \\(MTP\\) layers"):
        make_engine(models[name], None, drafter="mtp")
    r = run_cli("run", models[name], "--drafter", "mtp", "-p", PROMPT, "-n", "4", "-t", "1")
    assert_one_line_error(r, "no next-n (MTP) layers")


@pytest.mark.parametrize("head", ["random", "mimic"])
@pytest.mark.parametrize("method,k", [("sps", 1), ("sps", 4), ("cactus", 4), ("greedy", 3)])
def test_greedy_equals_the_verifier_alone(models, head, method, k):
    with make_engine(models[head], None, method="none", temp=0.0) as alone:
        base = alone.generate(PROMPT, n_predict=N, seed=0).tokens
    with make_engine(models[head], None, temp=0.0, method=method, k=k, drafter="mtp") as eng:
        out = eng.generate(PROMPT, n_predict=N, seed=0)
        again = eng.generate(PROMPT, n_predict=N, seed=0)  # the head follows a reused prefix
        assert eng.mtp.follows
    assert out.tokens == base == again.tokens
    assert out.stats.n_drafted > out.stats.n_accepted
    if head == "mimic":
        assert out.stats.n_accepted > 0


def _first_position(path) -> tuple[np.ndarray, np.ndarray, SamplingParams]:
    """The head's and the verifier's warped distributions p, q (float32 [V]) after PROMPT."""
    sampling = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    with make_engine(path, None, drafter="mtp", k=1) as eng:
        ids = eng.tokenize(PROMPT)
        eng.verifier.sync(ids[:-1])
        eng.mtp.resync()
        head_row = np.array(eng.mtp.head.decode_states(ids[-1:], eng.mtp.h_last[None]))
        ver_row = np.array(eng.verifier.decode(ids[-1:], n_logits=1)[0])
        s = NativeSampler(eng.verifier.n_vocab, sampling, AcceptanceParams(), 0)
        return s.warp(head_row), s.warp(ver_row), sampling


@pytest.mark.parametrize("method,delta", [("sps", 0.0), ("cactus", 1.0)])
def test_first_emitted_token_follows_the_exact_law_with_the_mtp_drafter(models, method, delta):
    p, q, _ = _first_position(models["mimic"])
    assert 0.1 < 0.5 * np.abs(p - q).sum() < 0.9  # the head is neither q nor unrelated
    expected = reference.emitted_first_token_distribution(p, q, method, delta=delta)
    counts = np.zeros(len(q), np.int64)
    with make_engine(models["mimic"], None, temp=1.0, top_k=8, k=2, method=method, delta=delta,
                     top_gap=float("inf"), protect_ends="off",  # the reference's rule
                     drafter="mtp") as eng:
        for seed in range(4000):
            res = eng.generate(PROMPT, n_predict=3, seed=seed)
            counts[res.tokens[0] if res.tokens else eng.verifier.model.eos] += 1
    assert chisquare_pvalue(counts, expected) > ALPHA
    if method == "cactus":  # the control: Cactus over this head really moves mass off q
        assert chisquare_pvalue(counts, q.astype(np.float64), strict=False) < ALPHA


@pytest.mark.parametrize("head", ["random", "mimic"])
def test_the_heads_state_after_rollbacks_equals_a_fresh_catch_up(models, head):
    """A long sampled run (rejections at most steps) with the verifier's cache reused across
    requests; then the head's logits for a probe token against a new engine's, whose verifier
    prefilled the same tokens once and whose head caught up on them."""
    with make_engine(models[head], None, temp=1.0, k=4, drafter="mtp",
                     context=ContextOptions(n_ctx=1024, n_batch=64, n_threads=1)) as eng:
        for seed, prompt in enumerate([PROMPT, PROMPT + " the mat", "hello"]):
            r = eng.generate(prompt, n_predict=250, seed=seed)
        held = list(eng.verifier.tokens)
        assert eng.mtp.follows and eng.mtp.head.tokens == held
        assert r.stats.n_drafted - r.stats.n_accepted > 50
        got = np.array(eng.mtp.head.decode_states([60], eng.mtp.h_last[None]))
    with make_engine(models[head], None, drafter="mtp",
                     context=ContextOptions(n_ctx=1024, n_batch=64, n_threads=1)) as fresh:
        fresh.verifier.decode(held, n_logits=0)
        assert fresh.mtp.follows
        want = np.array(fresh.mtp.head.decode_states([60], fresh.mtp.h_last[None]))
    assert np.abs(got - want).max() < 0.02  # batch shapes round differently; a wrong pair: units


def test_k_auto_probes_the_head(models, tmp_path, monkeypatch):
    monkeypatch.setenv("CACTUS_GGUF_CACHE", str(tmp_path))
    with make_engine(models["mimic"], None, method="none", temp=0.0) as alone:
        base = alone.generate(PROMPT, n_predict=N, seed=0).tokens
    with make_engine(models["mimic"], None, temp=0.0, k="auto", drafter="mtp") as eng:
        out = eng.generate(PROMPT, n_predict=N, seed=0)
        assert eng.forward_costs(16).draft > 0  # the head's one-token decode was timed
        assert eng.mtp.follows or eng.mtp.resync() >= 0
    assert out.tokens == base


def test_a_request_for_mtp_on_an_engine_without_the_head_is_refused(models):
    from cactus_gguf.errors import InputError

    with make_engine(models["mimic"], None, method="none", temp=0.0) as eng:
        assert eng.mtp is None
        with pytest.raises(InputError, match="drafter.* mtp needs the verifier's next-n"):
            eng.generate(PROMPT, n_predict=4, method="sps", drafter="mtp")


# ---- the commands ------------------------------------------------------------------------------

def _run_json(*args) -> dict:
    r = run_cli("run", *args, "-p", PROMPT, "-n", "24", "--temp", "0", "-c", "256", "-t", "1",
                "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_run_with_the_mtp_drafter(models):
    alone = _run_json(models["mimic"], "--method", "none")
    spec = _run_json(models["mimic"], "--drafter", "mtp", "-k", "4", "--method", "cactus")
    assert spec["tokens"] == alone["tokens"]
    assert spec["drafter"] == "mtp" and spec["n_accepted"] > 0


def test_bench_runs_mtp_beside_none(models, tmp_path):
    runs = bench_cli(tmp_path, models["mimic"], "-n", "16", "--configs", "none,mtp-sps,mtp",
                     "-k", "4")["runs"]
    assert {row["config"] for row in runs} == {"none", "mtp-sps-k4", "mtp-k4"}
    assert sum(row["n_accepted"] for row in runs if row["config"] != "none") > 0


def test_serve_with_the_mtp_drafter(models):
    with LiveServer(models["mimic"], "--drafter", "mtp", "-k", "4", "-c", "256", "-t", "1") as s:
        c = client(s)
        out = [c.completions.create(model="x", prompt=PROMPT, max_tokens=16, temperature=0)
               for _ in range(2)]
    assert out[0].choices[0].text == out[1].choices[0].text != ""


def test_a_one_shot_run_reuses_nothing(models):
    """Issue 52 item 8: the head's count of the prompt tokens it decoded was zeroed after the
    verifier's prefill (which the head follows), so a fresh engine reported the whole prompt but
    its last token as reused from the draft's cache."""
    with make_engine(models["mimic"], None, temp=0.0, k=4, drafter="mtp") as eng:
        first = eng.generate(PROMPT, n_predict=8, seed=0).stats
        caught = eng.mtp.n_caught_up
    assert (first.n_prompt_tokens_reused, first.n_draft_prompt_tokens_reused) == (0, 0)
    assert caught > first.n_prompt_tokens - 1  # the prompt (this prefill) and the steps


def test_run_json_reports_no_draft_reuse_for_a_one_shot_run(models):
    out = _run_json(models["mimic"], "--drafter", "mtp", "-k", "4")
    assert out["n_prompt_tokens_reused"] == out["n_draft_prompt_tokens_reused"] == 0
