"""Build the native sampling helper (native/*.c) into cactus_gguf/.

The helper is plain C with no Python API: setuptools compiles it as an extension-named shared
library so that it lands next to the package with the right platform suffix, and
``cactus_gguf/native.py`` loads it with ctypes.
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "cactus_gguf._cactus_native",
            sources=["native/cactus_native.c"],
            include_dirs=["native"],
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-fvisibility=default"],
            libraries=["m"],
        )
    ],
)
