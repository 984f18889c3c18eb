"""A live ``cactus-gguf serve`` in a subprocess on 127.0.0.1 and a random free port, for the
server tests (real uvicorn, real HTTP)."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time

from support.harness import cli_env


class LiveServer:
    """``with LiveServer(args) as s:`` runs ``python -m cactus_gguf serve *args --port 0`` (or
    ``port``) and waits for its "serving ... at URL" line; ``s.url``, ``s.pid``,
    ``s.stderr_lines``. On exit it sends SIGINT and records ``returncode`` (``stop()`` may be
    called earlier)."""

    def __init__(self, *args: str, timeout: float = 300.0, env: dict | None = None,
                 port: int = 0) -> None:
        self.args = [str(a) for a in args]
        self.port = port  # (0: any free port; several --host addresses need one)
        self.timeout = timeout
        self.env = dict(cli_env(), **(env or {}))
        self.stderr_lines: list[str] = []
        self.returncode: int | None = None

    def __enter__(self) -> "LiveServer":
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cactus_gguf", "serve", *self.args, "--port", str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.stderr_lines.append(line.rstrip("\n"))
                if " at http://" in line or "error" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(self.timeout):
            self.proc.kill()
            raise AssertionError(f"the server did not start: {self.stderr_lines}")
        m = next((re.search(r"at (http://\S+)", ln) for ln in self.stderr_lines
                  if " at http://" in ln), None)
        if m is None:
            self.proc.kill()
            raise AssertionError(f"the server did not start: {self.stderr_lines}")
        self.url = m.group(1)
        self.pid = self.proc.pid
        return self

    def stop(self, sig: int = signal.SIGINT) -> int:
        if self.returncode is None:
            self.proc.send_signal(sig)
            try:
                self.returncode = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.returncode = self.proc.wait(10)
            time.sleep(0.1)  # let the reader thread collect the last lines
        return self.returncode

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def rss_mib(self) -> float:
        with open(f"/proc/{self.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@contextlib.contextmanager
def serving(*args: str, **kw):
    """``with serving(args) as s:`` a :class:`LiveServer` that must stop cleanly: on leaving,
    its exit code is 0 and its stderr holds no traceback (the module fixtures of the server tests:
    ``yield`` inside it)."""
    with LiveServer(*args, **kw) as s:
        yield s
    assert s.returncode == 0 and not any("Traceback" in ln for ln in s.stderr_lines), \
        s.stderr_lines


def tiny_chat_pair(d) -> dict:
    """{"ver", "dft"}: the tiny pair in directory ``d`` with the tiny chat template and a zero EOS
    output row (no end before n_predict); the draft is the verifier with noisy weights."""
    from support.tiny_gguf import CHAT_TEMPLATE, EOS, write_llama

    return {"ver": write_llama(d / "ver.gguf", seed=11, zero_output_rows=[EOS],
                               chat_template=CHAT_TEMPLATE),
            "dft": write_llama(d / "dft.gguf", seed=11, zero_output_rows=[EOS], noise=0.1,
                               noise_seed=12, chat_template=CHAT_TEMPLATE)}


def client(server: LiveServer, **kw):
    """The official openai client pointed at the server."""
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=kw.pop("api_key", "none"),
                         max_retries=0, timeout=kw.pop("timeout", 120), **kw)


def sse_events(response) -> list[str]:
    """The ``data:`` payloads of an httpx streaming response, in order."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data:"):
            out.append(line[5:].strip())
    return out


__all__ = ["LiveServer", "serving", "tiny_chat_pair", "client", "sse_events", "signal"]
