"""Speculative decoding with hybrid (recurrent-state) verifiers and drafts: tiny random-weight
``lfm2``, ``qwen35`` and ``nemotron_h`` GGUFs (tests/support/tiny_gguf.py) as verifier, as draft and
both, through the engine, the CLI (run, bench, serve) and the Python API.

Greedy runs equal the verifier alone (up to a near-tie of its top two logits, as
tests/test_decoding.py allows); the first emitted token follows the exact law (chi-square,
alpha = 0.001, fixed seeds); after long sampled runs full of rejections both contexts hold the
state a fresh prefill of their tokens gives.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from cactus_gguf.llama import Context
from cactus_gguf.sampling import AcceptanceParams, NativeSampler, SamplingParams, reference

from support.harness import (KvShadow, StepLog, assert_greedy_equal, bench_cli, ctx, make_engine,
                             run_cli)
from support.recurrent import TOL, error_after
from support.server import LiveServer, client
from support.tiny_gguf import CHAT_TEMPLATE, write_lfm2, write_llama, write_nemotron_h, write_qwen35

WRITERS = {"lfm2": write_lfm2, "qwen35": write_qwen35, "nemotron_h": write_nemotron_h}
ARCHS = tuple(WRITERS)
PROMPTS = ["the cat sat on", "def f(a):"]
N = 40
ALPHA = 0.001
# (verifier, draft): a hybrid with its noisy copy, with a KV-only draft, and as a KV-only
# verifier's draft
PAIRS = [(a, f"{a}-draft") for a in ARCHS] + [(a, "llama-draft") for a in ARCHS] \
    + [("llama", f"{a}-draft") for a in ARCHS]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{name: path}: each architecture's verifier (seed 11) and draft (its noisy copy)."""
    d = tmp_path_factory.mktemp("hybrid-engine")
    out = {}
    for arch, write in {**WRITERS, "llama": write_llama}.items():
        out[arch] = write(d / f"{arch}.gguf", seed=11)
        out[f"{arch}-draft"] = write(d / f"{arch}-draft.gguf", seed=11, noise=0.1, noise_seed=12)
    return out


@pytest.fixture(scope="module")
def greedy_alone(models):
    """{verifier: {prompt: (prompt ids, the verifier's own greedy ids)}}."""
    out = {}
    for ver in {v for v, _ in PAIRS}:
        with make_engine(models[ver], method="none", temp=0.0) as alone:
            out[ver] = {p: (alone.tokenize(p), alone.generate(p, n_predict=N, seed=0).tokens)
                        for p in PROMPTS}
    return out


@pytest.mark.parametrize("ver,dft", PAIRS)
@pytest.mark.parametrize("method,k", [("sps", 4), ("cactus", 4), ("cactus", 20)])
def test_greedy_equals_the_verifier_alone(models, greedy_alone, ver, dft, method, k):
    """k = 20 is past the verifier's snapshot window (16): its rollbacks go by checkpoint."""
    log = []
    with make_engine(models[ver], models[dft], temp=0.0, method=method, k=k) as eng:
        for p in PROMPTS:
            r = eng.generate(p, n_predict=N, seed=0)
            ids, want = greedy_alone[ver][p]
            assert_greedy_equal(r.tokens, want, models[ver], ids, 1e-3, what=f"{ver}/{dft} {p!r}")
            log.append(r.stats)
    drafted, accepted = sum(s.n_drafted for s in log), sum(s.n_accepted for s in log)
    assert accepted < drafted  # rejections happened
    if dft == f"{ver}-draft":  # a noisy copy also agrees now and then (unrelated models do not)
        assert accepted > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_k_auto_probes_and_still_gives_the_verifiers_tokens(models, greedy_alone, arch):
    with make_engine(models[arch], models[f"{arch}-draft"], temp=0.0, k="auto") as eng:
        r = eng.generate(PROMPTS[0], n_predict=N, seed=0)
        assert eng.probe is not None and eng.probe["seconds"] > 0
        costs = eng.forward_costs(16)
        assert costs.verify(1) > 0 and costs.verify(17) > 0 and costs.draft > 0
    ids, want = greedy_alone[arch][PROMPTS[0]]
    assert_greedy_equal(r.tokens, want, models[arch], ids, 1e-3, what=arch)


@pytest.mark.parametrize("method,delta", [("sps", 0.0), ("cactus", 1.0)])
def test_first_emitted_token_follows_the_exact_law_with_a_hybrid_verifier(models, method, delta):
    from support.stats import chisquare_pvalue

    # lfm2 with its noisy copy: p and q overlap (total variation 0.34) and Cactus's law is 0.19
    # away from q, so the control below has power
    ver, dft = models["lfm2"], models["lfm2-draft"]
    sampling = SamplingParams(temperature=1.0, top_k=8, top_p=1.0, min_p=0.0)
    q, p = [], []
    for path, out in ((ver, q), (dft, p)):
        with Context.load(path, context_options=ctx()) as m:
            row = np.array(m.decode(m.model.tokenize("the cat sat on"), 1)[0])
            out.append(NativeSampler(m.n_vocab, sampling, AcceptanceParams(), 0).warp(row))
    expected = reference.emitted_first_token_distribution(p[0], q[0], method, delta=delta)
    counts = np.zeros(len(q[0]), np.int64)
    with make_engine(ver, dft, temp=1.0, top_k=8, k=2, method=method, delta=delta,
                     top_gap=float("inf"), protect_ends="off") as eng:  # the reference's rule
        for seed in range(4000):  # n_predict 3: each run also rolls back a step
            res = eng.generate("the cat sat on", n_predict=3, seed=seed)
            counts[res.tokens[0] if res.tokens else eng.verifier.model.eos] += 1
    assert chisquare_pvalue(counts, expected) > ALPHA
    if method == "cactus":  # the control: Cactus really moves mass away from q
        assert chisquare_pvalue(counts, q[0].astype(np.float64), strict=False) < ALPHA


@pytest.mark.parametrize("ver,dft", [("qwen35", "qwen35-draft"), ("lfm2", "nemotron_h-draft")])
def test_thousands_of_tokens_of_rejections_leave_both_states_equal_to_fresh_prefills(
        models, monkeypatch, ver, dft):
    shadow = KvShadow.install(monkeypatch)
    steps = StepLog.install(monkeypatch)
    with make_engine(models[ver], models[dft], temp=1.0, k=5, method="sps",
                     context=ctx(n_ctx=1024)) as eng:
        for seed, prompt in enumerate(["the cat sat on", "hello world", "a dog and a cat"]):
            eng.generate(prompt, n_predict=700, seed=seed)
            for c, path in ((eng.verifier, models[ver]), (eng.draft, models[dft])):
                assert shadow.held(c) == c.tokens
                assert error_after(c, path) < TOL, (prompt, c.model.path.name)
                c.truncate(c.n_past - 1)  # undo error_after's probe token
    rejected = sum(n - a for n, a, _, _ in steps.steps if a < n)
    drafted = sum(n for n, _, _, _ in steps.steps)
    assert drafted >= 1500 and rejected >= 500


def test_chat_turns_reuse_the_prefix_and_equal_a_fresh_engine(models, tmp_path):
    ver = write_qwen35(tmp_path / "chat.gguf", seed=11, chat_template=CHAT_TEMPLATE)
    dft = write_qwen35(tmp_path / "chat-d.gguf", seed=11, noise=0.1, noise_seed=12,
                       chat_template=CHAT_TEMPLATE)
    turn1 = [{"role": "user", "content": "the cat sat on"}]
    with make_engine(ver, dft, temp=0.0, k=4) as eng:
        a1 = eng.chat(turn1, n_predict=24, seed=0)
        turn2 = turn1 + [{"role": "assistant", "content": a1.text},
                         {"role": "user", "content": "and the dog?"}]
        a2 = eng.chat(turn2, n_predict=24, seed=0)
        assert a2.stats.n_prompt_tokens_reused > len(eng.tokenize(eng.format_chat(turn1))) // 2
        assert error_after(eng.verifier, ver) < TOL
    with make_engine(ver, dft, temp=0.0, k=4) as fresh:
        assert fresh.chat(turn2, n_predict=24, seed=0).tokens == a2.tokens


@pytest.mark.parametrize("vocab", ["auto", "intersect", "text"])
def test_foreign_hybrid_drafts_give_the_verifiers_tokens(models, tmp_path, vocab):
    """A hybrid draft of another vocabulary (its own words and a control token the verifier
    lacks) for a hybrid verifier: its context holds the committed tokens translated, rolled back
    through checkpoints, as in the same-vocabulary case."""
    from support.tiny_gguf import EXTRA, FOREIGN_WORDS

    words = FOREIGN_WORDS if vocab != "auto" else None  # auto: the same words, moved ids (map)
    dft = write_lfm2(tmp_path / "foreign.gguf", seed=11, noise=0.1, noise_seed=12,
                     extra_control=EXTRA, **({"words": words} if words else {}))
    with make_engine(models["qwen35"], None, temp=0.0, method="none") as alone:
        base = alone.generate(PROMPTS[0], n_predict=N, seed=0).tokens
    with make_engine(models["qwen35"], dft, temp=0.0, k=4, method="cactus",
                     draft_vocab=vocab) as spec:
        out = spec.generate(PROMPTS[0], n_predict=N, seed=3)
        again = spec.generate(PROMPTS[0], n_predict=N, seed=3)  # prefix reuse of both contexts
        assert error_after(spec.draft, dft) < TOL
    assert out.tokens == base == again.tokens
    assert out.stats.draft_vocab == ("map" if vocab == "auto" else vocab)
    assert out.stats.n_drafted > 0


def test_a_grammar_constrained_run_equals_the_verifier_alone(models):
    grammar = 'root ::= "the " [a-z ]+ "."'
    runs = []
    for method in ("none", "cactus"):
        with make_engine(models["lfm2"], models["lfm2-draft"], temp=0.0, k=4,
                         method=method) as eng:
            runs.append(eng.generate("the cat", n_predict=30, seed=0, grammar=grammar).tokens)
    assert runs[0] == runs[1] and len(runs[0]) > 3


# ---- the commands ------------------------------------------------------------------------------

def _run_json(*args) -> dict:
    r = run_cli("run", *args, "-p", "the cat sat on", "-n", "24", "--temp", "0", "-c", "256",
                "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("arch", ["qwen35", "nemotron_h"])
def test_run_drafts_with_a_hybrid_pair_and_prints_the_verifiers_tokens(models, arch):
    ver, dft = models[arch], models[f"{arch}-draft"]
    alone = _run_json(ver, "--method", "none")
    spec = _run_json(ver, dft, "-k", "4", "--method", "sps")
    assert spec["tokens"] == alone["tokens"] and spec["n_drafted"] > 0


def test_bench_runs_a_hybrid_pair(models, tmp_path):
    report = bench_cli(tmp_path, models["lfm2"], models["lfm2-draft"], "-n", "16",
                       "--configs", "none,sps,cactus", "-k", "4")
    assert {row["config"] for row in report["runs"]} == {"none", "sps-k4", "cactus-d0.5-k4",
                                                         "cactus-d1-k4", "cactus-d2-k4"}


def test_serve_answers_with_a_hybrid_pair(models):
    with LiveServer(models["qwen35"], models["qwen35-draft"], "-c", "256", "-t", "1") as s:
        c = client(s)
        out = [c.completions.create(model="x", prompt="the cat sat on", max_tokens=16,
                                    temperature=0, extra_body={"speculative": {"k": 4}})
               for _ in range(2)]  # the second reuses the prompt (a checkpoint restore)
    assert out[0].choices[0].text == out[1].choices[0].text != ""
