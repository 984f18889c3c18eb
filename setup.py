"""Build the native sampling helper (native/*.c) into cactus_gguf/sampling/.

The helper is plain C with no Python API, loaded with ctypes by cactus_gguf/sampling/_clib.py. It
is built as a plain shared library, not as a Python extension module: ``_cactus_native.so`` on
Linux and the BSDs, ``_cactus_native.dylib`` on macOS, ``_cactus_native.dll`` on Windows, so no
``PyInit_`` export is needed (MSVC's linker demands one for an extension). setuptools still drives
it as an ``Extension``, so ``pip install .``, ``pip install -e .`` and
``python setup.py build_ext --inplace`` put it where _clib.py looks, and the wheel is tagged for
the platform. Flags are chosen per compiler (MSVC, or GCC / Clang / MinGW); see NATIVE_FLAGS.
"""
import os
import shutil
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE = "native"
# every translation unit of the helper (the public header is native/cactus_native.h)
NATIVE_SOURCES = sorted(str(p.relative_to(ROOT).as_posix()) for p in (ROOT / NATIVE).glob("*.c"))
NATIVE_HEADERS = sorted(str(p.relative_to(ROOT).as_posix()) for p in (ROOT / NATIVE).glob("*.h"))
LIBRARY = "cactus_gguf.sampling._cactus_native"

# Compiler flags by distutils compiler type. Floating-point contraction stays off everywhere: the
# decisions must match the NumPy reference operation for operation (no a*b-c fused into an FMA).
# GCC-like builds hide every symbol but the CG_API functions (cactus_native.h).
NATIVE_FLAGS = {
    "msvc": ["/O2", "/std:c11", "/W3", "/fp:precise"],
    "gcc": ["-O3", "-std=c11", "-Wall", "-Wextra", "-ffp-contract=off", "-fvisibility=hidden"],
}


def library_suffix(platform: str = sys.platform) -> str:
    """The file suffix of a shared library on ``platform`` (a ``sys.platform`` value)."""
    if platform.startswith(("win32", "cygwin", "msys")):
        return ".dll"
    if platform == "darwin":
        return ".dylib"
    return ".so"


class BuildNativeLibrary(build_ext):
    """build_ext that links the native helper as a plain shared library (no Python module init)."""

    def get_ext_filename(self, fullname: str) -> str:
        # asked with the dotted name and, by get_ext_fullpath, with its last component alone
        if fullname in (LIBRARY, LIBRARY.rpartition(".")[2]):
            return os.path.join(*fullname.split(".")) + library_suffix()
        return super().get_ext_filename(fullname)

    def build_extension(self, ext: Extension) -> None:
        if ext.name != LIBRARY:
            super().build_extension(ext)
            return
        target = self.get_ext_fullpath(ext.name)
        depends = list(ext.sources) + list(ext.depends)
        if not (self.force or _newer_any(depends, target)):
            return
        msvc = self.compiler.compiler_type == "msvc"
        objects = self.compiler.compile(
            ext.sources, output_dir=self.build_temp, include_dirs=ext.include_dirs,
            extra_postargs=NATIVE_FLAGS["msvc" if msvc else "gcc"], depends=ext.depends,
            debug=self.debug)
        # libm is its own library only on Unix-like systems; Windows C runtimes carry the maths
        libraries = [] if msvc or sys.platform.startswith("win32") else ["m"]
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        self.compiler.link_shared_object(
            objects, target, libraries=libraries, export_symbols=None, debug=self.debug,
            build_temp=self.build_temp, target_lang="c")


def _newer_any(sources: list, target: str) -> bool:
    if not os.path.exists(target):
        return True
    t = os.path.getmtime(target)
    return any(os.path.getmtime(s) > t for s in sources)


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
    cmdclass={"build_py": BuildPyWithRegistry, "build_ext": BuildNativeLibrary},
    ext_modules=[
        Extension(LIBRARY, sources=NATIVE_SOURCES, depends=NATIVE_HEADERS, include_dirs=[NATIVE])
    ],
)
