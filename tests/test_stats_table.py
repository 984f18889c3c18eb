"""The statistics table (cactus_gguf/stats/table.py): every output shows exactly the table's
fields for it (``--json``, the summary line, the ``speculative`` block, ``timings``, ``/metrics``
with ours and llama-server's names, the benchmark's reads), llama-server's ``timings`` leave the
first token out, and docs/statistics.md is current."""
from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cactus_gguf.stats import table
from cactus_gguf.options import Request
from cactus_gguf.stats import GenerationResult, GenerationStats

ROOT = Path(__file__).resolve().parent.parent


def _stats(**kw) -> GenerationStats:
    base = dict(n_prompt_tokens=20, n_prompt_tokens_reused=5, n_tokens=11, n_steps=4,
                n_drafted=12, n_accepted=8, n_evaluated=12, n_draft_forwards=12, kl_sum=0.6,
                prefill_seconds=0.5, first_token_seconds=0.6, decode_seconds=1.1,
                draft_seconds=0.3, verify_seconds=0.6, accept_seconds=0.1)
    return GenerationStats(**{**base, **kw})


def _names(output: str) -> set[str]:
    return {f.name for f in table.fields_of(output)}


def test_json_is_every_counter_and_property_of_the_stats():
    props = {n for n, v in inspect.getmembers(GenerationStats) if isinstance(v, property)}
    attrs = {f.name for f in dataclasses.fields(GenerationStats)}
    assert set(_stats().as_dict()) == _names("json") == attrs | props


def test_the_speculative_block_is_the_tables_with_its_two_names():
    from cactus_gguf.options.rule import rule_of
    from cactus_gguf.server.report import speculative_block

    req = Request(method="sps", k=4)
    result = GenerationResult(text="", tokens=[], stop_reason="eos", stats=_stats(), seed=3)
    block = speculative_block(req, result)
    want = {f.speculative or f.name for f in table.fields_of("speculative")}
    # the rule's settings, then the statistics (draft_vocab: the one that ran), then the seed
    assert set(block) == set(rule_of(req)) | want | {"seed"} and "host_ms_per_step" in want
    assert len(want) == 19  # 17 before host_ms_per_step, 18 before n_shared_steps
    assert block["acceptance_length"] == result.stats.mean_accepted_length == 2.0
    assert block["prompt_tokens_reused"] == 5 and block["seed"] == 3
    # the verifier alone: the draft's vocabulary and coverage are null
    alone = speculative_block(Request(method="none"), result)
    assert alone["draft_vocab"] is None and alone["vocab_coverage"] is None


def test_timings_are_llama_servers_keys_and_leave_the_first_token_out():
    from cactus_gguf.server.report import timings

    s = _stats()
    t = timings(s)
    assert set(t) == {f.timings for f in table.fields_of("timings")}
    assert list(t) == ["cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms",
                       "prompt_per_second", "predicted_n", "predicted_ms",
                       "predicted_per_token_ms", "predicted_per_second", "draft_n",
                       "draft_n_accepted"]  # llama-server's order (server_slot_stats::to_json)
    assert t["cache_n"] == 5 and t["prompt_n"] == 15 and t["prompt_ms"] == pytest.approx(500)
    # the first token came 0.1 s after prompt processing: decoding after it is 1.0 s, 10 tokens
    assert t["predicted_n"] == 11 and t["predicted_ms"] == pytest.approx(1000)
    assert t["predicted_per_token_ms"] == pytest.approx(100)
    assert t["predicted_per_second"] == pytest.approx(10)
    assert s.tokens_per_second == pytest.approx(10)  # ours: 11 tokens over 1.1 s
    assert t["draft_n"] == 12 and t["draft_n_accepted"] == 8
    # nothing drafted: no draft_n (llama-server's rule); one token: no per-token figures
    one = timings(_stats(n_tokens=1, n_drafted=0, n_accepted=0))
    assert "draft_n" not in one and "draft_n_accepted" not in one
    assert one["predicted_per_second"] == one["predicted_per_token_ms"] == 0.0
    # the tokens returned in place of those emitted (/infill cut inside a step)
    assert timings(s, 6)["predicted_n"] == 6
    assert timings(s, 6)["predicted_per_second"] == pytest.approx(5)


def _families(text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^# TYPE (\S+) ", text, re.M)}


def test_metrics_are_the_tables_ours_and_llama_servers():
    pytest.importorskip("prometheus_client")
    from cactus_gguf.server.metrics import Metrics

    m = Metrics()
    for _ in range(2):
        m.finished(_stats(draft_vocab="intersect", coverage_sum=0.5, n_coverage=1))
    m.state(waiting=3, processing=1)
    text = m.render().decode()
    ours = {mt.name + ("_total" if mt.kind in ("counter", "by_value") else "")
            for _, mt in table.METRICS}
    llama = {f"llamacpp:{mt.name}" for _, mt in table.LLAMA_METRICS}
    created = {n for n in _families(text) if n.endswith("_created")}
    assert _families(text) - created == ours | llama
    assert {f.name for f, _ in table.METRICS} | {f.name for f, _ in table.LLAMA_METRICS} \
        == _names("metrics")

    def sample(name: str) -> float:
        return float(re.search(rf"^{re.escape(name)} (\S+)$", text, re.M).group(1))

    # llama-server's text: HELP, TYPE and sample under one name, a counter's name whole
    assert "# TYPE llamacpp:prompt_tokens_total counter\nllamacpp:prompt_tokens_total 30.0" in text
    assert sample("llamacpp:prompt_tokens_cached_total") == 10
    assert sample("llamacpp:tokens_predicted_total") == 22
    assert sample("llamacpp:tokens_predicted_seconds_total") == pytest.approx(2.0)
    assert sample("llamacpp:predicted_tokens_seconds") == pytest.approx(10)
    assert sample("llamacpp:prompt_tokens_seconds") == pytest.approx(30)
    assert sample("llamacpp:n_tokens_max") == 31
    assert sample("llamacpp:n_decode_total") == 8
    assert sample("llamacpp:spec_decode_num_draft_tokens_total") == 24
    assert sample("llamacpp:spec_decode_num_accepted_tokens_total") == 16
    assert sample("llamacpp:requests_processing") == 1
    assert sample("llamacpp:requests_deferred") == 3 == sample("cactus_queue_depth")
    assert sample("cactus_completion_tokens_total") == 22
    assert 'cactus_draft_vocab_generations_total{draft_vocab="intersect"} 2.0' in text
    # the throughput gauges average over the window between two reads, as llama-server's
    again = m.render().decode()
    assert re.search(r"^llamacpp:predicted_tokens_seconds 0\.0$", again, re.M)
    assert re.search(r"^llamacpp:tokens_predicted_total 22\.0$", again, re.M)


class _Reads:
    """A GenerationStats that records which fields are read."""

    def __init__(self, stats) -> None:
        self._stats, self.read = stats, set()

    def __getattr__(self, name: str):
        self.read.add(name)
        return getattr(self._stats, name)


@pytest.mark.parametrize("k", [4, "auto"])
def test_the_summary_line_reads_exactly_the_tables_summary_fields(k):
    from cactus_gguf.cli.run import summary

    read = set()
    # every branch: speculating, a foreign vocabulary, drafting stopped, a grammar
    cases = [(_stats(draft_vocab="map", coverage_sum=0.9, n_coverage=1, draft_stopped_at=3,
                     draft_stop_reason="draft context full"), Request(method="sps", k=k,
                                                                      grammar='root ::= "a"')),
             (_stats(n_drafted=0, n_accepted=0), Request(method="sps", k=k)),
             (_stats(), Request(method="none"))]
    for stats, req in cases:
        proxy = _Reads(stats)
        line = summary(GenerationResult(text="", tokens=[], stop_reason="eos", stats=proxy,
                                        seed=1), req)
        assert line.startswith("cactus-gguf: answer 1.60 s end to end")
        read |= proxy.read
    want = _names("summary") - ({"mean_drafted_length"} if k != "auto" else set())
    assert read == want


def test_the_benchmark_reads_exactly_the_tables_bench_fields():
    from cactus_gguf import bench

    read: set[str] = set()

    class Record(dict):
        def __getitem__(self, key):
            read.add(key)
            return dict.__getitem__(self, key)

        def get(self, key, default=None):
            read.add(key)
            return dict.get(self, key, default)

    configs = bench.config_grid(("none", "sps", "cactus"), (1.0,), (4,))
    runs = [Record(prompt=p, config=c["id"], passed=True, cpu_utilisation=1.0, text="x",
                   **_stats().as_dict()) for p in "ab" for c in configs]
    bench.summarize(configs, runs, {"verifier": {"1": 100.0, "5": 200.0}, "draft": {"1": 50.0}})
    assert read & _names("json") == _names("bench")
    assert _names("bench") <= _names("json")  # its run records are --json's


def test_every_field_is_declared_well():
    for f in table.FIELDS:
        assert f.outputs and set(f.outputs) <= set(table.OUTPUTS), f.name
        assert f.unit is not None and f.meaning, f.name
        assert (f.timings is not None) == ("timings" in f.outputs), f.name
        assert (f.speculative is None) or "speculative" in f.outputs, f.name
        assert bool(f.metrics or f.llama_metrics) == ("metrics" in f.outputs), f.name
        assert f.source == "stats" or f.outputs == ("metrics",), f.name
    names = [m.name for _, m in table.METRICS] + [m.name for _, m in table.LLAMA_METRICS]
    assert len(names) == len(set(names))


def test_docs_statistics_is_current():
    out = subprocess.run([sys.executable, "docs/generate.py", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
    assert "statistics.md" not in out.stdout, out.stdout
    assert "docs/statistics.md" in (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    assert "docs/statistics.md" in (ROOT / "docs" / "run.md").read_text(encoding="utf-8")
