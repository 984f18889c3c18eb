"""Sampled tool calls through the openai client: does every call's arguments validate?

    python benchmarks/tool_calls.py [--requests 20] [-t THREADS] [-o benchmarks/results/tool-calls]

Starts ``cactus-gguf serve`` on the registry's default pair (its sampling: temperature 0.6,
top-k 20, top-p 0.95; k auto) and sends sampled chat requests with tools, a different seed each:
four questions over three tool sets (weather with an enum, arithmetic with numbers, a search
with optional and array arguments), each asked in turn, the rounds alternately under
tool_choice "auto" and "required". Every call
returned is checked with the jsonschema package against its tool's parameters. An "auto" request
may also answer in text (counted apart).

Writes tool-calls.json (every request) and tool-calls.md (the counts).
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import openai

from cactus_gguf.llama.hw import build_facts, machine_facts

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "The local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"], "additionalProperties": False}}}]
MATH = [{"type": "function", "function": {
    "name": name, "description": f"{name.capitalize()} two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
    for name in ("add", "multiply")]
SEARCH = [{"type": "function", "function": {
    "name": "search_code", "description": "Search the repository's code",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "minLength": 1},
        "languages": {"type": "array", "items": {"enum": ["python", "c", "rust"]}},
        "max_results": {"type": "integer", "minimum": 1, "maximum": 50}},
        "required": ["query"], "additionalProperties": False}}}]
QUESTIONS = [("What is the weather in Lisbon right now, in celsius?", WEATHER),
             ("What time is it in Tokyo?", WEATHER),
             ("What is 1234.5 multiplied by 6.5?", MATH),
             ("Find where the Python code parses JSON schemas; ten results at most.", SEARCH)]


def serve(threads: int | None):
    """A running server on the default pair and its URL."""
    cmd = [sys.executable, "-m", "cactus_gguf", "serve", "--port", "0", "-c", "2048"]
    cmd += ["-t", str(threads)] if threads else []
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    url = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stderr:
            m = re.search(r" at (http://\S+)", line)
            if m and not url:
                url.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    ready.wait(900)
    if not url:
        proc.kill()
        raise SystemExit("the server did not start")
    return proc, url[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("-n", "--max-tokens", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-o", "--output", default="benchmarks/results/tool-calls")
    args = ap.parse_args()

    proc, url = serve(args.threads)
    rows = []
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=1800,
                               max_retries=0)
        model = client.models.list().data[0].id
        for i in range(args.requests):
            question, tools = QUESTIONS[i % len(QUESTIONS)]
            choice = "auto" if (i // len(QUESTIONS)) % 2 == 0 else "required"
            schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
            t0 = time.perf_counter()
            r = client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": question}], tools=tools,
                tool_choice=choice, max_tokens=args.max_tokens, seed=i)
            seconds = time.perf_counter() - t0
            calls, valid = r.choices[0].message.tool_calls or [], []
            for call in calls:
                try:
                    jsonschema.validate(json.loads(call.function.arguments),
                                        schemas[call.function.name])
                    valid.append(True)
                except (jsonschema.ValidationError, KeyError, json.JSONDecodeError):
                    valid.append(False)
            spec = r.model_extra["speculative"]
            rows.append({"request": i, "question": question, "tool_choice": choice,
                         "finish_reason": r.choices[0].finish_reason,
                         "calls": [{"name": c.function.name, "arguments": c.function.arguments}
                                   for c in calls],
                         "valid": valid, "content": r.choices[0].message.content,
                         "seconds": seconds, "completion_tokens": r.usage.completion_tokens,
                         "acceptance_rate": spec["acceptance_rate"],
                         "prompt_tokens_reused": spec["prompt_tokens_reused"]})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(60)

    n_calls = sum(len(r["calls"]) for r in rows)
    n_valid = sum(sum(r["valid"]) for r in rows)
    summary = {}
    for choice in ("auto", "required"):
        mine = [r for r in rows if r["tool_choice"] == choice]
        summary[choice] = {
            "requests": len(mine), "with_calls": sum(bool(r["calls"]) for r in mine),
            "calls": sum(len(r["calls"]) for r in mine),
            "valid": sum(sum(r["valid"]) for r in mine),
            "finish_tool_calls": sum(r["finish_reason"] == "tool_calls" for r in mine),
            "seconds_mean": sum(r["seconds"] for r in mine) / max(1, len(mine)),
            "acceptance_rate_mean": sum(r["acceptance_rate"] or 0 for r in mine)
            / max(1, len(mine))}
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    report = {"requests": rows, "summary": summary, "calls": n_calls, "valid": n_valid,
              "max_tokens": args.max_tokens, "machine": machine_facts(), "build": build_facts()}
    (out / "tool-calls.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    head = ["tool_choice", "requests", "with calls", "calls", "valid", "finish tool_calls",
            "s per request", "acceptance"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for choice, s in summary.items():
        md.append(f"| {choice} | {s['requests']} | {s['with_calls']} | {s['calls']} | "
                  f"{s['valid']} | {s['finish_tool_calls']} | {s['seconds_mean']:.1f} | "
                  f"{s['acceptance_rate_mean']:.2f} |")
    m = report["machine"]
    md += ["", f"{len(rows)} sampled requests (seed = request number) on the default pair with "
               f"its sampling, max_tokens {args.max_tokens}: {n_valid} of {n_calls} calls "
               f"validate against their tool's schema (jsonschema). Machine: {m['cpu']}, "
               f"{m['cores_usable']} usable cores."]
    (out / "tool-calls.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print("\n".join(md))


if __name__ == "__main__":
    main()
