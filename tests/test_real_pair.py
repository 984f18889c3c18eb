"""End-to-end on the real Qwen2.5-Coder 1.5B (verifier) / 0.5B (draft) Q4_K_M pair."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cactus_gguf.backend import ContextOptions
from cactus_gguf.decoding import DecoderConfig, SpeculativeDecoder
from cactus_gguf.sampling import AcceptanceParams, SamplingParams

PAPER_SAMPLING = SamplingParams(temperature=0.6, top_k=20, top_p=0.95, min_p=0.0)
PROMPTS = ["def fibonacci(n):", "Write a short story about a robot:",
           "import numpy as np\n\ndef normalize(v):", "The three laws of thermodynamics are"]


@pytest.fixture(scope="module")
def real(qwen_pair):
    ver, dft = qwen_pair
    cfg = DecoderConfig(k=4, sampling=PAPER_SAMPLING, context=ContextOptions(n_ctx=1024))
    with SpeculativeDecoder(ver, dft, cfg) as dec:
        yield dec


def with_config(dec, **changes):
    """The same loaded models under another config (the decoder reads its config per call)."""
    from dataclasses import replace
    dec.config = replace(dec.config, **changes)
    return dec


def test_temperature_zero_equals_verifier_alone(real):
    greedy = SamplingParams(temperature=0.0)
    base = with_config(real, acceptance=None, sampling=greedy).generate(
        "def quicksort(arr):", n_predict=96, seed=0)
    for k in (1, 4, 8):
        spec = with_config(real, k=k, acceptance=AcceptanceParams(method="cactus", delta=1.0),
                           sampling=greedy).generate("def quicksort(arr):", n_predict=96, seed=5)
        assert spec.tokens == base.tokens, f"k={k}"
        assert spec.stats.acceptance_rate > 0.5  # the 0.5B draft mostly agrees with the 1.5B
    assert "return" in base.text


def test_same_seed_same_text(real):
    cfg = dict(acceptance=AcceptanceParams(method="cactus", delta=1.0), sampling=PAPER_SAMPLING)
    a = with_config(real, **cfg).generate(PROMPTS[1], n_predict=48, seed=42)
    b = with_config(real, **cfg).generate(PROMPTS[1], n_predict=48, seed=42)
    assert a.text == b.text and a.tokens == b.tokens


def test_cactus_accepts_more_than_sps(real):
    """Mean acceptance length at delta = 1 exceeds delta = 0 (= SpS) at the paper's sampling."""
    accepted = {}
    for delta in (0.0, 1.0):
        dec = with_config(real, k=4, acceptance=AcceptanceParams(method="cactus", delta=delta),
                          sampling=PAPER_SAMPLING)
        n_acc = n_steps = 0
        for i, prompt in enumerate(PROMPTS):
            s = dec.generate(prompt, n_predict=64, seed=100 + i).stats
            n_acc += s.n_accepted
            n_steps += s.n_steps
        accepted[delta] = n_acc / n_steps
    assert accepted[1.0] > accepted[0.0] + 0.1, accepted


def test_chat_template_and_stop_string(real):
    dec = with_config(real, acceptance=AcceptanceParams(method="cactus"), sampling=SamplingParams(temperature=0.0))
    res = dec.chat([{"role": "user", "content": "Write a Python function that adds two numbers."}],
                   n_predict=128, seed=0)
    assert res.stop_reason in ("eos", "length") and "def " in res.text
    cut = dec.generate("def add(a, b):\n", n_predict=64, stop=["return"], seed=0)
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
    assert summary.startswith("cactus-gguf: 64 tokens in") and "tok/s" in summary and "seed 3" in summary


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


def test_cli_different_vocabulary_is_a_one_line_error(qwen_pair, smollm_path):
    r = run_cli("run", str(qwen_pair[0]), str(smollm_path), "-p", "hello", "-n", "4")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cactus-gguf: error:"), r.stderr
    assert "Traceback" not in r.stderr
