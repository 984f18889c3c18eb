"""Build the native sampling helper (native/*.c) into cactus_gguf/sampling/.

The helper is plain C with no Python API: setuptools compiles it as an extension-named shared
library so that it lands next to the package with the right platform suffix, and
``cactus_gguf/native.py`` loads it with ctypes.
"""
import shutil
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithRegistry(build_py):
    """Also copy the canonical top-level models.yaml into the built package as
    cactus_gguf/models.yaml, so an installed (non-editable) wheel carries the model registry."""

    def run(self) -> None:
        super().run()
        source = ROOT / "models.yaml"
        if not source.is_file():
            raise FileNotFoundError(f"{source} is missing: the wheel needs the model registry")
        target = Path(self.build_lib) / "cactus_gguf" / "models.yaml"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)


setup(
    cmdclass={"build_py": BuildPyWithRegistry},
    ext_modules=[
        Extension(
            "cactus_gguf.sampling._cactus_native",
            sources=["native/cactus_native.c"],
            include_dirs=["native"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-fvisibility=default"],
            libraries=["m"],
        )
    ],
)
