"""llama.cpp built with a GPU backend (Vulkan, CUDA) from the pinned llama-cpp-python's vendored
source, for the GPU tests (tests/test_vulkan.py) and benchmarks/gpu_check.sh.

These machines have no GPU, but Mesa's lavapipe (Debian's ``mesa-vulkan-drivers``; it names itself
``llvmpipe``) is a conforming Vulkan 1.3 device that runs on the CPU. With it, ``-ngl`` / ``-ngld``
take ggml's GPU code path for real: weights and KV cache in device buffers, logits copied back from
device memory, sequence removal on the device, host/device synchronisation around each decode.

``gpu_build("vulkan")`` installs the Debian packages it needs when missing (``DEBIAN_PACKAGES``),
then compiles the llama.cpp source of the llama-cpp-python sdist (downloaded with pip, or the one
given; the product's steps, cactus_gguf/bench/build.py) with ``-DGGML_VULKAN=ON``: the shared
libraries libllama, libggml*, libggml-vulkan. It runs once per backend, llama-cpp-python version
and flag set, cached in ``~/.cache/cactus-gguf/gpu-build/<backend>-<version>-<flags hash>/``
(``$CACTUS_GGUF_CACHE`` moves it). A process runs cactus-gguf on it with
``LLAMA_CPP_LIB_PATH=<build>/lib`` (llama-cpp-python
reads it when it loads libllama, once per process) and, for Vulkan, ``GGML_VK_VISIBLE_DEVICES=0``
(ggml-vulkan skips devices of type CPU unless they are named, and lavapipe is one) and
``CACTUS_GGUF_LAVAPIPE_WARMUP=1``: each context on lavapipe first makes the warm-up that keeps
the driver alive (cactus_gguf/llama/lavapipe.py), which cactus-gguf makes only when asked.

Debian 12's Vulkan headers (1.3.239) predate ``VK_EXT_layer_settings``, which ggml-vulkan uses
only to configure the validation layer of a ``GGML_VULKAN_VALIDATE`` build; the build puts that
block under ``#ifdef VK_EXT_layer_settings`` (a no-op with newer headers).

By hand: ``python tests/support/llama_build.py [vulkan|cuda] [SDIST]`` builds (or finds) it and
prints the environment to use.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cactus_gguf.bench.build import cache_root, cmake_build_vendored

__all__ = ["GpuBuild", "gpu_build", "BACKEND_FLAGS", "DEBIAN_PACKAGES"]

COMMON_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF",
                "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                "-DLLAMA_BUILD_TOOLS=OFF", "-DCMAKE_BUILD_RPATH=$ORIGIN",
                "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON", "-DCMAKE_INSTALL_RPATH=$ORIGIN"]
BACKEND_FLAGS = {"vulkan": ["-DGGML_VULKAN=ON"], "cuda": ["-DGGML_CUDA=ON"]}
# what the Vulkan build needs: the lavapipe driver, the loader and headers, the shader compiler,
# the SPIR-V headers (ggml-vulkan's CMake asks for their package)
DEBIAN_PACKAGES = {"vulkan": ["mesa-vulkan-drivers", "libvulkan-dev", "glslc", "spirv-headers"],
                   "cuda": []}
_BACKEND_LIB = {"vulkan": "libggml-vulkan.so", "cuda": "libggml-cuda.so"}


@dataclass(frozen=True)
class GpuBuild:
    backend: str          # "vulkan" or "cuda"
    lib: Path             # directory of libllama.so, libggml*.so (LLAMA_CPP_LIB_PATH)
    build_seconds: float  # wall time of the compile that made it

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process that runs cactus-gguf on this build."""
        libs = [str(self.lib), os.environ.get("LD_LIBRARY_PATH")]
        env = {**os.environ, "LLAMA_CPP_LIB_PATH": str(self.lib),
               "LD_LIBRARY_PATH": os.pathsep.join(filter(None, libs))}
        if self.backend == "vulkan":
            env.setdefault("GGML_VK_VISIBLE_DEVICES", "0")  # lavapipe is a device of type CPU
            # the warm-up without which lavapipe crashes (cactus_gguf/llama/lavapipe.py): only
            # when asked for, and only contexts whose layers are on lavapipe make it
            env.setdefault("CACTUS_GGUF_LAVAPIPE_WARMUP", "1")
        return {**env, **extra}


def missing_packages(backend: str) -> list[str]:
    """The Debian packages of ``DEBIAN_PACKAGES[backend]`` whose files this machine lacks."""
    if backend != "vulkan":
        return []
    present = {
        "mesa-vulkan-drivers": any(Path("/usr/share/vulkan/icd.d").glob("lvp_icd*.json")),
        "libvulkan-dev": Path("/usr/include/vulkan/vulkan.h").exists(),
        "glslc": shutil.which("glslc") is not None,
        "spirv-headers": Path("/usr/share/cmake/SPIRV-Headers").exists(),
    }
    return [p for p in DEBIAN_PACKAGES[backend] if not present[p]]


def ensure_packages(backend: str) -> None:
    """apt-get install the backend's Debian packages when some are missing (as root on Debian;
    elsewhere a RuntimeError names the command)."""
    missing = missing_packages(backend)
    if not missing:
        return
    packages = DEBIAN_PACKAGES[backend]
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError(f"the {backend} build needs Debian's {' '.join(missing)}: "
                           f"apt-get install {' '.join(packages)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", *packages]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(cmd, env=env, capture_output=True, check=True)


_LAYER_SETTINGS = """    std::vector<vk::LayerSettingEXT> settings = {"""
_CREATE_INFO = ("    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, "
                "&app_info, layers, extensions, &layer_setting_info);\n")


def _patch_old_vulkan_headers(src: Path) -> None:
    """Put ggml-vulkan's VK_EXT_layer_settings block (validation-layer settings) under
    ``#ifdef VK_EXT_layer_settings``, so headers older than the extension compile it."""
    path = src / "ggml" / "src" / "ggml-vulkan" / "ggml-vulkan.cpp"
    text = path.read_text()
    if _LAYER_SETTINGS not in text or _CREATE_INFO not in text:
        return  # another llama.cpp: nothing to patch (the compiler says if it needs more)
    text = text.replace("    VkBool32 enable_best_practice = layer_settings;\n" + _LAYER_SETTINGS,
                        "#ifdef VK_EXT_layer_settings\n    VkBool32 enable_best_practice = "
                        "layer_settings;\n" + _LAYER_SETTINGS, 1)
    text = text.replace(_CREATE_INFO, _CREATE_INFO + "#else\n    vk::InstanceCreateInfo "
                        "instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, "
                        "extensions);\n#endif\n", 1)
    path.write_text(text)


def gpu_build(backend: str = "vulkan", sdist: Path | None = None,
              jobs: int | None = None) -> GpuBuild:
    """Build (once) or find llama.cpp with ``backend`` for the installed llama-cpp-python.
    ``sdist``: the llama-cpp-python source archive to build (default: ``pip download`` it)."""
    from importlib.metadata import version

    ver = version("llama-cpp-python")
    flags = COMMON_FLAGS + BACKEND_FLAGS[backend]
    key = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:8]
    root = cache_root() / "gpu-build" / f"{backend}-{ver}-{key}"
    lib, done = root / "lib", root / "DONE"
    if done.exists() and (lib / _BACKEND_LIB[backend]).exists():
        return GpuBuild(backend, lib, float(done.read_text().split()[1]))
    ensure_packages(backend)
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    log.write_text("")
    t0 = time.monotonic()

    def collect(build: Path) -> None:
        shutil.rmtree(lib, ignore_errors=True)
        lib.mkdir(parents=True)
        for so in (build / "bin").glob("*.so*"):
            shutil.copy2(so, lib / so.name, follow_symlinks=True)

    cmake_build_vendored(flags, ["llama"], log, sdist=sdist, jobs=jobs, collect=collect,
                         patch=_patch_old_vulkan_headers if backend == "vulkan" else None)
    seconds = time.monotonic() - t0
    done.write_text(f"{ver} {seconds:.0f}\n")
    return GpuBuild(backend, lib, seconds)


if __name__ == "__main__":
    b = gpu_build(sys.argv[1] if len(sys.argv) > 1 else "vulkan",
                  Path(sys.argv[2]) if len(sys.argv) > 2 else None)
    extra = (" GGML_VK_VISIBLE_DEVICES=0 CACTUS_GGUF_LAVAPIPE_WARMUP=1" if b.backend == "vulkan"
             else "")
    print(f"LLAMA_CPP_LIB_PATH={b.lib}{extra}  (built in {b.build_seconds:.0f} s)")
