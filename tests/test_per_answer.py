"""Per-answer figures outside the benchmark: the run summary line and the server's metrics report
what one answer cost (seconds end to end, verifier calls, draft forwards, tokens)."""
from __future__ import annotations

import pytest

from cactus_gguf.cli.run import summary
from cactus_gguf.options import Request
from cactus_gguf.stats import GenerationResult, GenerationStats


def _result(**kw) -> GenerationResult:
    stats = GenerationStats(n_tokens=40, n_steps=10, n_drafted=32, n_accepted=30,
                            n_draft_forwards=32, prefill_seconds=0.25, decode_seconds=2.0, **kw)
    return GenerationResult(text="x", tokens=[1] * 40, stop_reason="eos", stats=stats, seed=7)


def test_answer_seconds_is_prefill_plus_decode_and_is_in_the_json():
    d = _result().stats.as_dict()
    assert d["answer_seconds"] == pytest.approx(2.25)
    assert d["n_draft_forwards"] == 32 and d["n_steps"] == 10


def test_the_run_summary_leads_with_the_answer():
    line = summary(_result(), Request(method="sps", k=4))
    assert line.startswith("cactus-gguf: answer 2.25 s end to end (10 verifier calls, "
                           "32 draft forwards) | 40 tokens in 2.00 s (20.00 tok/s)")
    alone = summary(_result(), Request(method="none"))
    assert alone.startswith("cactus-gguf: answer 2.25 s end to end (10 verifier calls) |")


def test_server_metrics_count_verifier_calls_and_observe_each_answer():
    pytest.importorskip("prometheus_client")
    from cactus_gguf.server.metrics import Metrics

    m = Metrics()
    m.finished(_result().stats)
    m.finished(_result().stats)
    text = m.render().decode()
    assert "cactus_verifier_calls_total 20.0" in text
    assert "cactus_draft_forwards_total 64.0" in text
    assert "cactus_answer_seconds_count 2.0" in text and "cactus_answer_seconds_sum 4.5" in text
    assert 'cactus_answer_verifier_calls_bucket{le="10.0"} 2.0' in text
    assert 'cactus_answer_tokens_bucket{le="20.0"} 0.0' in text
    assert 'cactus_answer_tokens_bucket{le="50.0"} 2.0' in text
