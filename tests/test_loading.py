"""Loading and freeing the pair (cactus_gguf/speculative/loading.py and the models' and
contexts' lifetimes): error paths free what they loaded, and load/free cycles keep resident memory
flat. Memory figures are printed (run with -s) and attached to the test report as user properties
("RESOURCES ..." lines).

"Flat" is a trend, not a difference of two samples, of the anonymous resident memory after a trim
(``rss_mib``). Whole-process RSS jumps by tens of MiB with no leak at all: file-backed model pages
come and go with the shared machine's page cache, glibc hands freed arenas back late, repacked
buffers land elsewhere from one load to the next (a CI machine saw 139-175 MiB over 20 cycles with
no trend, and a Theil-Sen slope of -0.5 MiB/cycle that hid a 1 MiB/cycle leak). The anonymous
figure after ``malloc_trim`` stays within 0.1 MiB over the same cycles on an AMD EPYC, and a model
left mapped is checked exactly (``mappings_of``: no mapping of a model file survives its cycle).
Each test samples memory at equal steps and bounds the growth rate (``memory_slope``: robust slopes
of both halves), which a leak of 1 MiB per cycle raises
(``test_the_trend_test_catches_a_leak_of_1_mib_per_cycle``). The load/free cycles run in a fresh
interpreter, where earlier tests' freed heap can neither shift the baseline nor absorb a leak.
(500 generations in one process: tests/test_context.py.)
"""
from __future__ import annotations

import numpy as np
import pytest

from cactus_gguf.llama import Model, ModelLoadError
from cactus_gguf.speculative import VocabMismatchError

from support.harness import (MAX_SLOPE, WARMUP, make_engine, mappings_of, memory_slope,
                             report_resources, rss_mib, track_loads)
from support.tiny_gguf import write_llama

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("resources")
    return {"ver": write_llama(d / "ver.gguf", seed=11),
            "dft": write_llama(d / "dft.gguf", seed=11, noise=0.1, noise_seed=12),
            "other": write_llama(d / "other.gguf", seed=5, eos_id=0)}


# Cycles run in a fresh interpreter: what earlier tests left in this process's heap (freed but
# still resident) can then neither shift the baseline nor absorb a leak, and repacking can be
# forced either way.
_CYCLES = """
import json, sys
args = json.loads(sys.argv[1])
sys.path[:0] = args.pop("path")
from cactus_gguf.llama import ContextOptions
from support.harness import load_free_cycles
rss, secs, maps = load_free_cycles(args.pop("ver"), args.pop("dft"), args.pop("n"),
                                   ContextOptions(n_ctx=args.pop("n_ctx"), n_threads=1), **args)
print(json.dumps({"rss": rss, "secs": secs, "maps": maps}))
"""
N_CYCLES = 24  # load/free cycles of the real pair (the first WARMUP keep one-time allocations)


def cycles_in_subprocess(ver, dft, n: int, n_ctx: int, **kw) -> tuple[list[float], list[float]]:
    """``load_free_cycles`` in a fresh interpreter; (anonymous RSS MiB after each cycle, seconds
    each). Asserts that no cycle left a mapping of a model file behind."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    args = dict(path=[str(here), str(here.parent)], ver=str(ver), dft=str(dft), n=n, n_ctx=n_ctx,
                **kw)
    r = subprocess.run([sys.executable, "-c", _CYCLES, json.dumps(args)], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["maps"] == [0] * n, f"mappings of the model files left after each cycle: {out['maps']}"
    return out["rss"], out["secs"]


def test_20_load_free_cycles_of_tiny_models(models, record_property):
    rss, secs = cycles_in_subprocess(models["ver"], models["dft"], 20, 4096)
    slope = memory_slope(rss[WARMUP:])
    report_resources(record_property, "cycles_tiny",
           f"RSS after cycle {WARMUP} {rss[WARMUP - 1]:.1f} MiB, after cycle 20 {rss[-1]:.1f} MiB "
           f"(trend {slope:+.3f} MiB/cycle), {np.mean(secs):.3f} s/cycle")
    assert slope < MAX_SLOPE / 4


def test_the_trend_test_catches_a_leak_of_1_mib_per_cycle(models):
    rss, _ = cycles_in_subprocess(models["ver"], models["dft"], 16, 512, generate=False,
                                  leak_mib=1.0)
    assert memory_slope(rss[WARMUP:]) > 0.8


def test_the_mapping_check_sees_a_loaded_model(models):
    """``mappings_of`` counts what a loaded model maps (so the cycles' zeros mean something)."""
    with make_engine(models["ver"], models["dft"]):
        assert mappings_of([models["ver"]]) >= 1 and mappings_of([models["dft"]]) >= 1
    assert mappings_of([models["ver"], models["dft"]]) == 0


def _repack_modes():
    from cactus_gguf.llama import build_has_amx, cpu_has_amx

    amx = cpu_has_amx() and build_has_amx()
    return [False, pytest.param(True, marks=pytest.mark.skipif(
        amx, reason="repacking segfaults on an AMX build (llama.cpp #20824)"))]


@pytest.mark.parametrize("repack", _repack_modes(), ids=["repack-off", "repack-on"])
def test_load_free_cycles_of_the_real_pair(qwen_pair, record_property, repack):
    """Both machine kinds' behaviour: weight repacking on (AVX-512 machines) and off (AMX)."""
    ver, dft = qwen_pair
    # no generation (a first decode pages in the weights: ~1 s per cycle on this shared machine);
    # contexts, KV caches and compute buffers are allocated at load all the same
    rss, secs = cycles_in_subprocess(ver, dft, N_CYCLES, 512, generate=False, repack=repack)
    slope = memory_slope(rss[WARMUP:])
    leaky = memory_slope([x + i for i, x in enumerate(rss[WARMUP:])])
    report_resources(record_property, f"cycles_real_pair_repack_{'on' if repack else 'off'}",
           f"RSS after cycle {WARMUP} {rss[WARMUP - 1]:.1f} MiB, after cycle {N_CYCLES} "
           f"{rss[-1]:.1f} MiB, min {min(rss[WARMUP:]):.1f}, max {max(rss[WARMUP:]):.1f}; trend "
           f"{slope:+.3f} MiB/cycle (with 1 MiB/cycle added: {leaky:+.3f}); "
           f"{np.mean(secs):.2f} s/cycle")
    assert slope < MAX_SLOPE, f"resident memory grows by {slope:.2f} MiB per load/free cycle: {rss}"
    # the same samples with a 1 MiB/cycle leak added would fail: the noise does not hide one
    assert leaky > MAX_SLOPE


# ---- error paths free what they loaded ----------------------------------------------------------

@pytest.fixture
def opened(monkeypatch) -> list:
    """Every Model and Context created during the test."""
    return track_loads(monkeypatch)


def freed(m) -> bool:
    return m.closed


def test_a_draft_that_fails_to_load_frees_the_verifier(models, tmp_path, opened):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(models["ver"].read_bytes()[:5000])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        make_engine(models["ver"], bad)
    assert sum(isinstance(m, Model) for m in opened) == 2 and all(freed(m) for m in opened)


def test_a_refused_pair_frees_both_models(models, opened):
    with pytest.raises(VocabMismatchError):
        make_engine(models["ver"], models["other"], draft_vocab="same")
    assert sum(isinstance(m, Model) for m in opened) == 2 and all(freed(m) for m in opened)


def test_a_context_that_cannot_be_created_frees_its_model(models, opened, monkeypatch):
    from llama_cpp import _internals

    def fail(*a, **kw):
        raise ValueError("Failed to create context with model")

    monkeypatch.setattr(_internals, "LlamaContext", fail)
    with pytest.raises(ModelLoadError, match="could not create a context"):
        make_engine(models["ver"], models["dft"])
    assert sum(isinstance(m, Model) for m in opened) == 1 and all(freed(m) for m in opened)


def test_failing_loads_do_not_leak(models, tmp_path, record_property):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(models["ver"].read_bytes()[:200000])  # header fine, tensor data cut
    for _ in range(5):
        with pytest.raises(ModelLoadError):
            make_engine(models["ver"], bad)
    samples = []
    for i in range(40):
        for draft in (bad, models["other"]):
            with pytest.raises((ModelLoadError, VocabMismatchError)):
                make_engine(models["ver"], draft, draft_vocab="same")
        if i % 4 == 3:
            samples.append(rss_mib())
    trend = memory_slope(samples) * 10  # MiB per 80 failing constructions
    report_resources(record_property, "failing_loads",
           f"RSS after 8 failing constructions {samples[0]:.1f} MiB, after 80 {samples[-1]:.1f} MiB "
           f"(trend {trend:+.2f} MiB per 80)")
    assert trend < 4.0
