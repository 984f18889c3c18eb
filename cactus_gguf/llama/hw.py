"""The machine and the llama.cpp build: CPU features (the AMX guard), threads, memory, and the
facts a benchmark report needs to compare runs.

AMX guard (llama.cpp issue #20824): on a CPU with AMX_INT8, a llama.cpp build with AMX kernels
segfaults on the first decode of a Q4_K model when weight repacking into AMX buffers is on.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import llama_cpp

__all__ = ["cpu_has_amx", "build_has_amx", "default_threads", "physical_memory",
           "machine_facts", "build_facts"]


def _cpuinfo(key: str) -> str | None:
    """The first ``key`` line's value in /proc/cpuinfo (Linux; None elsewhere or when absent)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_flags() -> list[str]:
    """The CPU flags of /proc/cpuinfo ([] where there are none, e.g. ARM's "Features")."""
    return (_cpuinfo("flags") or "").split()


def cpu_has_amx() -> bool:
    """True when this CPU reports AMX_INT8 (Linux ``/proc/cpuinfo`` flag ``amx_int8``)."""
    return "amx_int8" in _cpu_flags()


def build_has_amx() -> bool:
    """True when the loaded llama.cpp build was compiled with AMX kernels (``AMX_INT8 = 1``)."""
    return "AMX_INT8 = 1" in system_info()


def system_info() -> str:
    """llama.cpp's one-line feature summary of this build on this CPU."""
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()


def default_threads() -> int:
    """Threads used when none are given: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS / Windows
        return max(1, os.cpu_count() or 1)


def physical_memory() -> int | None:
    """Bytes of physical memory, or None when the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _gpu() -> str:
    if not llama_cpp.llama_supports_gpu_offload():
        return "none"
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
        if r.returncode == 0 and r.stdout.strip():
            return "; ".join(r.stdout.strip().splitlines())
    except (OSError, subprocess.SubprocessError):
        pass
    return "offload-capable build"


def machine_facts() -> dict:
    """CPU model and cores, SIMD flags, memory, GPU, OS and Python: what a reader needs to compare
    runs. Memory in bytes."""
    flags = _cpu_flags()
    return {"cpu": _cpu_name(), "cores_logical": os.cpu_count(), "cores_usable": default_threads(),
            "simd": [f for f in ("avx2", "avx512f", "avx512_vnni", "amx_int8", "neon", "asimd")
                     if f in flags],
            "memory_bytes": physical_memory(), "gpu": _gpu(), "os": platform.platform(),
            "python": platform.python_version()}


def _git_commit(repo: Path) -> str | None:
    if not (repo / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain",
                                "--untracked-files=no"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def build_facts() -> dict:
    """llama.cpp build (llama-cpp-python version and system info), NumPy, cactus-gguf and its git
    commit (source checkouts), and whether the AMX guard turned weight repacking off."""
    import importlib.metadata

    import numpy as np

    try:
        version = importlib.metadata.version("cactus-gguf")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"llama_cpp_python": llama_cpp.__version__, "llama_system_info": system_info(),
            "amx_repack_disabled": cpu_has_amx() and build_has_amx(), "numpy": np.__version__,
            "cactus_gguf": version,
            "git_commit": _git_commit(Path(__file__).resolve().parent.parent.parent)}
