"""Same seed, same tokens: the golden ids of tests/golden/cases.py, recorded by
tests/golden/record.py before a refactor, must come out of the current code unchanged.

The ids depend on llama.cpp's CPU kernels (float rounding), so they are stored per machine
signature; on a machine with no recorded signature the cases cannot be compared and are skipped
(record them there with ``python tests/golden/record.py`` on a commit known to be good).
The native helper's own cases (tests/golden/native.json) need no model and no signature: they are
compared on every machine.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from cases import NATIVE_CASES, REAL_CASES, REAL_PROMPTS, TINY_CASES, TINY_PROMPTS  # noqa: E402
from golden_run import generate_ids, load_pair, native_steps, signature  # noqa: E402


def _check(paths, cases, prompts, set_name, n_ctx):
    data = json.loads((GOLDEN / "golden.json").read_text())
    with load_pair(*paths, n_ctx=n_ctx) as engine:
        sig = signature(engine)
        if sig not in data or set_name not in data[sig]:
            pytest.skip(f"no golden ids for machine signature {sig}: record them with "
                        "tests/golden/record.py")
        want = data[sig][set_name]
        assert set(want) == {name for name, _ in cases}
        diff = [name for name, c in cases
                if generate_ids(engine, prompts[c["prompt"]], c) != want[name]]
    assert not diff, f"{len(diff)} of {len(cases)} cases changed: {diff[:8]}"


def test_golden_ids_on_the_tiny_pair(tiny_pair):
    _check(tiny_pair, TINY_CASES, TINY_PROMPTS, "tiny", 512)


def test_golden_ids_on_the_real_pair(qwen_pair):
    _check(qwen_pair, REAL_CASES, REAL_PROMPTS, "real", 1024)


@pytest.mark.parametrize("name, acc", NATIVE_CASES, ids=[n for n, _ in NATIVE_CASES])
def test_golden_native_steps(name, acc):
    want = json.loads((GOLDEN / "native.json").read_text())[name]
    assert native_steps(acc) == want
