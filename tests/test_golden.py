"""Same seed, same tokens: the golden ids of tests/golden/cases.py, recorded by
tests/golden/record.py before a refactor, must come out of the current code unchanged.

The ids depend on llama.cpp's CPU kernels (float rounding), so they are stored under what picks
those kernels (golden_run.kernel_key: the CPU features llama.cpp's build uses, weight repacking,
the thread count, pinned at golden_run.THREADS). Recorded: an AMD EPYC with AVX2 only, an AMD EPYC
with AVX-512 (VBMI, VNNI, BF16) and one that also has AVX-VNNI; an Intel Xeon with AMX is not
(there the AMX guard turns repacking off: another key). On a machine whose key has no entry the
cases cannot be compared and are skipped (record them there with ``python tests/golden/record.py``
on a commit known to be good). The native helper's own cases (tests/golden/native.json) need no
model and no key: they are compared on every machine.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN))

from cases import NATIVE_CASES, REAL_CASES, REAL_PROMPTS, TINY_CASES, TINY_PROMPTS  # noqa: E402
from golden_run import (THREADS, engine_key, generate_ids, kernel_key, load_pair,  # noqa: E402
                        native_steps)

# llama.cpp's feature lines of the machines the entries were recorded on (their bench.json files in
# benchmarks/results: "llama_system_info"), all with repacking on and THREADS threads
RECORDED_ON = {
    "AMD EPYC, AVX2": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
                      "BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |",
    "AMD EPYC, AVX-512": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
                         "BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | "
                         "AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |",
    "AMD EPYC, AVX-512 and AVX-VNNI": "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | "
                                      "AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
                                      "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
                                      "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |",
}


def _check(paths, cases, prompts, set_name, n_ctx):
    data = json.loads((GOLDEN / "golden.json").read_text())
    with load_pair(*paths, n_ctx=n_ctx) as engine:
        key = engine_key(engine)
        if key not in data or set_name not in data[key]:
            pytest.skip(f"no golden ids for {key!r}: record them with tests/golden/record.py")
        want = data[key][set_name]
        assert set(want) == {name for name, _ in cases}
        diff = [name for name, c in cases
                if generate_ids(engine, prompts[c["prompt"]], c) != want[name]]
    assert not diff, f"{len(diff)} of {len(cases)} cases changed: {diff[:8]}"


def test_golden_ids_on_the_tiny_pair(tiny_pair):
    _check(tiny_pair, TINY_CASES, TINY_PROMPTS, "tiny", 512)


def test_golden_ids_on_the_real_pair(qwen_pair):
    _check(qwen_pair, REAL_CASES, REAL_PROMPTS, "real", 1024)


def test_each_recorded_machine_has_its_entry_and_nothing_else_is_recorded():
    """The keys are what kernel_key makes of each recorded machine's feature line (a change of the
    key's wording would otherwise skip the golden tests everywhere)."""
    data = json.loads((GOLDEN / "golden.json").read_text())
    keys = {kernel_key(line, True, THREADS) for line in RECORDED_ON.values()}
    assert set(data) == keys and len(keys) == len(RECORDED_ON)
    assert all(set(data[key]) == {"tiny", "real"} for key in keys)


def test_the_key_names_what_picks_the_kernels():
    amx = ("CPU : AVX = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
           "REPACK = 1 | RPC : X = 1 |")
    assert kernel_key(amx, False, 4) == "avx avx2 avx512 amx_int8 llamafile | no repack | 4 threads"
    # a build without REPACK repacks nothing, whatever the load asks
    assert kernel_key("CPU : NEON = 1 | SVE_CNT = 16 |", True, 2) == \
        "neon sve_cnt=16 | no repack | 2 threads"


@pytest.mark.parametrize("name, acc", NATIVE_CASES, ids=[n for n, _ in NATIVE_CASES])
def test_golden_native_steps(name, acc):
    want = json.loads((GOLDEN / "native.json").read_text())[name]
    assert native_steps(acc) == want
