"""llama.cpp with its RPC backend, built for the RPC tests (tests/test_rpc.py) and the RPC benchmark.

``rpc_build()`` compiles the llama.cpp source vendored in the pinned llama-cpp-python release (its
sdist, fetched from the package index) with ``-DGGML_RPC=ON``: the shared libraries (libllama, libggml*)
and llama.cpp's ``ggml-rpc-server`` (tools/rpc). It runs once per llama-cpp-python version and
caches the result in ``~/.cache/cactus-gguf/rpc-build/<version>/`` (``$CACTUS_GGUF_CACHE`` moves
it); about 5 minutes on 2 cores. A process runs cactus-gguf on that build with
``LLAMA_CPP_LIB_PATH=<build>/lib`` (read by llama-cpp-python when it loads libllama), so the tests
need no second pip install.

By hand: ``python tests/support/rpc.py`` builds (or finds) it and prints the two paths.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from cactus_gguf.bench.build import cache_root, cmake_build_vendored

__all__ = ["RpcBuild", "rpc_build", "RpcServer", "free_port"]


@dataclass(frozen=True)
class RpcBuild:
    lib: Path          # directory of libllama.so, libggml*.so (LLAMA_CPP_LIB_PATH)
    rpc_server: Path   # llama.cpp's ggml-rpc-server binary

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process that runs cactus-gguf or the rpc-server on this build."""
        return {**os.environ, "LLAMA_CPP_LIB_PATH": str(self.lib),
                "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(self.lib),
                                                                  os.environ.get("LD_LIBRARY_PATH")])),
                **extra}


def rpc_build() -> RpcBuild:
    """Build (once) or find llama.cpp with RPC for the installed llama-cpp-python version."""
    from importlib.metadata import version

    ver = version("llama-cpp-python")
    root = cache_root() / "rpc-build" / ver
    built = RpcBuild(lib=root / "lib", rpc_server=root / "bin" / "ggml-rpc-server")
    if (root / "DONE").exists() and built.rpc_server.exists():
        return built
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    log.write_text("")

    def collect(build: Path) -> None:
        shutil.rmtree(built.lib, ignore_errors=True)
        built.lib.mkdir(parents=True)
        built.rpc_server.parent.mkdir(parents=True, exist_ok=True)
        for so in (build / "bin").glob("*.so*"):
            shutil.copy2(so, built.lib / so.name, follow_symlinks=True)
        shutil.copy2(build / "bin" / "ggml-rpc-server", built.rpc_server)

    cmake_build_vendored(["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DGGML_RPC=ON",
                          "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                          "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                          "-DLLAMA_BUILD_TOOLS=ON", "-DCMAKE_BUILD_RPATH=$ORIGIN",
                          "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN"],
                         ["llama", "ggml-rpc-server"], log, collect=collect)
    (root / "DONE").write_text(ver + "\n")
    return built


def free_port() -> int:
    """A TCP port nothing listens on at 127.0.0.1 (just now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcServer:
    """llama.cpp's ``ggml-rpc-server`` on 127.0.0.1 at a free port; a context manager. ``endpoint`` is the
    ``HOST:PORT`` to give ``--rpc``; ``kill()`` ends it abruptly (SIGKILL), as a crash would."""

    def __init__(self, build: RpcBuild, *, threads: int = 1) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(build.rpc_server), "-H", "127.0.0.1", "-p", str(self.port),
                                      "-t", str(threads)], env=build.env(),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rpc-server exited ({self.proc.returncode}) at start")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        self.kill()
        raise RuntimeError("rpc-server did not listen within 30 s")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "RpcServer":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


if __name__ == "__main__":
    b = rpc_build()
    print(f"LLAMA_CPP_LIB_PATH={b.lib}")
    print(f"rpc-server: {b.rpc_server}")
