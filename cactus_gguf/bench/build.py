"""llama.cpp programs built from the llama.cpp that the installed llama-cpp-python vendors.

``bench --peers`` runs llama.cpp's own server (``llama-server``) beside cactus-gguf, and it must
be the llama.cpp cactus-gguf runs on: :func:`llama_server` takes ``llama-server`` from ``PATH``
when there is one, else builds it once from the vendored source of the llama-cpp-python sdist
(``pip download llama-cpp-python==<installed version> --no-binary :all:``, or the archive given),
CPU only, into ``<cache>/llama-server/<version>-<flags and CPU hash>/bin/llama-server``
(``<cache>`` = ``$CACTUS_GGUF_CACHE``, else ``~/.cache/cactus-gguf``): about 10 minutes on 2
cores, once. The binary is static (no shared libraries to find) and built for this CPU
(llama.cpp's ``GGML_NATIVE``), which is why the CPU's flags are part of the cache key.

The same steps (:func:`cmake_build_vendored`) build the GPU and RPC libraries of the tests
(tests/support/llama_build.py, tests/support/rpc.py). Needs ``cmake``, ``ninja`` (else make) and a
C++ compiler; without them, or when the build fails, a one-line :class:`BuildError` says what is
missing and where the build log is.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..errors import EngineError

__all__ = ["BuildError", "cache_root", "run_logged", "vendored_source", "cmake_build_vendored",
           "llama_server", "SERVER_FLAGS", "SERVER_BINARY"]

SERVER_BINARY = "llama-server"
# llama-server alone, CPU only, static: no tests, examples, web UI (whose assets would be
# downloaded), HTTPS or curl (LLAMA_CURL is a deprecated no-op in this llama.cpp; LLAMA_OPENSSL
# is what links a TLS library)
SERVER_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF",
                "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF")


class BuildError(EngineError):
    """A llama.cpp program could not be found or built (one line: what failed, where the log is)."""


def cache_root() -> Path:
    """cactus-gguf's file cache (``$CACTUS_GGUF_CACHE``, else ``~/.cache/cactus-gguf``)."""
    from ..registry.cache import cache_dir

    return cache_dir()


def run_logged(cmd: Sequence[str], log: Path, cwd: Path | None = None) -> None:
    """Run ``cmd`` with its output appended to ``log``; a non-zero exit raises BuildError naming
    the command, its last line of output and the log."""
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        try:
            r = subprocess.run(list(cmd), cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
        except OSError as e:
            raise BuildError(f"cannot run {cmd[0]}: {e.strerror or e}") from None
    if r.returncode != 0:
        lines = [s for s in log.read_text(errors="replace").splitlines() if s.strip()]
        last = lines[-1].strip() if lines else ""
        raise BuildError(f"{Path(cmd[0]).name} failed (exit {r.returncode}): {last[:200]} "
                         f"(log: {log})")


def llama_cpp_python_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        raise BuildError("llama-cpp-python is not installed: nothing to build llama.cpp "
                         "from") from None


def vendored_source(tmp: Path, log: Path, sdist: Path | None = None) -> Path:
    """The llama.cpp source tree that llama-cpp-python's sdist vendors, extracted under ``tmp``
    (the sdist: ``sdist``, else the installed version's, downloaded with pip into ``tmp``)."""
    if sdist is None:
        run_logged([sys.executable, "-m", "pip", "download",
                    f"llama-cpp-python=={llama_cpp_python_version()}", "--no-deps",
                    "--no-binary", ":all:", "-d", str(tmp), "-q"], log)
        sdist = next(tmp.glob("llama_cpp_python-*.tar.gz"), None)
        if sdist is None:
            raise BuildError(f"pip downloaded no llama-cpp-python sdist (log: {log})")
    try:
        with tarfile.open(sdist) as tf:
            members = [m for m in tf.getmembers() if "/vendor/llama.cpp/" in m.name]
            tf.extractall(tmp, members=members, filter="data")
    except (OSError, tarfile.TarError) as e:
        raise BuildError(f"cannot read the llama-cpp-python sdist {sdist}: {e}") from None
    src = next(tmp.glob("llama_cpp_python-*/vendor/llama.cpp"), None)
    if src is None:
        raise BuildError(f"{sdist} holds no vendor/llama.cpp")
    return src


def cmake_build_vendored(flags: Iterable[str], targets: Iterable[str], log: Path, *,
                         sdist: Path | None = None, jobs: int | None = None,
                         patch: Callable[[Path], None] | None = None,
                         collect: Callable[[Path], None]) -> None:
    """Configure the vendored llama.cpp (:func:`vendored_source`) with ``flags``, build
    ``targets``, then ``collect(build_dir)`` (copy what was built out of the temporary tree).
    ``patch(src)`` edits the source first. Raises BuildError."""
    if shutil.which("cmake") is None:
        raise BuildError("building llama.cpp needs cmake (and a C++ compiler): none on PATH")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    with tempfile.TemporaryDirectory(prefix="cactus-llama-build-") as tmp:
        tmp = Path(tmp)
        src = vendored_source(tmp, log, sdist)
        if patch is not None:
            patch(src)
        build = tmp / "build"
        run_logged(["cmake", "-S", str(src), "-B", str(build), *generator, *flags], log)
        run_logged(["cmake", "--build", str(build), "--target", *targets, "-j",
                    str(jobs or os.cpu_count() or 2)], log)
        collect(build)


def _cpu_key() -> str:
    """What a native (``-march=native``) build depends on: the machine and its CPU's flags."""
    import platform

    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith(("flags", "Features")):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    except OSError:
        pass
    return f"{platform.machine()} {flags}"


def _server_root(backend_flags: Sequence[str] = ()) -> Path:
    """The cache directory of this llama-cpp-python version's llama-server build on this CPU
    (with ``backend_flags``: a GPU backend's build, a directory of its own)."""
    ver = llama_cpp_python_version()
    flags = " ".join((*SERVER_FLAGS, *backend_flags))
    key = hashlib.sha256((flags + "\n" + _cpu_key()).encode()).hexdigest()[:8]
    return cache_root() / "llama-server" / f"{ver}-{key}"


def llama_server_found(backend_flags: Sequence[str] = ()) -> Path | None:
    """The ``llama-server`` that is there without a build: on PATH (only without
    ``backend_flags``: which backend a PATH binary has is unknown), else the cached build; None
    when neither is."""
    found = None if backend_flags else shutil.which(SERVER_BINARY)
    if found:
        return Path(found)
    root = _server_root(backend_flags)
    binary = root / "bin" / SERVER_BINARY
    return binary if (root / "DONE").exists() and binary.exists() else None


def llama_server(*, sdist: Path | None = None, jobs: int | None = None,
                 log: Callable[[str], None] | None = None,
                 backend_flags: Sequence[str] = ()) -> Path:
    """The ``llama-server`` to run: on PATH, else built (once, cached; see the module's text).
    ``backend_flags``: CMake flags of a GPU backend (``-DGGML_CUDA=ON``, ``-DGGML_VULKAN=ON``):
    that backend's build, never PATH's (benchmarks/gpu_check.py puts it first on the bench's
    PATH). ``log`` receives a line before a build starts. Raises BuildError."""
    found = llama_server_found(backend_flags)
    if found is not None:
        return found
    ver = llama_cpp_python_version()
    root = _server_root(backend_flags)
    binary, done = root / "bin" / SERVER_BINARY, root / "DONE"
    from ..registry.cache import locked

    try:
        lock = locked(root)
    except OSError as e:
        raise BuildError(f"cannot create {root}: {e.strerror or e} (set CACTUS_GGUF_CACHE to a "
                         "writable directory)") from None
    with lock:  # two benchmarks starting at once build it once
        if done.exists() and binary.exists():
            return binary
        if log is not None:
            log(f"no {SERVER_BINARY} on PATH: building it from llama-cpp-python {ver}'s llama.cpp "
                f"into {root} (once; about 10 minutes on 2 cores)")
        build_log = root / "build.log"
        build_log.write_text("")
        t0 = time.monotonic()

        def collect(build: Path) -> None:
            binary.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(build / "bin" / SERVER_BINARY, binary)

        cmake_build_vendored((*SERVER_FLAGS, *backend_flags), [SERVER_BINARY], build_log,
                             sdist=sdist, jobs=jobs, collect=collect)
        done.write_text(f"{ver} {time.monotonic() - t0:.0f}\n")
    return binary


if __name__ == "__main__":  # python -m cactus_gguf.bench.build [SDIST]: build (or find) it
    print(llama_server(sdist=Path(sys.argv[1]) if len(sys.argv) > 1 else None, log=print))
