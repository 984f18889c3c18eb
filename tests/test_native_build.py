"""The native helper builds portably: GCC, Clang and a MinGW-w64 cross-compile for Windows at
-Wall -Wextra -Wpedantic -Werror, exporting exactly the CG_API functions of native/cactus_native.h;
a Clang build makes the same decisions bit for bit; a wheel built here installs and loads in a
fresh virtual environment.

Debian's ``clang`` and ``gcc-mingw-w64-x86-64`` are installed when missing (as root, with apt-get),
as the chat-page test does for chromium. The wheel test (``slow``, ~30 s) builds in isolation and
installs numpy into the fresh environment, so it needs the package index (it skips without one);
deselect it with ``-m "not slow"``.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from support.system_packages import apt_install

from cactus_gguf.sampling import _clib

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "native"
SOURCES = sorted(str(p) for p in NATIVE.glob("*.c"))
WARNINGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-ffp-contract=off"]
MINGW = "x86_64-w64-mingw32-gcc"


def public_functions() -> set[str]:
    """The functions cactus_native.h declares with CG_API."""
    text = (NATIVE / "cactus_native.h").read_text()
    return set(re.findall(r"^CG_API [^(]*?\b(cg_\w+)\(", text, flags=re.M))


def _ensure_tools() -> None:
    if shutil.which("clang") and shutil.which(MINGW):
        return
    apt_install("the build test", ["clang", "gcc-mingw-w64-x86-64"])


@pytest.fixture(scope="module")
def tools():
    _ensure_tools()


def compile_library(compiler: str, out: Path) -> Path:
    windows = compiler == MINGW
    flags = WARNINGS + ([] if windows else ["-fPIC", "-fvisibility=hidden"])
    r = subprocess.run([compiler, *flags, "-shared", "-o", str(out), *SOURCES]
                       + ([] if windows else ["-lm"]), capture_output=True, text=True)
    assert r.returncode == 0, f"{compiler} failed:\n{r.stderr}"
    assert r.stderr == "", r.stderr  # not even a note
    return out


@pytest.mark.parametrize("compiler", ["gcc", "clang"])
def test_builds_warning_free_and_exports_only_the_api(tools, tmp_path, compiler):
    lib = compile_library(compiler, tmp_path / f"libcg_{compiler}.so")
    nm = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                        check=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines() if " T " in line}
    assert exported == public_functions()


def test_cross_compiles_for_windows_with_dll_exports(tools, tmp_path):
    dll = compile_library(MINGW, tmp_path / "_cactus_native.dll")
    dump = subprocess.run(["x86_64-w64-mingw32-objdump", "-p", str(dll)], capture_output=True,
                          text=True, check=True).stdout
    table = dump.split("[Ordinal/Name Pointer] Table", 1)[1].split("\n\n", 1)[0]
    exported = set(re.findall(r"\]\s+(\w+)", table))
    assert exported == public_functions()  # CG_API's dllexport, nothing else, no PyInit_


def _bind(lib: ctypes.CDLL) -> ctypes._CFuncPtr:
    P, i32 = ctypes.c_void_p, ctypes.c_int32
    lib.cg_verify.restype = ctypes.c_int
    lib.cg_verify.argtypes = [P, P, P, P, i32, i32, P, P, P, P, P]
    lib.cg_rng_seed.restype = None
    lib.cg_rng_seed.argtypes = [P, ctypes.c_uint64]
    return lib.cg_verify


def _trace(lib: ctypes.CDLL, cases) -> list[tuple]:
    verify = _bind(lib)
    out = []
    for sp, ap, probs, tokens, logits, work in cases:
        rng = _clib._RngC()
        lib.cg_rng_seed(ctypes.addressof(rng), 7)
        res = _clib._StepResultC()
        for _ in range(3):
            st = verify(probs.ctypes.data, tokens.ctypes.data, logits.ctypes.data, None,
                        len(tokens), logits.shape[1], ctypes.addressof(sp), ctypes.addressof(ap),
                        ctypes.addressof(rng), work.ctypes.data, ctypes.addressof(res))
            assert st == 0
            out.append(tuple(getattr(res, f) for f, _ in res._fields_))
    return out


def test_a_clang_build_makes_the_same_decisions_bit_for_bit(tools, tmp_path):
    """Every rule, both budgets, top-k / top-p / min-p / dense warps: the Clang library returns the
    installed (GCC) library's results exactly, floats included."""
    lib = ctypes.CDLL(str(compile_library("clang", tmp_path / "libcg_clang.so")))
    rng = np.random.default_rng(3)
    V, k = 3000, 4
    work = np.empty(_clib._workspace_size(V), np.float32)
    cases = []
    for method, value in _clib.METHOD_VALUES.items():
        for budget in _clib.BUDGET_VALUES.values():
            for warp in [(0.7, 20, 0.95, 0.0), (1.0, 0, 0.9, 0.0), (1.3, 0, 1.0, 0.02)]:
                logits = (3 * rng.standard_normal((k + 1, V))).astype(np.float32)
                probs = np.abs(logits[:k] + rng.standard_normal((k, V)).astype(np.float32))
                probs /= probs.sum(axis=1, keepdims=True)
                tokens = rng.integers(0, V, k).astype(np.int32)
                ap = _clib._AcceptParamsC(method=value, solver=_clib.SOLVER_VALUES["exact"],
                                          delta=0.5, typical_epsilon=0.09, typical_alpha=0.3,
                                          accept_top_k=5, budget=budget, output_kl=1)
                cases.append((_clib._SamplerParamsC(*warp), ap, probs, tokens, logits, work))
    assert _trace(lib, cases) == _trace(_clib._lib, cases)


def _offline(stderr: str) -> bool:
    """pip failed for want of the package index (not because of this package)."""
    return any(m in stderr for m in ("No matching distribution", "Could not find a version",
                                     "NewConnectionError", "Temporary failure in name resolution"))


@pytest.mark.slow
def test_a_wheel_built_here_installs_and_loads_in_a_fresh_venv(tmp_path):
    """sdist (MANIFEST.in must ship every native/ file) -> wheel -> a new venv with numpy only."""
    dist, wheels, venv = tmp_path / "dist", tmp_path / "wheels", tmp_path / "venv"
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=ROOT,
                   check=True, capture_output=True)
    (sdist,) = dist.glob("*.tar.gz")
    # an isolated build, as pip does for users: setuptools and wheel come from the package index
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w",
                            str(wheels), str(sdist)], capture_output=True, text=True)
    if built.returncode != 0 and _offline(built.stderr):
        pytest.skip("no package index for the isolated build's setuptools")
    assert built.returncode == 0, built.stderr
    (wheel,) = wheels.glob("cactus_gguf-*.whl")
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # only the venv's packages
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True,
                   env=clean)
    py = venv / ("Scripts" if sys.platform == "win32" else "bin") / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                   capture_output=True, env=clean)
    numpy = subprocess.run([str(py), "-m", "pip", "install", "-q", "numpy"], capture_output=True,
                           text=True, env=clean)
    if numpy.returncode != 0 and _offline(numpy.stderr):
        pytest.skip("no package index for numpy in the fresh venv")
    assert numpy.returncode == 0, numpy.stderr
    probe = ("import numpy as np\n"
             "from cactus_gguf.sampling import _clib, AcceptanceParams, NativeSampler, SamplingParams\n"
             "s = NativeSampler(5, SamplingParams(), AcceptanceParams(), 1)\n"
             "r = s.verify(None, np.array([2], np.int32), np.zeros((2, 5), np.float32))\n"
             "print(_clib._lib._name, r.n_evaluated)\n")
    r = subprocess.run([str(py), "-c", probe], cwd=tmp_path, env=clean, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    loaded, n_evaluated = r.stdout.split()
    assert Path(loaded).is_relative_to(venv) and Path(loaded).name == "_cactus_native.so"
    assert n_evaluated == "1"
