"""The server's lifecycle and validation (issue "Reliability, round 3"): a live ``cactus-gguf serve``
on tiny models, driven by the openai client, httpx and raw sockets on 127.0.0.1.

1. a client leaving during a long prefill cancels it   2. so does a non-streaming client's leaving
5. SIGTERM mid-stream ends the stream with an error event, never a silent end
6. any model name is served (``--alias``, ``--strict-model``)   7. API-key headers
8. OpenAI's validation (strict types, <= 4 stops, no empty stop)   9. "" is a prompt (BOS)
10. ``-n -1`` as the server's default
"""
from __future__ import annotations

import json
import signal
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import openai
import pytest

from support.tiny_gguf import CHAT_TEMPLATE, EOS, write_llama
from support.harness import run_cli
from support.server import LiveServer, client

LONG_PROMPT = [3 + (i * 7) % 200 for i in range(60000)]  # byte tokens; ~45 s of prefill here


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("server3")
    return {"ver": write_llama(d / "ver.gguf", seed=11, zero_output_rows=[EOS],
                               chat_template=CHAT_TEMPLATE),
            "dft": write_llama(d / "dft.gguf", seed=11, zero_output_rows=[EOS], noise=0.1,
                               noise_seed=12, chat_template=CHAT_TEMPLATE)}


@pytest.fixture(scope="module")
def small(files):
    """-n -1 (no limit) as every request's default, in a 256-token context."""
    with LiveServer(files["ver"], files["dft"], "-t", "1", "-c", "256", "-n", "-1", "-k", "4") as s:
        yield s
    assert s.returncode == 0 and not any("Traceback" in ln for ln in s.stderr_lines)


def metric(url: str, name: str, **labels) -> float:
    """The value of one sample in /metrics (0 when it is not there)."""
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def raw_post(url: str, path: str, body: dict, headers: dict | None = None) -> socket.socket:
    """Send a POST on a raw socket (the caller closes it: a client that goes away)."""
    u = urlparse(url)
    data = json.dumps(body).encode()
    head = [f"POST {path} HTTP/1.1", f"Host: {u.hostname}:{u.port}",
            "Content-Type: application/json", f"Content-Length: {len(data)}",
            *(f"{k}: {v}" for k, v in (headers or {}).items())]
    sock = socket.create_connection((u.hostname, u.port), timeout=30)
    sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
    return sock


def answered_at_once(server) -> float:
    """Seconds a 4-token chat request takes (it must not wait for an abandoned one)."""
    t0 = time.perf_counter()
    r = client(server, timeout=60).chat.completions.create(
        model="ver", messages=[{"role": "user", "content": "hello"}], max_tokens=4, seed=1)
    assert r.usage.completion_tokens == 4
    return time.perf_counter() - t0


# ---- 1 and 2. a client that leaves cancels its request, in its prefill too -----------------------

@pytest.fixture(scope="module")
def long(files):
    """A 65,536-token context: a 60,000-token prompt's prefill, or a 60,000-token answer, would
    take tens of seconds."""
    with LiveServer(files["ver"], files["dft"], "-t", "1", "-c", "65536", "-k", "4",
                    "--metrics") as s:
        yield s
    assert s.returncode == 0 and not any("Traceback" in ln for ln in s.stderr_lines)


def test_a_stream_closed_during_a_long_prefill_cancels_it(long):
    body = {"prompt": LONG_PROMPT, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", long.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the first event: the prompt is being processed
        time.sleep(0.5)  # (a Stop click in a chat page)
    assert answered_at_once(long) < 15  # not after the whole prefill
    assert metric(long.url, "cactus_requests_total", endpoint="/v1/completions",
                  status="499") == 1
    assert metric(long.url, "cactus_requests_total", endpoint="/v1/completions",
                  status="200") == 0


def test_a_request_whose_socket_closes_during_a_long_prefill_is_cancelled(long):
    before = metric(long.url, "cactus_requests_total", endpoint="/v1/completions", status="499")
    sock = raw_post(long.url, "/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 8})
    time.sleep(1.0)
    sock.close()
    assert answered_at_once(long) < 15
    assert metric(long.url, "cactus_requests_total", endpoint="/v1/completions",
                  status="499") == before + 1


def test_a_non_streaming_client_that_leaves_stops_its_generation(long):
    done = metric(long.url, "cactus_completion_tokens_total")
    sock = raw_post(long.url, "/v1/completions", {"prompt": "the cat", "max_tokens": 60000,
                                                  "seed": 1})
    time.sleep(1.5)  # generating
    sock.close()
    assert answered_at_once(long) < 15
    abandoned = metric(long.url, "cactus_completion_tokens_total") - done - 4
    assert 0 < abandoned < 20000  # it stopped soon after the client left
    assert metric(long.url, "cactus_requests_total", endpoint="/v1/completions",
                  status="499") >= 1


# ---- 5. SIGTERM: stop accepting, end the running stream with an error event, exit 0 --------------

def test_sigterm_mid_stream_ends_it_with_an_error_event(files):
    with LiveServer(files["ver"], files["dft"], "-t", "1", "-c", "65536", "-k", "4") as s:
        c = client(s, timeout=60)
        stream = c.chat.completions.create(model="ver", stream=True, max_tokens=60000, seed=1,
                                           messages=[{"role": "user", "content": "the cat"}])
        chunks = iter(stream)
        for _ in range(5):
            next(chunks)
        waiting = {}  # a request queued behind the stream is refused, not left hanging

        def queued():
            waiting["r"] = httpx.post(s.url + "/v1/completions", timeout=60,
                                      json={"prompt": "x", "max_tokens": 2})

        t = threading.Thread(target=queued)
        t.start()
        time.sleep(0.5)
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.ConnectError):  # no new connections
            httpx.get(s.url + "/health", timeout=5)
        with pytest.raises(openai.APIError, match="the server is shutting down") as e:
            for chunk in chunks:
                assert chunk.choices[0].finish_reason is None  # never a cut reply as complete
        assert e.value.code == "server_shutdown"
        t.join(60)
        assert waiting["r"].status_code == 503
        assert waiting["r"].json()["error"]["code"] == "server_shutdown"
        s.proc.wait(60)  # it exits by itself
        rc = s.stop()
    assert rc == 0
    assert s.stderr_lines[-1] == "cactus-gguf: stopped"
    assert not any("Traceback" in ln for ln in s.stderr_lines)


def test_sigterm_lets_a_short_stream_finish(files):
    with LiveServer(files["ver"], files["dft"], "-t", "1", "-k", "4") as s:
        stream = client(s).chat.completions.create(
            model="ver", stream=True, max_tokens=300, seed=1,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "the cat"}])
        chunks = [next(iter(stream))]
        s.proc.send_signal(signal.SIGTERM)
        chunks += list(stream)
        s.proc.wait(60)
        rc = s.stop()
    finals = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finals[-1] == "length" and chunks[-1].usage.completion_tokens == 300
    assert rc == 0


# ---- 6. model names: served whatever the name, unless --strict-model -----------------------------

def test_any_model_name_is_served_and_the_served_id_echoed(small):
    c = client(small)
    r = c.chat.completions.create(model="gpt-4o-mini", max_tokens=3,
                                  messages=[{"role": "user", "content": "hello"}])
    assert r.model == "ver" and r.usage.completion_tokens == 3
    assert c.completions.create(model="", prompt="x", max_tokens=2).model == "ver"
    assert [m.id for m in c.models.list().data] == ["ver"]


@pytest.fixture(scope="module")
def keyed(files):
    """--alias, --strict-model and --api-key."""
    with LiveServer(files["ver"], "--method", "none", "-t", "1", "-c", "256", "--alias",
                    "my-model", "--strict-model", "--api-key", "s3cret") as s:
        yield s
    assert s.returncode == 0


def test_alias_and_strict_model(keyed):
    c = client(keyed, api_key="s3cret")
    assert [m.id for m in c.models.list().data] == ["my-model"]
    r = c.completions.create(model="my-model", prompt="x", max_tokens=2)
    assert r.model == "my-model"
    with pytest.raises(openai.NotFoundError, match="'gpt-4o-mini' not found: this server serves "
                                                   "'my-model'"):
        c.completions.create(model="gpt-4o-mini", prompt="x", max_tokens=2)


def test_an_empty_alias_is_refused_before_anything_loads(files):
    r = run_cli("serve", files["ver"], "--method", "none", "--alias", "", "--port", "0")
    assert r.returncode == 1 and r.stderr.strip() == \
        "cactus-gguf: error: -a/--alias is empty: give a name"


def test_serve_options_are_checked_before_anything_loads(files):
    for args, message in [(["--port", "70000"], "--port must be in [0, 65535], got 70000"),
                          (["--max-queue", "-3"], "--max-queue must be >= 0, got -3"),
                          (["--timeout", "0"], "--timeout must be > 0, got 0")]:
        r = run_cli("serve", files["ver"], "--method", "none", *args)
        assert (r.returncode, r.stderr.strip()) == (1, f"cactus-gguf: error: {message}")


# ---- 7. API-key headers: any case of the scheme, or x-api-key ------------------------------------

@pytest.mark.parametrize("headers,status", [
    ({"Authorization": "Bearer s3cret"}, 200),
    ({"Authorization": "bearer s3cret"}, 200),
    ({"Authorization": "BEARER s3cret"}, 200),
    ({"x-api-key": "s3cret"}, 200),
    ({"Authorization": "Bearer wrong", "x-api-key": "s3cret"}, 200),
    ({"Authorization": "Bearer wrong"}, 401),
    ({"x-api-key": "wrong"}, 401),
    ({"Authorization": "Basic s3cret"}, 401),
    ({"Authorization": "s3cret"}, 401),
    ({}, 401),
])
def test_api_key_headers(keyed, headers, status):
    r = httpx.get(keyed.url + "/v1/models", headers=headers, timeout=30)
    assert r.status_code == status, r.text
    if status == 401:
        assert r.json()["error"]["code"] == "invalid_api_key"


# ---- 8. OpenAI's validation ----------------------------------------------------------------------

STRICT = [  # (body fields, param, message fragment)
    ({"stream": "yes"}, "stream", 'should be a valid boolean, got "yes"'),
    ({"max_tokens": "3"}, "max_tokens", 'should be a valid integer, got "3"'),
    ({"max_tokens": 3.5}, "max_tokens", "should be a valid integer, got 3.5"),
    ({"temperature": "0.5"}, "temperature", "should be a valid number"),
    ({"seed": True}, "seed", "should be a valid integer"),
    ({"speculative": {"k": "4"}}, "speculative.k", "should be a valid integer"),
    ({"stream_options": {"include_usage": 1}}, "stream_options.include_usage", "valid boolean"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4 strings (as OpenAI), got 5"),
    ({"stop": [""]}, "stop", "must not be an empty string"),
    ({"stop": ""}, "stop", "must not be an empty string"),
    ({"max_tokens": -1}, "max_tokens", "must be >= 1, got -1 (leave it out"),
]


@pytest.mark.parametrize("fields,param,fragment", STRICT, ids=[s[1] for s in STRICT])
def test_openai_validation(small, fields, param, fragment):
    r = httpx.post(small.url + "/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, **fields})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and fragment in err["message"], err


def test_what_openai_allows_is_still_allowed(small):
    r = client(small).chat.completions.create(
        model="ver", messages=[{"role": "user", "content": "x"}], max_tokens=2, temperature=1,
        stop=["a", "b", "c", "d"], extra_body={"speculative": {"k": 2, "delta": 1}})
    assert r.choices[0].finish_reason in ("length", "stop")


# ---- 9 and 10. "" is a prompt (the model adds BOS); -n -1 as the server's default ---------------

def test_an_empty_prompt_is_bos(small):
    r = client(small).completions.create(model="ver", prompt="", max_tokens=3, seed=1)
    assert r.usage.prompt_tokens == 1 and r.usage.completion_tokens == 3


def test_max_tokens_left_out_is_the_servers_n_minus_one(small):
    r = client(small).completions.create(model="ver", prompt="the cat", seed=1)
    assert r.choices[0].finish_reason == "length"
    assert 250 <= r.usage.total_tokens <= 257  # the context (256) was full
    assert r.model_extra["speculative"]["k"] == 4
