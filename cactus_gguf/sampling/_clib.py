"""The native helper's shared library and its C ABI as ctypes (mirrors of native/cactus_native.h):
the parameter and result structs and every bound entry point. ``native.py`` is the facade over it.
"""
from __future__ import annotations

import ctypes
import importlib.machinery
from pathlib import Path


def _load_library() -> ctypes.CDLL:
    here = Path(__file__).resolve().parent
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"_cactus_native{suffix}"
        if path.exists():
            return ctypes.CDLL(str(path))
    raise ImportError(
        f"native helper _cactus_native*.so not found in {here}; fix: reinstall with `pip install .`"
    )


class _SamplerParamsC(ctypes.Structure):
    _fields_ = [
        ("temperature", ctypes.c_float),
        ("top_k", ctypes.c_int32),
        ("top_p", ctypes.c_float),
        ("min_p", ctypes.c_float),
    ]


class _AcceptParamsC(ctypes.Structure):
    _fields_ = [
        ("method", ctypes.c_int32),
        ("solver", ctypes.c_int32),
        ("delta", ctypes.c_double),
        ("typical_epsilon", ctypes.c_double),
        ("typical_alpha", ctypes.c_double),
        ("accept_top_k", ctypes.c_int32),
        ("budget", ctypes.c_int32),
        ("output_kl", ctypes.c_int32),
    ]


class _RngC(ctypes.Structure):
    _fields_ = [("s", ctypes.c_uint64 * 4)]


class _StepResultC(ctypes.Structure):
    _fields_ = [
        ("n_accepted", ctypes.c_int32),
        ("next_token", ctypes.c_int32),
        ("n_evaluated", ctypes.c_int32),
        ("kl_sum", ctypes.c_double),
        ("kl_max", ctypes.c_double),
        ("output_kl_sum", ctypes.c_double),
        ("output_kl_max", ctypes.c_double),
        ("delta_sum", ctypes.c_double),
    ]


class _LawC(ctypes.Structure):
    _fields_ = [
        ("kl", ctypes.c_double),
        ("acceptance", ctypes.c_double),
        ("delta", ctypes.c_double),
    ]


_lib = _load_library()
_P = ctypes.c_void_p  # every pointer crosses as a plain integer address
_i32 = ctypes.c_int32


def _bind(name: str, restype, argtypes):
    fn = getattr(_lib, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


_rng_seed = _bind("cg_rng_seed", None, [_P, ctypes.c_uint64])
_rng_uniform = _bind("cg_rng_uniform", ctypes.c_double, [_P])
_workspace_size = _bind("cg_workspace_size", ctypes.c_int64, [_i32])
_warp = _bind("cg_warp", ctypes.c_int, [_P, _i32, _i32, _P, _P, _P, _P])
_sample_probs = _bind("cg_sample_probs", ctypes.c_int, [_P, _i32, _P, _P, _P])
_warp_sample = _bind("cg_warp_sample", ctypes.c_int, [_P, _i32, _i32, _P, _P, _P, _P, _P, _P])
_cactus_gamma = _bind("cg_cactus_gamma", ctypes.c_double, [ctypes.c_double, ctypes.c_double, _i32])
_verify = _bind("cg_verify", ctypes.c_int, [_P, _P, _P, _P, _i32, _i32, _P, _P, _P, _P, _P])
_emitted_law = _bind("cg_emitted_law", ctypes.c_int, [_P, _i32, _P, _i32, _P, _P, _P, _P])
