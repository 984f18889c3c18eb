"""Many callers at once: aggregate tokens per second and per-request latency for 1, 2 and 4
concurrent clients, against cactus-gguf serve with one slot, with ``--parallel 4``, and llama.cpp's
llama-server ``--parallel 4`` with its draft-simple speculation (issue 55).

    python benchmarks/parallel_slots.py [--clients 1,2,4] [--requests 2] [-n 64] [--rounds 2]
                                        [-k 4] [-t THREADS] [-o benchmarks/results/parallel-slots]

The three servers serve the registry's default pair (Qwen2.5-Coder 1.5B + 0.5B Q4_K_M), are
started once, side by side, and each is idle while another is measured. A cell is one server
and one number of clients c: c threads, each sending ``--requests`` chat requests one after the
other (questions from prompts/chat-questions.jsonl, a different one per request), greedy,
``max_tokens`` n with ``ignore_eos`` (every answer is n tokens, whatever the model would say),
no prefix reuse (``cache_prompt`` false: every request processes its prompt). The cells run
interleaved: for each round, for each c, each server in turn (the order rotating by round).

Speculation: a fixed draft length k on all three (llama-server drafts a fixed length):
cactus-gguf ``-k K --method greedy`` (llama-server's rule; at temperature 0 every rule emits
the verifier's greedy tokens), llama-server ``--spec-type draft-simple --spec-draft-n-max K
--spec-draft-n-min 0 --spec-draft-p-min 0`` (a draft of K every step). The same context
(-c 8192: 2048 a slot with 4 slots), threads and weight repacking (off on an AMX CPU, as the
AMX crash note requires) for all.

Measured per request: the seconds from sending it to its whole answer (the client's clock), its
completion tokens; per cell: aggregate tokens per second = every answer's tokens / the cell's
wall seconds. Reported: per server and c, the median over rounds of the aggregate tok/s and of
the cell's median request latency, and the ratios to the one-slot server. Writes bench.json
and bench.md under -o. Valid only with nothing else running on the machine (llama.cpp's
threads spin-wait).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from cactus_gguf.bench.build import llama_server
from cactus_gguf.bench.prompts import load_prompts_jsonl
from cactus_gguf.llama.hw import build_facts, default_threads, machine_facts
from cactus_gguf.registry import load_registry, resolve_model

HERE = Path(__file__).resolve().parent
N_CTX = 8192


def amx() -> bool:
    """An AMX CPU: llama.cpp's weight repacking crashes there (model-sources.md), so it is off."""
    return "amx_int8" in machine_facts()["simd"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One server process (``cmd`` with ``--port``), ready once /health answers 200."""

    def __init__(self, name: str, cmd: list[str]) -> None:
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(f"/tmp/parallel-slots-{name.replace(' ', '_')}.log", "w")
        self.proc = subprocess.Popen([*cmd, "--port", str(self.port)], stdout=self.log,
                                     stderr=subprocess.STDOUT, env={**os.environ})
        self.cmd = cmd

    def wait(self, timeout: float = 600) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited: see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise SystemExit(f"{self.name} did not start in {timeout} s")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def servers(ver: Path, dft: Path, k: int, threads: int) -> list[Server]:
    t = str(threads)
    common = ["-c", str(N_CTX), "-t", t]
    ours = [sys.executable, "-m", "cactus_gguf", "serve", str(ver), str(dft), *common,
            "-k", str(k), "--method", "greedy", "--host", "127.0.0.1"]
    if amx():
        ours += ["--no-repack"]
    binary = llama_server(log=print)
    theirs = [str(binary), "-m", str(ver), "-md", str(dft), *common, "-tb", t, "-td", t,
              "-tbd", t, "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
              "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-np", "4",
              "--cache-ram", "0", "--no-webui", "--host", "127.0.0.1"]
    if amx():
        theirs += ["-nr"]
    return [Server("cactus-gguf -np 1", ours + ["-np", "1"]),
            Server("cactus-gguf -np 4", ours + ["-np", "4"]),
            Server("llama-server -np 4", theirs)]


def cell(server: Server, clients: int, requests: int, n: int, questions: list[str],
         offset: int) -> dict:
    """``clients`` threads, ``requests`` each in turn; per request (seconds, tokens)."""
    results: list[tuple[float, int]] = []
    errors: list[str] = []

    def client(c: int) -> None:
        with httpx.Client(timeout=900) as http:
            for r in range(requests):
                q = questions[(offset + c * requests + r) % len(questions)]
                body = {"messages": [{"role": "user", "content": q}], "max_tokens": n,
                        "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
                        "seed": 1}
                t0 = time.perf_counter()
                resp = http.post(server.url + "/v1/chat/completions", json=body)
                dt = time.perf_counter() - t0
                if resp.status_code != 200:
                    errors.append(resp.text[:200])
                    continue
                results.append((dt, resp.json()["usage"]["completion_tokens"]))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"{server.name}: {errors[0]}")
    tokens = sum(t for _, t in results)
    return {"server": server.name, "clients": clients, "wall_seconds": wall, "tokens": tokens,
            "tok_per_s": tokens / wall, "latencies": [d for d, _ in results],
            "median_latency": statistics.median(d for d, _ in results)}


def report(cells: list[dict], names: list[str], args, facts: dict) -> str:
    base = names[0]
    lines = ["# Parallel slots: aggregate tok/s and request latency", "",
             f"`python benchmarks/parallel_slots.py --clients {args.clients} --requests "
             f"{args.requests} -n {args.n} --rounds {args.rounds} -k {args.k} -t {args.threads}`",
             "", f"Machine: {facts['machine']['cpu']}, {facts['machine']['cores_logical']} "
             f"logical cores, SIMD {', '.join(facts['machine']['simd'])}; "
             f"{args.threads} threads per server; nothing else running.", "",
             "| server | clients | aggregate tok/s | × one slot | median request s | "
             "× one slot |", "|---|---:|---:|---:|---:|---:|"]
    med = {}
    for c in [int(x) for x in args.clients.split(",")]:
        for name in names:
            mine = [x for x in cells if x["server"] == name and x["clients"] == c]
            med[name, c] = (statistics.median(x["tok_per_s"] for x in mine),
                            statistics.median(x["median_latency"] for x in mine))
        for name in names:
            tps, lat = med[name, c]
            lines.append(f"| {name} | {c} | {tps:.2f} | {tps / med[base, c][0]:.2f} | "
                         f"{lat:.2f} | {lat / med[base, c][1]:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per cell")
    ap.add_argument("-n", type=int, default=64, help="max_tokens of every request")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("-t", "--threads", type=int, default=default_threads())
    ap.add_argument("-o", "--out", default=str(HERE / "results" / "parallel-slots"))
    args = ap.parse_args()
    reg = load_registry()
    pair = reg.default_pair
    ver, dft = resolve_model(pair.verifier), resolve_model(pair.draft)
    questions = [p.text for p in load_prompts_jsonl(HERE / "prompts" / "chat-questions.jsonl")]
    group = servers(ver, dft, args.k, args.threads)
    try:
        for s in group:
            s.wait()
        names = [s.name for s in group]
        cells, offset = [], 0
        for rnd in range(args.rounds):
            for c in [int(x) for x in args.clients.split(",")]:
                order = group[rnd % len(group):] + group[:rnd % len(group)]
                for s in order:
                    got = cell(s, c, args.requests, args.n, questions, offset)
                    got["round"] = rnd
                    cells.append(got)
                    print(f"round {rnd} clients {c} {s.name}: {got['tok_per_s']:.2f} tok/s, "
                          f"median {got['median_latency']:.2f} s", flush=True)
                offset += c * args.requests
    finally:
        for s in group:
            s.stop()
    facts = {"machine": machine_facts(), "build": build_facts(),
             "commands": {s.name: s.cmd for s in group}}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps({"args": vars(args), "facts": facts,
                                                "cells": cells}, indent=1))
    (out / "bench.md").write_text(report(cells, names, args, facts))
    print((out / "bench.md").read_text())


if __name__ == "__main__":
    main()
