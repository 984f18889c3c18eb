"""The verifier (and the draft) over llama.cpp's RPC backend, on loopback, with the real pair.

Everything runs the real CLI (``python -m cactus_gguf``) on llama.cpp built with ``-DGGML_RPC=ON``
from the pinned llama-cpp-python's vendored source (tests/support/rpc.py: built once, cached in
~/.cache/cactus-gguf/rpc-build) against real ``ggml-rpc-server`` processes on 127.0.0.1. Local and
remote runs use the same build and no weight repacking (the rpc-server's CPU device does not
repack), so they do the same arithmetic and "equal" means token for token. With repacking on
locally, sampled runs part after a few dozen tokens (seen: token 27 of a T = 0.6 run), as two
different kernels' rounding would on any two machines.

With ``-ngl`` > 0 (the default, -1 = every layer) the verifier's layers, its KV cache and its
logits go through llama.cpp's device-backend path: the RPC device stands in for the GPU these
machines lack. The runs with the draft model at temperature 0 reject drafts, so the KV cache on the
device is rolled back (llama_memory_seq_rm, its result checked by Context.truncate) many times.
"""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time

import pytest

from support.harness import assert_one_line_error, cli_env
from support.rpc import RpcServer, free_port, rpc_build

pytestmark = pytest.mark.rpc  # builds llama.cpp with RPC, runs rpc-server processes

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


@pytest.fixture(scope="module")
def build():
    return rpc_build()


def cli(build, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    env = build.env(PYTHONPATH=cli_env()["PYTHONPATH"])
    return subprocess.run([sys.executable, "-m", "cactus_gguf", "run", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def generate(build, pair, *args) -> dict:
    ver, dra = pair
    # --no-repack: an rpc-server's CPU device keeps the weights as stored, so the local side must
    # too for the arithmetic (and so the sampled tokens) to be the same
    r = cli(build, ver, dra, "-p", PROMPT, "-t", "2", "-c", "1024", "--json", "--no-repack", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def servers(build):
    with RpcServer(build, threads=2) as a, RpcServer(build, threads=2) as b:
        yield a, b


@pytest.mark.parametrize("args", [
    ("--temp", "0", "--method", "sps", "-k", "4"),  # greedy: drafts rejected, KV rolled back
    ("--temp", "0.6", "--top-k", "20", "--method", "cactus", "-k", "4", "-s", "7"),  # sampled
    ("--temp", "0.6", "--top-k", "20", "--method", "none", "-s", "3"),  # the verifier alone
], ids=["greedy-sps", "sampled-cactus", "none"])
def test_remote_verifier_equals_local(build, qwen_pair, servers, args):
    local = generate(build, qwen_pair, "-n", "48", *args)
    remote = generate(build, qwen_pair, "-n", "48", "--rpc", servers[0].endpoint, *args)
    assert remote["tokens"] == local["tokens"], (local["text"], remote["text"])
    assert len(local["tokens"]) >= 40
    if args[1] == "0" and "sps" in args:
        assert remote["n_drafted"] > remote["n_accepted"] > 0  # rejections happened: rollbacks


def test_two_servers_partial_offload_and_remote_draft(build, qwen_pair, servers):
    """Layers spread over two servers by --tensor-split, 20 of 28 offloaded (-ngl 20: the rest
    and the output layer stay local), the draft on the second server: same tokens as local."""
    a, b = servers
    args = ("-n", "40", "--temp", "0", "--method", "sps", "-k", "4")
    local = generate(build, qwen_pair, *args)
    remote = generate(build, qwen_pair, *args, "--rpc", f"{a.endpoint},{b.endpoint}",
                      "-ts", "1,1", "-ngl", "20", "--rpc-draft", b.endpoint)
    assert remote["tokens"] == local["tokens"]
    assert remote["n_drafted"] > remote["n_accepted"] > 0


def test_nothing_listening_is_one_line_error_within_seconds(build, qwen_pair):
    port = free_port()
    t0 = time.monotonic()
    r = cli(build, *qwen_pair, "-p", "hi", "-n", "4", "--rpc", f"127.0.0.1:{port}")
    elapsed = time.monotonic() - t0
    line = assert_one_line_error(r, f"127.0.0.1:{port}", "--rpc", "rpc-server")
    assert r.returncode == 1, line
    assert elapsed < 10, elapsed


def test_a_silent_listener_is_refused_by_the_handshake(build, qwen_pair):
    """Something listens but is not an rpc-server (or another client holds it): the HELLO
    handshake times out (3 s) and the error says so; the draft's flag is named for --rpc-draft."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(4)
        ep = "127.0.0.1:%d" % s.getsockname()[1]
        t0 = time.monotonic()
        r = cli(build, *qwen_pair, "-p", "hi", "-n", "4", "--rpc-draft", ep)
        elapsed = time.monotonic() - t0
    assert_one_line_error(r, ep, "--rpc-draft", "handshake")
    assert elapsed < 10, elapsed


def test_server_killed_mid_generation(build, qwen_pair):
    """The rpc-server dies while the verifier decodes on it: exit code 3 within seconds, one line
    naming the address, the text printed so far stays on stdout, no signal, no hang."""
    ver, dra = qwen_pair
    with RpcServer(build, threads=2) as srv:
        env = build.env(PYTHONPATH=cli_env()["PYTHONPATH"])
        proc = subprocess.Popen([sys.executable, "-m", "cactus_gguf", "run", ver, dra, "-p", PROMPT,
                                 "-n", "400", "-t", "2", "-c", "1024", "--temp", "0", "-k", "4",
                                 "--rpc", srv.endpoint],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        printed = b""
        deadline = time.monotonic() + 240
        while len(printed) < 40 and time.monotonic() < deadline:  # a few steps are out
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                printed += chunk
        assert len(printed) >= 40, proc.stderr.read()
        srv.kill()
        t_kill = time.monotonic()
        out, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t_kill
    text = (printed + out).decode()
    r = subprocess.CompletedProcess(proc.args, proc.returncode, text, err.decode())
    line = assert_one_line_error(r, srv.endpoint, "stopped answering")
    assert proc.returncode == 3, (proc.returncode, line)
    assert waited < 30, waited
    assert text.startswith(printed.decode()) and len(text.strip()) >= 40


def test_kill_mid_generation_json_keeps_the_partial_result(build, qwen_pair):
    """With --json the object still comes out: the tokens so far, stop_reason "error"."""
    ver, dra = qwen_pair
    with RpcServer(build, threads=2) as srv:
        env = build.env(PYTHONPATH=cli_env()["PYTHONPATH"])
        # counting at temperature 0 goes on far past the 15 s this waits (about 100 tokens)
        proc = subprocess.Popen([sys.executable, "-m", "cactus_gguf", "run", ver, dra, "-p",
                                 "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", "-n", "3000", "-c", "4096",
                                 "-t", "2", "--temp", "0", "-k", "4", "--json", "--rpc",
                                 srv.endpoint],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        time.sleep(15)  # loaded (~5 s here) and generating
        assert proc.poll() is None, proc.stderr.read()
        srv.kill()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    result = json.loads(out)
    assert result["stop_reason"] == "error"
    assert len(result["tokens"]) > 10 and result["text"]
    assert err.decode().count("\n") == 1 and srv.endpoint in err.decode()


# ------------------------------------------------------------------------------------------------
# Without llama.cpp's RPC build: addresses, the handshake, the build check
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, fragment", [
    ("localhost", "'localhost' is not HOST:PORT"), ("h:0", "'h:0' is not HOST:PORT"),
    ("h:70000", "is not HOST:PORT"), ("a:1,,b:2", "'' is not HOST:PORT"), ("a:1,a:1", "twice"),
    ("[::1]:50052", "not IPv6")])
def test_malformed_addresses_are_refused_before_anything_loads(value, fragment):
    from cactus_gguf.errors import InputError
    from cactus_gguf.options import LoadOptions

    with pytest.raises(InputError) as e:
        LoadOptions(rpc_draft=value)
    assert fragment in str(e.value) and e.value.param == "rpc_draft"


def test_addresses_and_split_are_normalized():
    from cactus_gguf.options import LoadOptions

    lo = LoadOptions(rpc=" 10.0.0.2:50052 , gpu-box:50053", tensor_split="3/1")
    assert (lo.rpc, lo.tensor_split) == ("10.0.0.2:50052,gpu-box:50053", "3,1")


def _fake_rpc_server(reply: bytes):
    """A one-shot TCP server that reads a HELLO and answers ``reply``; returns (endpoint, thread)."""
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = []

    def serve():
        conn, _ = srv.accept()
        with conn:
            data = b""
            while len(data) < 33:
                chunk = conn.recv(64)
                if not chunk:
                    break
                data += chunk
            got.append(data)
            conn.sendall(reply)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return "127.0.0.1:%d" % srv.getsockname()[1], t, got


def test_probe_reads_the_protocol_version():
    import struct

    from cactus_gguf.llama.devices import RpcError, probe

    ep, t, got = _fake_rpc_server(struct.pack("<Q", 28) + bytes([7, 0, 0, 0]) + bytes(24))
    probe(ep)  # protocol 7.x: accepted
    t.join(5)
    # what llama.cpp's client sends: HELLO (14), a uint64 size 24, 24 capability bytes
    assert got[0] == bytes([14]) + struct.pack("<Q", 24) + bytes(24)
    ep, t, _ = _fake_rpc_server(struct.pack("<Q", 28) + bytes([3, 0, 1, 0]) + bytes(24))
    with pytest.raises(RpcError) as e:
        probe(ep, "rpc")
    assert "speaks RPC protocol 3.0.1, this llama.cpp 7.0" in str(e.value) and ep in str(e.value)


def test_without_an_rpc_build_the_error_says_how_to_rebuild():
    import llama_cpp

    from cactus_gguf.llama.devices import RpcError, check_servers

    if llama_cpp.llama_supports_rpc():
        pytest.skip("this llama-cpp-python has RPC")
    with pytest.raises(RpcError) as e:
        check_servers(rpc="127.0.0.1:9")
    assert '-DGGML_RPC=on' in str(e.value) and "--force-reinstall" in str(e.value)


def test_server_over_rpc_then_the_server_dies(build, qwen_pair):
    """``serve --rpc``: the openai client's greedy completion equals the local CLI's; after the
    rpc-server is killed the request in flight and every later one get OpenAI-style 503s with
    code rpc_server_lost naming the address, /health too, and the server process stays up (and
    exits with code 3 when stopped: llama.cpp cannot release the dead connection)."""
    import openai

    from support.server import LiveServer, client

    ver, dra = qwen_pair
    expected = generate(build, qwen_pair, "-n", "24", "--temp", "0", "-k", "4")["text"]
    env = build.env(PYTHONPATH=cli_env()["PYTHONPATH"])
    with RpcServer(build, threads=2) as srv, \
            LiveServer(ver, dra, "-t", "2", "-c", "1024", "--no-repack", "--rpc", srv.endpoint,
                       env=env) as live:
        c = client(live)
        model_id = c.models.list().data[0].id
        got = c.completions.create(model=model_id, prompt=PROMPT, max_tokens=24, temperature=0,
                                   extra_body={"speculative": {"k": 4}})
        assert got.choices[0].text == expected
        srv.kill()
        for _ in range(2):  # the request that meets the dead server, then a later one
            with pytest.raises(openai.APIStatusError) as e:
                c.completions.create(model=model_id, prompt=PROMPT, max_tokens=24, temperature=0)
            assert e.value.status_code == 503
            err = e.value.body if isinstance(e.value.body, dict) else {}
            err = err.get("error", err)
            assert err.get("code") == "rpc_server_lost" and srv.endpoint in err.get("message", "")
        import httpx

        health = httpx.get(live.url + "/health", timeout=10)
        assert health.status_code == 503 and "rpc_server_lost" in health.text
        assert live.proc.poll() is None
        code = live.stop()
    assert code == 3, live.stderr_lines[-5:]
