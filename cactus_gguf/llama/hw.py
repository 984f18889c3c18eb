"""The machine and the llama.cpp build: CPU features (the AMX guard), threads, memory, and the
facts a benchmark report needs to compare runs.

AMX guard (llama.cpp issue #20824): on a CPU with AMX_INT8, a llama.cpp build with AMX kernels
segfaults on the first decode of a Q4_K model when weight repacking into AMX buffers is on.
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import llama_cpp

__all__ = ["cpu_has_amx", "build_has_amx", "default_threads", "physical_memory",
           "machine_facts", "build_facts"]


_CPUINFO = "/proc/cpuinfo"


def _cpuinfo(key: str) -> str | None:
    """The first ``key`` line's value in /proc/cpuinfo (Linux; None elsewhere or when absent)."""
    try:
        with open(_CPUINFO, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _sysctl(name: str) -> str | None:
    """``sysctl -n name`` (macOS and the BSDs), or None when there is no such value or tool."""
    try:
        r = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else None


# Windows: IsProcessorFeaturePresent's PF_* constants (winnt.h) for the flags machine_facts reports
_WINDOWS_FEATURES = {"neon": 19, "avx2": 40, "avx512f": 41}


def _windows_cpu_flags() -> list[str]:
    """The flags Windows reports through IsProcessorFeaturePresent ([] when it cannot say)."""
    try:
        import ctypes

        present = ctypes.windll.kernel32.IsProcessorFeaturePresent  # type: ignore[attr-defined]
        return [name for name, pf in _WINDOWS_FEATURES.items() if present(pf)]
    except (AttributeError, OSError):
        return []


def _windows_cpu_name() -> str | None:
    """The processor's marketing name from the Windows registry, or None."""
    try:
        import winreg

        with winreg.OpenKey(winreg.HKEY_LOCAL_MACHINE,  # type: ignore[attr-defined]
                            r"HARDWARE\DESCRIPTION\System\CentralProcessor\0") as key:
            return str(winreg.QueryValueEx(key, "ProcessorNameString")[0]).strip() or None
    except (ImportError, OSError):
        return None


def _other_cpu_flags() -> list[str]:
    """CPU flags where /proc/cpuinfo says nothing: sysctl on macOS (Intel's feature words, in
    Linux's spelling; Apple silicon's NEON), IsProcessorFeaturePresent on Windows; on any other
    64-bit ARM, NEON (mandatory there); else none."""
    if sys.platform == "darwin":
        words = " ".join(filter(None, (_sysctl("machdep.cpu.features"),
                                       _sysctl("machdep.cpu.leaf7_features")))).lower().split()
        flags = [{"avx512vnni": "avx512_vnni"}.get(w, w) for w in words]
        if _sysctl("hw.optional.neon") == "1":
            flags.append("neon")
        return flags
    if sys.platform == "win32":
        return _windows_cpu_flags()
    return ["neon"] if platform.machine().lower() in ("arm64", "aarch64") else []


def _cpu_flags() -> list[str]:
    """The CPU's flags: /proc/cpuinfo's x86 "flags" or ARM "Features" on Linux, else what the
    platform reports (``_other_cpu_flags``)."""
    flags = _cpuinfo("flags") or _cpuinfo("Features")
    return flags.split() if flags is not None else _other_cpu_flags()


def cpu_has_amx() -> bool:
    """True when this CPU reports AMX_INT8 (Linux ``/proc/cpuinfo`` flag ``amx_int8``; elsewhere
    the platform's flags, which name no AMX today, so the guard stays off there)."""
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
    """Bytes of physical memory, or None when the platform does not say (sysconf on Linux and
    macOS, GlobalMemoryStatusEx on Windows, which has no sysconf)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        pass
    return _windows_memory() if sys.platform == "win32" else None


def _windows_memory() -> int | None:
    try:
        import ctypes

        class MemoryStatusEx(ctypes.Structure):
            _fields_ = [("dwLength", ctypes.c_uint32), ("dwMemoryLoad", ctypes.c_uint32)] + [
                (name, ctypes.c_uint64) for name in (
                    "ullTotalPhys", "ullAvailPhys", "ullTotalPageFile", "ullAvailPageFile",
                    "ullTotalVirtual", "ullAvailVirtual", "ullAvailExtendedVirtual")]

        status = MemoryStatusEx(dwLength=ctypes.sizeof(MemoryStatusEx))
        if ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore[attr-defined]
            return int(status.ullTotalPhys)
    except (AttributeError, OSError):
        pass
    return None


def _cpu_name() -> str:
    """The CPU's name: /proc/cpuinfo on Linux, sysctl on macOS, the registry on Windows, else
    what the platform module knows."""
    name = _cpuinfo("model name")
    if name is None and sys.platform == "darwin":
        name = _sysctl("machdep.cpu.brand_string")
    if name is None and sys.platform == "win32":
        name = _windows_cpu_name()
    return name or platform.processor() or platform.machine()


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
