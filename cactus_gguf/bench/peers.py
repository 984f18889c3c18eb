"""llama.cpp's own speculative decoding as a peer in the benchmark (``bench --peers``).

One ``llama-server`` per peer configuration runs the same verifier and draft GGUFs with llama.cpp's
draft-model speculation, ``-md DRAFT --spec-type draft-simple --spec-draft-n-max K
--spec-draft-n-min 0 --spec-draft-p-min P``, for each fixed k of the grid and each P of
:data:`P_MINS`: 0.75, the default of llama.cpp releases before the ``--spec-*`` options, and 0,
the default of the llama.cpp that llama-cpp-python 0.3.36 vendors. Each prompt goes to it as the
verifier's token ids of the text cactus-gguf decodes, through ``/completion`` with the same
warps (``samplers`` top-k, top-p, min-p, temperature: cactus-gguf's order), seed, ``n_predict``
and stop strings, its prompt cache off (``cache_prompt`` false, ``--cache-ram 0``), one slot.
The servers start once, with the models, and answer in the benchmark's interleaved order, one
run at a time: a server and cactus-gguf never decode at the same time.

llama.cpp drafts greedily (the draft's top token, while its probability is at least P) and accepts a
draft when the verifier's own sample equals it: exact, like SpS.

What a run records (:func:`record_from_response`), in the bench's record fields:
``n_tokens`` = ``tokens_predicted`` without an ending end-of-generation token (``n_end_tokens``
1 then), ``n_drafted`` / ``n_accepted`` = ``timings.draft_n`` / ``timings.draft_n_accepted``,
``n_steps`` (verifier calls) = llama-server's own count, the ``llama_decode`` calls on the
verifier's context during the request (``llamacpp:n_decode_total`` of ``/metrics``, less the
prompt's extra ``-b`` chunks: every call that produced tokens, as cactus-gguf counts them);
``verifier_calls_from`` says so, and ``tokens_minus_accepted`` (tokens produced − accepted drafts,
the count without ``/metrics``, which overcounts acceptance when a stop string ends the answer
inside a step) is kept beside it. Seconds: ``timings.prompt_ms`` and ``predicted_ms``
(``wall_seconds``: the HTTP request); ``cpu_utilisation`` from the server process's CPU time.
"""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import EngineError, InputError

__all__ = ["P_MINS", "DECODER", "peer_configs", "server_args", "LlamaServer",
           "record_from_response", "request_body", "parse_metrics"]

DECODER = "llama-server"  # the configs' ``decoder``: their runs go to a LlamaServer
P_MINS = (0.75, 0.0)
SAMPLERS = ["top_k", "top_p", "min_p", "temperature"]  # cactus-gguf's warp order
START_TIMEOUT = 600.0  # seconds for a server to load the models and answer /health


def peer_configs(ks: Sequence, p_mins: Sequence[float] = P_MINS) -> list[dict]:
    """The peer configurations of a k grid: one per fixed k and p-min (``auto`` has no peer:
    llama-server drafts a fixed length). Raises InputError (param peers) for no fixed k."""
    fixed = [k for k in ks if k != "auto"]
    if not fixed:
        raise InputError("{peers} needs a fixed draft length (-k N): llama-server has no auto",
                         param="peers")
    suffix = len(ks) > 1
    return [{"id": f"llama-server-pmin{p:g}-k{k}",
             "label": f"llama-server p-min {p:g}" + (f" k={k}" if suffix else ""),
             "method": DECODER, "acceptance": DECODER, "drafter": "model", "decoder": DECODER,
             "k": k, "delta": None, "budget": None, "p_min": float(p)}
            for k in fixed for p in p_mins]


def server_args(binary: Path, verifier: Path, draft: Path, cfg: dict, load, port: int,
                threads: int) -> list[str]:
    """llama-server's command line for peer configuration ``cfg`` with cactus-gguf's load
    options ``load`` (context, batch, threads, flash attention, GPU layers)."""
    def layers(n: int) -> str:
        return "all" if n < 0 else str(n)

    t = str(threads)
    return [str(binary), "-m", str(verifier), "-md", str(draft),
            "--spec-type", "draft-simple", "--spec-draft-n-max", str(cfg["k"]),
            "--spec-draft-n-min", "0", "--spec-draft-p-min", f"{cfg['p_min']:g}",
            "-c", str(load.n_ctx), "-b", str(load.n_batch), "-t", t, "-tb", t, "-td", t,
            "-tbd", t, "-fa", load.flash_attn, "-ngl", layers(load.n_gpu_layers),
            "-ngld", layers(load.n_gpu_layers_draft), "-np", "1", "--cache-ram", "0",
            "--metrics", "--no-webui", "--host", "127.0.0.1", "--port", str(port)]


def request_body(tokens: Sequence[int], request, seed: int, stop: Sequence[str]) -> dict:
    """The ``/completion`` body of one run: the prompt's token ids, the request's warps, seed,
    ``n_predict``, stop strings and constraint (a grammar, a JSON Schema or any JSON object)."""
    body = {"prompt": list(tokens), "n_predict": request.n_predict,
            "temperature": request.temperature, "top_k": request.top_k, "top_p": request.top_p,
            "min_p": request.min_p, "samplers": SAMPLERS, "seed": seed, "stop": list(stop),
            "cache_prompt": False, "return_tokens": True, "stream": False}
    if request.grammar:
        body["grammar"] = request.grammar
    elif request.json_schema:
        body["json_schema"] = json.loads(request.json_schema)
    elif request.json_object:
        body["json_schema"] = {"type": "object"}
    return body


def parse_metrics(text: str) -> dict[str, float]:
    """llama-server's Prometheus ``/metrics`` as name (without ``llamacpp:``) -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name.removeprefix("llamacpp:")] = float(value)
        except ValueError:
            continue
    return out


_STOP = {"eos": "eos", "limit": "length", "word": "stop"}


def record_from_response(resp: dict, *, n_batch: int, n_decode: float | None = None,
                         wall_seconds: float | None = None,
                         cpu_seconds: float | None = None) -> dict:
    """A bench run record (the fields the summaries read) from llama-server's ``/completion``
    response ``resp``; ``n_decode``: the ``/metrics`` count of verifier decodes during the request
    (None: verifier calls = tokens − accepted drafts). Raises EngineError for a response that
    lacks the counts."""
    try:
        timings = resp["timings"]
        produced = int(resp["tokens_predicted"])
        prompt_n = int(timings.get("prompt_n", resp.get("tokens_evaluated", 0)))
        prompt_ms, predicted_ms = float(timings["prompt_ms"]), float(timings["predicted_ms"])
        stop = resp.get("stop_type", "")
    except (KeyError, TypeError, ValueError) as e:
        raise EngineError(f"llama-server's /completion response lacks {e}: another llama.cpp "
                          "version?") from None
    drafted = int(timings.get("draft_n", 0))  # absent when nothing was drafted
    accepted = int(timings.get("draft_n_accepted", 0))
    end = 1 if stop == "eos" else 0
    by_tokens = produced - accepted
    if n_decode is not None:
        # the prompt's decodes beyond its first chunk produced no token
        steps = int(n_decode) - max(0, math.ceil(prompt_n / max(1, n_batch)) - 1)
        source = "llama-server /metrics n_decode_total (verifier llama_decode calls)"
    else:
        steps, source = by_tokens, "tokens produced - accepted drafts"
    prefill, decode = prompt_ms / 1e3, predicted_ms / 1e3
    n_tokens = produced - end
    return {
        "stop_reason": _STOP.get(stop, stop or None), "text": resp.get("content", ""),
        "tokens": resp.get("tokens"),
        "n_prompt_tokens": prompt_n, "n_prompt_tokens_reused": 0,  # cache_prompt off
        "n_tokens": n_tokens, "n_end_tokens": end, "n_steps": steps,
        "n_drafted": drafted, "n_accepted": accepted, "n_drafts_used": accepted,
        "n_evaluated": 0, "n_draft_forwards": None,
        "verifier_calls_from": source, "tokens_minus_accepted": by_tokens,
        "kl_sum": 0.0, "kl_max": 0.0, "output_kl_sum": 0.0, "output_kl_max": 0.0,
        "prefill_seconds": prefill, "decode_seconds": decode, "first_token_seconds": prefill,
        "draft_seconds": None, "verify_seconds": None, "accept_seconds": None,
        "other_seconds": None, "answer_seconds": prefill + decode, "wall_seconds": wall_seconds,
        "tokens_per_second": n_tokens / decode if decode > 0 else 0.0,
        "mean_accepted_length": accepted / steps if steps else 0.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_drafted_length": drafted / steps if steps else 0.0,
        "tokens_per_verifier_call": produced / steps if steps else 0.0,
        "cpu_utilisation": (cpu_seconds / wall_seconds if cpu_seconds is not None
                            and wall_seconds else None),
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux /proc; None elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class LlamaServer:
    """One llama-server process of a peer configuration on 127.0.0.1 (a context manager: the
    process ends on exit). ``complete`` runs one prompt and returns its record."""

    def __init__(self, binary: Path, verifier: Path, draft: Path, cfg: dict, load, threads: int,
                 log_dir: Path | None = None) -> None:
        self.cfg, self.n_batch = cfg, load.n_batch
        self.port = _free_port()
        self.args = server_args(binary, verifier, draft, cfg, load, self.port, threads)
        log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.gettempdir())
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log = log_dir / f"{cfg['id']}.log"
        self._log = open(self.log, "w")
        self._log.write("$ " + " ".join(self.args) + "\n")
        self._log.flush()
        try:
            self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        except OSError as e:
            self._log.close()
            raise EngineError(f"cannot run {binary}: {e.strerror or e}") from None
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    def _fail(self, what: str) -> EngineError:
        lines = [s.strip() for s in self.log.read_text(errors="replace").splitlines()
                 if s.strip()]
        hint = next((s for s in reversed(lines) if "error" in s.lower()), lines[-1] if lines
                    else "")
        return EngineError(f"llama-server ({self.cfg['label']}) {what}: {hint[:200]} "
                           f"(log: {self.log})")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise self._fail(f"exited ({self.proc.returncode}) at start")
            try:
                with urllib.request.urlopen(self._url("/health"), timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise self._fail(f"did not answer /health within {START_TIMEOUT:.0f} s")

    def _url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def _get(self, path: str) -> str:
        with urllib.request.urlopen(self._url(path), timeout=60) as r:
            return r.read().decode("utf-8", "replace")

    def n_decode(self) -> float | None:
        """The server's count of ``llama_decode`` calls on the verifier's context so far."""
        try:
            return parse_metrics(self._get("/metrics")).get("n_decode_total")
        except (urllib.error.URLError, OSError):
            return None

    def post(self, body: dict) -> dict:
        """POST ``body`` to /completion; its JSON answer. Raises EngineError."""
        req = urllib.request.Request(self._url("/completion"), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=24 * 3600) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            detail = e.read().decode("utf-8", "replace")[:200]
            raise EngineError(f"llama-server ({self.cfg['label']}) answered {e.code}: "
                              f"{' '.join(detail.split())}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            if self.proc.poll() is not None:
                raise self._fail(f"exited ({self.proc.returncode})") from None
            raise EngineError(f"llama-server ({self.cfg['label']}): {e}") from None

    def complete(self, tokens: Sequence[int], request, seed: int, stop: Sequence[str]) -> dict:
        """One run: its record (:func:`record_from_response`)."""
        before = self.n_decode()
        cpu0, w0 = _cpu_seconds(self.proc.pid), time.perf_counter()
        resp = self.post(request_body(tokens, request, seed, stop))
        wall = time.perf_counter() - w0
        cpu1 = _cpu_seconds(self.proc.pid)
        after = self.n_decode()
        n_decode = after - before if before is not None and after is not None else None
        return record_from_response(resp, n_batch=self.n_batch, n_decode=n_decode,
                                    wall_seconds=wall,
                                    cpu_seconds=cpu1 - cpu0 if None not in (cpu0, cpu1) else None)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> "LlamaServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_servers(stack, configs: Sequence[dict], verifier: Path, draft: Path, load, threads: int,
                 *, log_dir: Path | None = None,
                 say: Callable[[str], None] = lambda _m: None) -> dict[str, LlamaServer]:
    """config id -> a started LlamaServer (entered on ``stack``) for each peer configuration;
    llama-server found or built first (cactus_gguf/bench/build.py)."""
    peers = [c for c in configs if c.get("decoder") == DECODER]
    if not peers:
        return {}
    from .build import llama_server

    binary = llama_server(log=say)
    out = {}
    for c in peers:
        say(f"starting {binary.name} for {c['label']}")
        out[c["id"]] = stack.enter_context(LlamaServer(binary, verifier, draft, c, load, threads,
                                                       log_dir))
    return out


def server_facts(servers: dict[str, LlamaServer]) -> dict | None:
    """For the report: the llama-server binary, its ``--version``, how verifier calls are
    counted, and each peer's command line (None without peers)."""
    if not servers:
        return None
    binary = next(iter(servers.values())).args[0]
    try:
        r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30)
        version = " ".join((r.stdout + r.stderr).split()) or None
    except (OSError, subprocess.SubprocessError):
        version = None
    return {"binary": binary, "version": version,
            "verifier_calls": "llama-server's own count: llama_decode calls on the verifier's "
                              "context during the request (/metrics n_decode_total), less the "
                              "prompt's extra -b chunks; runs also keep tokens produced - "
                              "accepted drafts (tokens_minus_accepted)",
            "acceptance": "timings.draft_n_accepted / timings.draft_n",
            "seconds": "timings.prompt_ms + timings.predicted_ms (wall_seconds: the request)",
            "drafting": "greedy (the draft's top token while its probability >= p-min); "
                        "accepted while the verifier's sample equals the draft (exact)",
            "args": {cid: s.args[1:] for cid, s in servers.items()}}
