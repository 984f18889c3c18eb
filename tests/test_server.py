"""``cactus-gguf serve`` on tiny GGUF models: a live uvicorn on 127.0.0.1 and a random port, driven
by the official ``openai`` client and by raw httpx (SSE framing, errors, concurrency, disconnects,
the queue, the API key, memory over 200 requests)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from support.tiny_gguf import CHAT_TEMPLATE, EOS, chain, text_tokens, byte_token as T, write_llama
from support.harness import cli_env, memory_slope
from support.server import LiveServer, client, serving, sse_events, tiny_chat_pair

SCRIPT = "quickbrownfxSTOPjmpdvlazy"  # distinct characters: a bigram model can spell it


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("server")
    return {
        **tiny_chat_pair(d),
        "script": write_llama(d / "script.gguf", seed=45, chat_template=CHAT_TEMPLATE,
                              bigram=chain([T(ord("H"))] + text_tokens(SCRIPT) + [EOS])),
    }


@pytest.fixture(scope="module")
def server(files):
    with serving(files["ver"], files["dft"], "-t", "1", "-c", "2048", "-k", "4", "-n", "32",
                 "--temp", "0.8", "--metrics") as s:
        yield s


def chat(c, content="hello", **kw):
    return c.chat.completions.create(model="ver", messages=[{"role": "user", "content": content}],
                                     **kw)


# ---- the openai client --------------------------------------------------------------------------

def test_chat_completion_has_openai_shape_and_the_speculative_block(server):
    r = chat(client(server), seed=1, max_tokens=12)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "ver"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    spec = r.model_extra["speculative"]
    assert spec["method"] == "cactus" and spec["k"] == 4 and spec["delta"] == 1.0
    for key in ("acceptance_length", "acceptance_rate", "tokens_per_verifier_call", "kl_mean",
                "kl_max", "draft_seconds", "verify_seconds", "prompt_tokens_reused"):
        assert key in spec, key
    # per request: speculation off, another method
    off = chat(client(server), seed=1, max_tokens=6, extra_body={"speculative": False})
    assert off.model_extra["speculative"]["method"] == "none"
    sps = chat(client(server), seed=1, max_tokens=6,
               extra_body={"speculative": {"method": "sps", "k": 2}})
    assert (sps.model_extra["speculative"]["method"], sps.model_extra["speculative"]["k"]) == \
        ("sps", 2)
    auto = chat(client(server), seed=1, max_tokens=6,
                extra_body={"speculative": {"k": "auto", "k_max": 3}})
    assert (auto.model_extra["speculative"]["k"], auto.model_extra["speculative"]["k_max"]) == \
        ("auto", 3)
    # what delta bounds, and the divergence of what was emitted
    out = chat(client(server), seed=1, max_tokens=12,
               extra_body={"speculative": {"budget": "output", "delta": 0.05}})
    o = out.model_extra["speculative"]
    assert o["budget"] == "output" and o["k"] == 4 and o["k_max"] is None
    assert 0.0 <= o["output_kl_max"] <= 0.05 + 1e-9
    assert o["output_kl_sum"] >= o["output_kl_mean"] >= 0.0


def test_streaming_chat_joins_to_the_same_text_and_reports_usage(server):
    c = client(server)
    whole = chat(c, "the cat", seed=3, max_tokens=24, temperature=0)
    stream = chat(c, "the cat", seed=3, max_tokens=24, temperature=0, stream=True,
                  stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finals = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert chunks[0].choices[0].delta.role == "assistant"


def test_completions_streaming_and_not(server):
    c = client(server)
    r = c.completions.create(model="ver", prompt="the cat sat", max_tokens=10, seed=2,
                             temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    parts = [ch.choices[0].text for ch in c.completions.create(
        model="ver", prompt="the cat sat", max_tokens=10, seed=2, temperature=0, stream=True)
        if ch.choices]
    assert "".join(parts) == r.choices[0].text
    assert c.models.list().data[0].id == "ver"


def test_greedy_response_equals_cactus_gguf_run(server, files):
    r = client(server).completions.create(model="ver", prompt="the cat sat on", max_tokens=20,
                                          temperature=0, seed=0)
    run = subprocess.run([sys.executable, "-m", "cactus_gguf", "run", str(files["ver"]),
                          str(files["dft"]), "-p", "the cat sat on", "-n", "20", "--temp", "0",
                          "-k", "4", "-t", "1", "-c", "2048", "--json"], capture_output=True,
                         text=True, env=cli_env(), timeout=120)
    assert run.returncode == 0, run.stderr
    assert r.choices[0].text == json.loads(run.stdout)["text"]


# ---- SSE framing ----------------------------------------------------------------------------------

def test_sse_framing_chunk_sources_and_stop_strings(files):
    with LiveServer(files["script"], files["script"], "-t", "1", "-k", "4", "--temp", "0") as s:
        body = {"prompt": "H", "max_tokens": 200, "stream": True, "stop": ["STOP"]}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == SCRIPT[:SCRIPT.index("STOP")]  # the stop string never leaks, not even "S"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    segs = [seg for c in chunks for seg in c.get("speculative", {}).get("segments", [])]
    assert "".join(t for t, _ in segs) == text
    assert {src for _, src in segs} <= {"draft", "residual", "bonus"} and \
        any(src == "draft" for _, src in segs)  # draft = verifier: most text is accepted drafts


def test_utf8_is_never_split_across_chunks(tmp_path):
    utf8 = "é中😀 ok"
    m = write_llama(tmp_path / "u.gguf", seed=47, bigram=chain([T(ord("h"))] + text_tokens(utf8)
                                                              + [EOS]))
    with LiveServer(m, "-t", "1", "--method", "none", "--temp", "0") as s:
        with httpx.stream("POST", s.url + "/v1/completions", timeout=60,
                          json={"prompt": "h", "max_tokens": 40, "stream": True}) as r:
            events = sse_events(r)
    parts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert "".join(parts) == utf8 and "\ufffd" not in "".join(parts)
    assert [p for p in parts if p] == list(utf8)  # one token-step per character, never half


# ---- errors ---------------------------------------------------------------------------------------

BAD = [  # (endpoint, body, status, param)
    ("chat/completions", {"messages": []}, 400, "messages"),
    ("chat/completions", {}, 400, "messages"),
    ("chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, None),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2,
                          "stream": True}, 400, "n"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, 400,
     "tools.0.type"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": 3}, 400,
     "logprobs"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "response_format": {"type": "xml"}}, 400, "response_format.type"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "response_format": {"type": "json_schema"}}, 400, "response_format"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "response_format": {"type": "json_schema", "json_schema": {
                              "name": "x", "schema": {"type": "objec"}}}}, 400, "response_format"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "grammar": "root ::= missing"}, 400, "grammar"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "grammar": 'root ::= "a"',
                          "response_format": {"type": "json_object"}}, 400, "response_format"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
     400, "temperature"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400,
     "top_p"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400,
     "max_tokens"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "max_completion_tokens": -1}, 400, "max_completion_tokens"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "speculative": {"method": "eagle"}}, 400, "speculative.method"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "speculative": {"k": -1}}, 400, "speculative.k"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "speculative": {"delta": -1}}, 400, "speculative.delta"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "speculative": {"bogus": 1}}, 400, "speculative.bogus"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "speculative": {"budget": "emitted"}}, 400, "speculative.budget"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "speculative": {"k": "smart"}}, 400, "speculative.k"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "speculative": {"k": "auto", "k_max": 0}}, 400, "speculative.k_max"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "stop": [1]}, 400,
     None),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}],
                          "frequency_penalty": 1.0}, 400, "frequency_penalty"),
    ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "seed": 2**70}, 400,
     "seed"),
    ("completions", {"prompt": "x " * 3000}, 400, "n_ctx"),
    ("completions", {"prompt": ["a", []]}, 400, "prompt"),
    ("completions", {"prompt": "x", "echo": True}, 400, "echo"),
    ("completions", {}, 400, "prompt"),
    ("completions", {"prompt": [999999]}, 400, "prompt"),
    ("completions", {"prompt": "x", "min_p": 2}, 400, "min_p"),
]


@pytest.mark.parametrize("endpoint,body,status,param", BAD,
                         ids=[f"{i}-{b[0]}" for i, b in enumerate(BAD)])
def test_bad_requests_get_openai_style_errors(server, endpoint, body, status, param):
    r = httpx.post(f"{server.url}/v1/{endpoint}", json=body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    # (a prompt over the context adds llama-server's n_prompt_tokens and n_ctx)
    assert set(err) - {"n_prompt_tokens", "n_ctx"} == {"message", "type", "param", "code"}
    assert err["message"]
    assert "Traceback" not in err["message"]
    if param is not None:
        assert err["param"] == param, err


def test_invalid_json_unknown_routes_and_big_bodies(server):
    r = httpx.post(server.url + "/v1/chat/completions", content=b"{bad",
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert httpx.get(server.url + "/v2/nothing").status_code == 404
    big = b'{"prompt": "' + b"x" * (9 << 20) + b'"}'
    r = httpx.post(server.url + "/v1/completions", content=big,
                   headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    # the openai client raises the matching exceptions
    c = client(server)
    with pytest.raises(openai.BadRequestError, match="top_p"):
        chat(c, top_p=5)
    # and the server is still fine
    assert chat(c, max_tokens=3).usage.completion_tokens == 3


def test_api_key(files):
    with LiveServer(files["ver"], files["dft"], "-t", "1", "--api-key", "s3cret") as s:
        with pytest.raises(openai.AuthenticationError):
            chat(client(s, api_key="wrong"), max_tokens=2)
        assert httpx.post(s.url + "/v1/completions", json={"prompt": "x"}).status_code == 401
        assert chat(client(s, api_key="s3cret"), max_tokens=2).usage.completion_tokens == 2
        assert httpx.get(s.url + "/health").status_code == 200  # health needs no key
    assert s.returncode == 0


def test_a_public_address_without_a_key_warns(files):
    with LiveServer(files["ver"], "-t", "1", "--method", "none", "--host", "0.0.0.0") as s:
        pass
    assert any("warning: listening on 0.0.0.0 without --api-key" in ln for ln in s.stderr_lines)


# ---- concurrency, disconnects, the queue ----------------------------------------------------------

def test_three_clients_at_once_all_get_their_own_answer(server):
    c = client(server)
    want = {seed: chat(c, f"prompt {seed}", seed=seed, max_tokens=16).choices[0].message.content
            for seed in (1, 2, 3)}
    got, errors = {}, []

    def one(seed):
        try:
            got[seed] = chat(client(server), f"prompt {seed}", seed=seed,
                             max_tokens=16).choices[0].message.content
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=one, args=(s,)) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and got == want


def _completion_tokens(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(next(ln.split()[-1] for ln in text.splitlines()
                      if ln.startswith("cactus_completion_tokens_total")))


def test_a_client_that_disconnects_frees_the_engine(files):
    # a context of 65,536 tokens: the generation below would run for tens of seconds
    with LiveServer(files["ver"], files["dft"], "-t", "1", "-c", "65536", "--metrics") as s:
        body = {"prompt": "the cat", "max_tokens": 60000, "stream": True, "seed": 1}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            seen = [ln for _, ln in zip(range(6), r.iter_lines())]
        assert any(ln.startswith("data:") for ln in seen)
        t0 = time.perf_counter()
        r = chat(client(s, timeout=30), max_tokens=4)
        waited = time.perf_counter() - t0
        assert r.usage.completion_tokens == 4
        abandoned = _completion_tokens(s.url) - 4
    assert waited < 10  # it did not wait for the abandoned generation
    assert 0 < abandoned < 20000  # which stopped soon after the client left


def test_a_full_queue_answers_503_with_retry_after(files):
    with LiveServer(files["ver"], files["dft"], "-t", "1", "--max-queue", "0", "-c", "65536") as s:
        body = {"prompt": "the cat", "max_tokens": 60000, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()  # (kept: dropping the iterator would close the response)
            next(lines)  # the long one is running
            busy = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["code"] == "queue_full"
        time.sleep(0.5)
        ok = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                        timeout=30)
        assert ok.status_code == 200


def test_a_request_timeout_ends_with_what_it_has(files):
    with LiveServer(files["ver"], files["dft"], "-t", "1", "--timeout", "1") as s:
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 100000},
                       timeout=60).json()
    assert r["choices"][0]["finish_reason"] == "length" and 0 < r["usage"]["completion_tokens"]


# ---- sessions, health, metrics, memory --------------------------------------------------------------

def test_a_five_turn_chat_reuses_the_prefix_and_gives_the_same_text(server):
    c = client(server)
    messages, reused = [], []
    for turn in ("hello", "the cat", "sat on", "the mat", "and the dog"):
        messages.append({"role": "user", "content": turn})
        warm = c.chat.completions.create(model="ver", messages=messages, max_tokens=12,
                                         temperature=0, seed=0)
        cold = c.chat.completions.create(model="ver", messages=messages, max_tokens=12,
                                         temperature=0, seed=0, extra_body={"cache_prompt": False})
        assert warm.choices[0].message.content == cold.choices[0].message.content
        reused.append(warm.model_extra["speculative"]["prompt_tokens_reused"])
        assert cold.model_extra["speculative"]["prompt_tokens_reused"] == 0
        messages.append({"role": "assistant", "content": warm.choices[0].message.content})
    assert all(n > 0 for n in reused[1:]), reused


def test_metrics_are_prometheus_text(server):
    chat(client(server), max_tokens=5)
    text = httpx.get(server.url + "/metrics").text
    for name in ("cactus_requests_total", "cactus_completion_tokens_total",
                 "cactus_time_to_first_token_seconds_bucket", "cactus_tokens_per_second_bucket",
                 "cactus_acceptance_rate_bucket", "cactus_acceptance_length_bucket",
                 "cactus_kl_mean_nats_bucket", "cactus_queue_depth"):
        assert name in text, name
    assert 'cactus_requests_total{endpoint="/v1/chat/completions",status="200"}' in text


def test_health_is_503_while_the_models_load():
    """In process, with a load that waits: /health and generation answer 503 until it is done."""
    from fastapi.testclient import TestClient

    from cactus_gguf.options import Request
    from cactus_gguf.server.app import ServerConfig, create_app
    from cactus_gguf.server.worker import Worker

    release = threading.Event()

    class FakeEngine:
        def close(self):
            pass

    worker = Worker(lambda: release.wait(30) and FakeEngine(), max_queue=1)
    worker.start()
    app = create_app(worker, ServerConfig(defaults=Request(), model_id="m", verifier="v",
                                          draft=None))
    with TestClient(app) as tc:
        r = tc.get("/health")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        r = tc.post("/v1/completions", json={"prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "not_ready"
        release.set()
        worker.ready.wait(10)
        assert tc.get("/health").json() == {"status": "ok"}
    worker.stop()


def test_200_sequential_requests_keep_memory_flat(server, record_property):
    c = client(server)
    samples = []
    for i in range(200):
        chat(c, f"request {i % 7}", max_tokens=8, seed=i)
        if i % 10 == 9:
            samples.append(server.rss_mib())
    trend = memory_slope(samples) * 20  # MiB per 200 requests
    msg = (f"server RSS after 10 requests {samples[0]:.1f} MiB, after 200 {samples[-1]:.1f} MiB "
           f"(trend {trend:+.2f} MiB per 200)")
    print("\nRESOURCES " + msg)
    record_property("server_200", msg)
    assert trend < 8.0, msg


def test_ctrl_c_stops_the_server_cleanly(files):
    with LiveServer(files["ver"], files["dft"], "-t", "1") as s:
        chat(client(s), max_tokens=2)
        rc = s.stop()
    assert rc == 0
    assert s.stderr_lines[-1] == "cactus-gguf: stopped"
    assert not any("Traceback" in ln or "Exception" in ln for ln in s.stderr_lines)


# ---- issue 42: fields that change the answer, what a response reports, what an error reveals ------

def test_llama_servers_fields_are_implemented_or_refused(server):
    """n_predict is llama-server's name of max_tokens; the sampling fields this server lacks are
    accepted only at the value that changes nothing, refused (400 naming them) at any other."""
    url = server.url + "/v1/completions"
    r = httpx.post(url, json={"prompt": "the cat", "n_predict": 5}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text
    neutral = {"repeat_penalty": 1.0, "typical_p": 1, "mirostat": 0, "dry_multiplier": 0.0,
               "xtc_probability": 0, "top_n_sigma": -1, "dynatemp_range": 0, "ignore_eos": False,
               "n_probs": 0, "repeat_last_n": 64, "mirostat_tau": 5.0, "samplers": None}
    r = httpx.post(url, json={"prompt": "the cat", "max_tokens": 3, **neutral}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    for field, value in [("repeat_penalty", 1.1), ("typical_p", 0.9), ("mirostat", 2),
                         ("dry_multiplier", 0.8), ("xtc_probability", 0.5),
                         ("samplers", ["top_k", "temperature"]), ("repeat_penalty", True)]:
        r = httpx.post(url, json={"prompt": "the cat", field: value}, timeout=60)
        assert r.status_code == 400, (field, value, r.text)
        err = r.json()["error"]
        assert err["param"] == field and err["message"].startswith(field), err
    for body, param in [({"n_predict": 0}, "n_predict"), ({"n_predict": 4, "max_tokens": 5},
                                                          "n_predict"), ({"n_predict": "4"},
                                                                         "n_predict")]:
        r = httpx.post(url, json={"prompt": "the cat", **body}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_the_chat_page_offers_every_acceptance_rule(server):
    from cactus_gguf.options import METHODS

    page = httpx.get(server.url + "/").text
    select = page[page.index('<select id="method">'):]
    select = select[:select.index("</select>")]
    assert set(re.findall(r'<option value="([^"]+)"', select)) == {*METHODS, "none"}


FOREIGN_WORDS = ["▁", "▁the", "▁a", "▁cats", "▁dog", "▁sat", "▁on", "e", "at", "o", "n", "s"]


def test_a_foreign_draft_is_reported_and_errors_name_no_server_file(files, tmp_path):
    """Responses and /metrics carry draft_vocab and vocab_coverage (docs/models.md "Foreign
    drafts"); the 400 for draft_vocab same on a foreign pair names the models without this
    machine's paths."""
    (tmp_path / "secret-dir").mkdir()
    foreign = write_llama(tmp_path / "secret-dir" / "foreign-draft.gguf", seed=5,
                          words=FOREIGN_WORDS, chat_template=CHAT_TEMPLATE)
    with LiveServer(files["ver"], foreign, "-t", "1", "-k", "3", "-n", "8", "--metrics") as s:
        c = client(s)
        spec = chat(c, max_tokens=8, seed=1).model_extra["speculative"]
        assert spec["draft_vocab"] == "intersect" and 0.0 < spec["vocab_coverage"] <= 1.0
        text = chat(c, max_tokens=4, seed=1, extra_body={"speculative": {"draft_vocab": "text"}})
        assert text.model_extra["speculative"]["draft_vocab"] == "text"
        off = chat(c, max_tokens=4, extra_body={"speculative": False}).model_extra["speculative"]
        assert off["draft_vocab"] is None and off["vocab_coverage"] is None
        metrics = httpx.get(s.url + "/metrics").text
        assert 'cactus_draft_vocab_generations_total{draft_vocab="intersect"} 1.0' in metrics
        assert 'cactus_draft_vocab_generations_total{draft_vocab="text"} 1.0' in metrics
        assert "cactus_vocab_coverage_count 2.0" in metrics
        r = httpx.post(s.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "x"}],
            "speculative": {"draft_vocab": "same"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "speculative.draft_vocab"
        message = r.json()["error"]["message"]
        assert "speculative.draft_vocab same" in message and "DRAFT" in message, message
        assert "VERIFIER" in message
        for secret in (str(tmp_path), "secret-dir", "foreign-draft.gguf", str(files["ver"]),
                       files["ver"].name):
            assert secret not in message, (secret, message)
        models = httpx.get(s.url + "/v1/models").json()["data"][0]
        assert (models["verifier"], models["draft"]) == ("ver.gguf", "foreign-draft.gguf")
    assert s.returncode == 0
