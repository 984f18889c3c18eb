"""llama-server's stream telemetry: ``return_progress`` (``prompt_progress`` reports before each
``-b`` chunk of the prompt and once it is processed: the engine's ``progress`` callback) and
``timings_per_token`` (each streamed chunk's ``timings`` as of that chunk; the last chunk always
has them), on /v1/chat/completions, /v1/completions, /completion and /v1/responses."""
from __future__ import annotations

import json
import math

import httpx
import pytest

from support.harness import ctx, make_engine
from support.server import serving, sse_events, tiny_chat_pair

N_BATCH = 16


def _progress_of(engine, prompt: list[int]) -> list[tuple[int, int, int]]:
    reports = []
    stream = engine.stream(prompt, n_predict=2, seed=1, progress=reports.append)
    for _ in stream:
        pass
    assert [r.seconds for r in reports] == sorted(r.seconds for r in reports)
    return [(r.total, r.cache, r.processed) for r in reports]


def test_the_engine_reports_before_each_prompt_chunk_and_at_the_end(tiny_pair):
    """A prompt of 50 tokens at n_batch 16: its first 49 are decoded in chunks of 1, 16, 16, 16
    (the short one first: context.py), each reported before it is decoded, then the whole
    prompt once processed (the last token opens the first step); again, from the cache alone."""
    ver, dft = tiny_pair
    prompt = [3 + (7 * i) % 250 for i in range(50)]
    with make_engine(ver, dft, context=ctx(n_batch=N_BATCH)) as engine:
        assert _progress_of(engine, prompt) == [(50, 0, 0), (50, 0, 1), (50, 0, 17), (50, 0, 33),
                                                (50, 0, 50)]
        assert _progress_of(engine, prompt) == [(50, 49, 49), (50, 49, 50)]
        # 20 reused: 29 decoded, in chunks of 13 and 16
        assert _progress_of(engine, prompt[:20] + [5] * 30) == [
            (50, 20, 20), (50, 20, 33), (50, 20, 50)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pair = tiny_chat_pair(tmp_path_factory.mktemp("telemetry-server"))
    with serving(pair["ver"], pair["dft"], "-t", "1", "-c", "512", "-b", str(N_BATCH),
                 "-k", "4", "-n", "8") as s:
        yield s


def _stream(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(d) for d in sse_events(r) if d != "[DONE]"]


def _check_progress(progress: list[dict], total: int, cache: int) -> None:
    """llama-server's reports: the first before any token is decoded (processed = cache), one
    before each later chunk of the n_batch chunks of the prompt but its last token, the last
    with everything processed."""
    n_chunks = math.ceil((total - 1 - cache) / N_BATCH)
    assert len(progress) == 1 + max(n_chunks, 1)
    assert progress[0]["processed"] == progress[0]["cache"] == cache
    assert progress[-1]["processed"] == total
    assert all(p["total"] == total and p["cache"] == cache for p in progress)
    assert all(a["processed"] < b["processed"] for a, b in zip(progress, progress[1:]))
    assert all(isinstance(p["time_ms"], int) and p["time_ms"] >= 0 for p in progress)


CHAT = {"messages": [{"role": "user", "content": "This is a test " * 12}], "max_tokens": 6,
        "temperature": 0, "stream_options": {"include_usage": True}}


def test_return_progress_on_a_chat_stream(server):
    for _ in range(2):  # the second time from the cache
        chunks = _stream(server, "/v1/chat/completions", {**CHAT, "return_progress": True})
        usage = chunks[-1]["usage"]
        total, cache = usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]
        progress = [c for c in chunks if "prompt_progress" in c]
        assert total > 3 * N_BATCH
        _check_progress([c["prompt_progress"] for c in progress], total, cache)
        # llama-server's progress chunk: the role delta again, before any text
        assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": None}
                   and "timings" not in c for c in progress)
        first_text = next(i for i, c in enumerate(chunks) if c["choices"]
                          and c["choices"][0]["delta"].get("content"))
        assert chunks.index(progress[-1]) < first_text
    assert cache == total - 1  # everything but the last token came from the cache
    plain = _stream(server, "/v1/chat/completions", CHAT)
    assert not any("prompt_progress" in c for c in plain)


def test_timings_per_token_on_a_chat_stream(server):
    for asked in (True, False):
        chunks = _stream(server, "/v1/chat/completions",
                         {**CHAT, "timings_per_token": asked})
        assert "timings" not in chunks[0]  # the role chunk
        text = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")
                and c["choices"][0]["finish_reason"] is None]
        usage = chunks[-1]
        assert not usage["choices"] and usage["timings"]["predicted_n"] == 6  # always
        if not asked:
            assert not any("timings" in c for c in text)
            continue
        predicted = [c["timings"]["predicted_n"] for c in text]
        assert predicted == sorted(predicted) and 0 < predicted[-1] <= 6
        assert all(c["timings"]["prompt_n"] == usage["timings"]["prompt_n"] for c in text)
        assert all(c["timings"]["predicted_ms"] <= usage["timings"]["predicted_ms"]
                   for c in text)


def test_both_on_completion_streams(server):
    prompt = "the quick brown fox jumps over the lazy dog " * 6
    chunks = _stream(server, "/completion", {"prompt": prompt, "n_predict": 4, "temperature": 0,
                                             "cache_prompt": False, "timings_per_token": True,
                                             "return_progress": True})
    final = chunks[-1]
    progress = [c for c in chunks if "prompt_progress" in c]
    _check_progress([c["prompt_progress"] for c in progress], final["tokens_evaluated"], 0)
    first = progress[0]["timings"]  # before any prompt token was decoded
    assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"],
            first["predicted_ms"]) == (0, 0.0, 0, 0.0)
    assert [c["timings"]["prompt_n"] for c in progress] == \
        [c["prompt_progress"]["processed"] for c in progress]
    ms = [c["timings"]["prompt_ms"] for c in progress]
    assert ms == sorted(ms) and ms[-1] > 0
    partials = [c for c in chunks[:-1] if "prompt_progress" not in c]
    assert partials and all(c["timings"]["predicted_n"] == c["tokens_predicted"]
                            for c in partials)
    assert final["timings"]["predicted_n"] == 4
    assert final["generation_settings"]["timings_per_token"] is True

    chunks = _stream(server, "/v1/completions", {"prompt": prompt, "max_tokens": 3,
                                                 "return_progress": True})
    progress = [c for c in chunks if "prompt_progress" in c]
    assert len(progress) >= 2 and all(c["object"] == "text_completion" and
                                      c["choices"][0]["text"] == "" for c in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]


def test_both_on_a_responses_stream(server):
    with httpx.stream("POST", server.url + "/v1/responses", timeout=120, json={
            "input": "This is a test " * 12, "max_output_tokens": 6, "stream": True,
            "timings_per_token": True, "return_progress": True}) as r:
        events = [json.loads(d) for d in sse_events(r)]
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    assert progress[-1]["prompt_progress"]["processed"] == progress[-1]["prompt_progress"]["total"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    completed = events[-1]
    assert completed["type"] in ("response.completed", "response.incomplete")
    assert completed["timings"]["predicted_n"] == completed["response"]["usage"]["output_tokens"]
