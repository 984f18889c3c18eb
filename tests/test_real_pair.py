"""End-to-end on the real Qwen2.5-Coder 1.5B (verifier) / 0.5B (draft) Q4_K_M pair."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cactus_gguf.options import LoadOptions, Request
from cactus_gguf.speculative import Engine

PAPER_SAMPLING = dict(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0)
GREEDY = dict(temperature=0.0)
PROMPTS = ["def fibonacci(n):", "Write a short story about a robot:",
           "import numpy as np\n\ndef normalize(v):", "The three laws of thermodynamics are"]


@pytest.fixture(scope="module")
def real(qwen_pair):
    ver, dft = qwen_pair
    # the paper's sampling and rule (no top gap, no protected ends): the paper's properties
    with Engine(ver, dft, LoadOptions(n_ctx=1024), defaults=Request(
            k=4, top_gap=float("inf"), protect_ends="off", **PAPER_SAMPLING)) as dec:
        yield dec


def test_temperature_zero_equals_verifier_alone(real):
    base = real.generate("def quicksort(arr):", n_predict=96, seed=0, method="none", **GREEDY)
    for k in (1, 4, 8):
        spec = real.generate("def quicksort(arr):", n_predict=96, seed=5, k=k, method="cactus",
                             delta=1.0, **GREEDY)
        assert spec.tokens == base.tokens, f"k={k}"
        assert spec.stats.acceptance_rate > 0.5  # the 0.5B draft mostly agrees with the 1.5B
    assert "return" in base.text


def test_same_seed_same_text(real):
    a = real.generate(PROMPTS[1], n_predict=48, seed=42, method="cactus", delta=1.0)
    b = real.generate(PROMPTS[1], n_predict=48, seed=42, method="cactus", delta=1.0)
    assert a.text == b.text and a.tokens == b.tokens


def test_cactus_accepts_more_than_sps(real):
    """Mean acceptance length at delta = 1 exceeds delta = 0 (= SpS) at the paper's sampling."""
    accepted = {}
    for delta in (0.0, 1.0):
        n_acc = n_steps = 0
        for i, prompt in enumerate(PROMPTS):
            s = real.generate(prompt, n_predict=64, seed=100 + i, k=4, method="cactus",
                              delta=delta).stats
            n_acc += s.n_accepted
            n_steps += s.n_steps
        accepted[delta] = n_acc / n_steps
    assert accepted[1.0] > accepted[0.0] + 0.1, accepted


def test_chat_template_and_stop_string(real):
    res = real.chat([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                    n_predict=128, seed=0, method="cactus", **GREEDY)
    assert res.stop_reason in ("eos", "length") and "def " in res.text
    cut = real.generate("def add(a, b):\n", n_predict=64, stop=["return"], seed=0, **GREEDY)
    assert cut.stop_reason == "stop" and "return" not in cut.text


def run_cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "cactus_gguf", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_cli_run_prints_text_and_summary(qwen_pair):
    ver, dft = qwen_pair
    r = run_cli("run", str(ver), str(dft), "-p", "def is_prime(n):", "-n", "64", "--temp", "0.6",
                "--top-k", "20", "-k", "4", "-s", "3", "-c", "512")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 40
    summary = r.stderr.strip().splitlines()[-1]
    assert summary.startswith("cactus-gguf: answer ") and " s end to end (" in summary
    assert " | 64 tokens in " in summary and "tok/s" in summary and "seed 3" in summary


def test_cli_json(qwen_pair):
    ver, dft = qwen_pair
    r = run_cli("run", str(ver), str(dft), "-p", "def is_prime(n):", "-n", "32", "--json",
                "--method", "sps", "-s", "9", "-c", "512")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for key in ("text", "n_tokens", "tokens_per_second", "n_steps", "mean_accepted_length",
                "acceptance_rate", "draft_seconds", "verify_seconds", "method", "delta", "k", "seed",
                "kl_mean", "kl_max"):
        assert key in out, key
    assert out["method"] == "sps" and out["seed"] == 9 and out["n_tokens"] == 32
    assert out["kl_max"] == 0.0  # SpS targets q exactly


def test_cli_a_draft_of_another_vocabulary_is_served_and_same_refuses_it(qwen_pair, smollm_path):
    r = run_cli("run", str(qwen_pair[0]), str(smollm_path), "-p", "def add(a, b):", "-n", "8",
                "-k", "2", "--seed", "1")
    assert r.returncode == 0, r.stderr
    assert "draft vocabulary: intersect, the verifier's mass on the shared tokens" in r.stderr
    r = run_cli("run", str(qwen_pair[0]), str(smollm_path), "-p", "hello", "-n", "4",
                "--draft-vocab", "same")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cactus-gguf: error: --draft-vocab same, but "
                                                   "draft SmolLM2-135M-Instruct.Q4_1.gguf and "
                                                   "verifier qwen2.5-coder-1.5b"), r.stderr
    assert "the tokenizers differ (39234 of the draft's 49135 text tokens" in lines[0]
    assert "Traceback" not in r.stderr


def test_real_pair_runs_on_this_machine(qwen_pair):
    """The Q4_K_M pair that segfaults with AMX repacking runs (on an AMX machine with an AMX
    build the guard is what keeps it alive)."""
    from cactus_gguf.llama import build_has_amx, cpu_has_amx

    amx = cpu_has_amx() and build_has_amx()
    print(f"AMX: cpu {cpu_has_amx()}, build {build_has_amx()}; "
          f"repacking {'off' if amx else 'on'}")
    ver, dft = qwen_pair
    r = run_cli("run", ver, dft, "-p", "def add(a, b):", "-n", "8", "-c", "512", "--temp", "0",
                "-k", "4", "-t", "1", timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr)
    assert "return" in r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("cactus-gguf: answer ") and " | 8 tokens in " in last, last
