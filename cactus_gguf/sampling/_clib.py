"""The native helper's shared library and its C ABI as ctypes (mirrors of native/cactus_native.h):
the parameter and result structs, every bound entry point, and the enum values by name.

At import the library is checked against this module: every public struct and each of its fields
must have the size and offset in its mirror that the library was compiled with (``cg_abi_field``,
compared with the ctypes ``Structure`` fields, so two fields of one size swapped are caught), and
every acceptance method, solver and budget the options offer must have a value in the library
(``cg_method_name`` and friends). Either mismatch means a stale build and raises ImportError
saying how to rebuild. Status codes are looked up by name the same way (errors.py).
"""
from __future__ import annotations

import ctypes
import importlib.machinery
import sys
from pathlib import Path

from ..options import BUDGETS, METHODS, SOLVERS

_REBUILD = ("fix: reinstall with `pip install .` (in a checkout: `python setup.py build_ext --inplace`)")


def _library_names(platform: str = sys.platform) -> list[str]:
    """File names the helper may have, best first: the plain shared library setup.py builds
    (.dll / .dylib / .so), then extension-module names an older setup.py produced."""
    if platform.startswith(("win32", "cygwin", "msys")):
        plain = ".dll"
    elif platform == "darwin":
        plain = ".dylib"
    else:
        plain = ".so"
    names = [f"_cactus_native{plain}"]
    names += [f"_cactus_native{s}" for s in importlib.machinery.EXTENSION_SUFFIXES
              if f"_cactus_native{s}" not in names]
    return names


def _load_library() -> ctypes.CDLL:
    here = Path(__file__).resolve().parent
    for name in _library_names():
        path = here / name
        if path.exists():
            return ctypes.CDLL(str(path))
    raise ImportError(f"native helper {_library_names()[0]} not found in {here}; {_REBUILD}")


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
        ("ears_alpha", ctypes.c_double),
        ("top_gap", ctypes.c_double),
        ("end_tau", ctypes.c_double),
        ("end_mask", ctypes.c_void_p),  # uint32 [ceil(V / 32)] or NULL
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


class _RowReaderC(ctypes.Structure):
    # llama.cpp's context and the addresses of its four backend-sampling accessors
    _fields_ = [
        ("ctx", ctypes.c_void_p),
        ("candidates", ctypes.c_void_p),
        ("candidates_count", ctypes.c_void_p),
        ("logits", ctypes.c_void_p),
        ("logits_count", ctypes.c_void_p),
    ]


# every struct the library passes, with its C name (cg_abi_field's rows)
_ABI_STRUCTS = (("cg_sampler_params", _SamplerParamsC), ("cg_accept_params", _AcceptParamsC),
                ("cg_rng", _RngC), ("cg_step_result", _StepResultC), ("cg_law", _LawC),
                ("cg_row_reader", _RowReaderC))

_lib = _load_library()
_P = ctypes.c_void_p  # every pointer crosses as a plain integer address
_i32 = ctypes.c_int32


def _bind(name: str, restype, argtypes):
    try:
        fn = getattr(_lib, name)
    except AttributeError:
        raise ImportError(f"native helper {_lib._name} has no {name} (an older build); "
                          f"{_REBUILD}") from None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def _library_layout() -> dict[str, tuple[int, int]]:
    """{"cg_law": (0, sizeof), "cg_law.kl": (offsetof, sizeof), ...}: the library's own account
    of its structs (cg_abi_field(0), (1), ... until NULL)."""
    abi_field = _bind("cg_abi_field", ctypes.c_char_p, [_i32, _P, _P])
    offset, size = ctypes.c_int64(), ctypes.c_int64()
    layout = {}
    while (name := abi_field(len(layout), ctypes.addressof(offset),
                             ctypes.addressof(size))) is not None:
        layout[name.decode("ascii")] = (offset.value, size.value)
    return layout


def _mirror_layout(structs) -> dict[str, tuple[int, int]]:
    """The same rows for ctypes mirrors ``((C name, Structure), ...)``: each field's offset and
    size as ctypes lays it out."""
    layout = {}
    for c_name, mirror in structs:
        layout[c_name] = (0, ctypes.sizeof(mirror))
        for field, *_ in mirror._fields_:
            desc = getattr(mirror, field)
            layout[f"{c_name}.{field}"] = (desc.offset, desc.size)
    return layout


def _check_abi() -> None:
    """Every struct mirror has the size, and every field the offset and size, the library was
    compiled with; the same fields on both sides. Raises one ImportError naming every mismatch."""
    lib, mirror = _library_layout(), _mirror_layout(_ABI_STRUCTS)
    wrong = []
    for name in dict.fromkeys([*lib, *mirror]):
        if name not in mirror:
            wrong.append(f"{name} is in C, not in the Python mirror")
        elif name not in lib:
            wrong.append(f"{name} is in the Python mirror, not in C")
        elif "." not in name and lib[name] != mirror[name]:
            wrong.append(f"{name} is {lib[name][1]} bytes in C and {mirror[name][1]} in Python")
        elif lib[name] != mirror[name]:
            wrong.append(f"{name} is at byte {lib[name][0]} ({lib[name][1]} bytes) in C and at "
                         f"byte {mirror[name][0]} ({mirror[name][1]} bytes) in Python")
    if wrong:
        raise ImportError(f"native helper {_lib._name} and its Python mirror disagree: "
                          f"{'; '.join(wrong)}; {_REBUILD}")


def _enum_values(c_name: str, wanted: tuple[str, ...]) -> dict[str, int]:
    """name -> value of one C enum, from the library's own name table (cg_*_name(0), (1), ...
    until NULL); every name in ``wanted`` (the options' choices) must be there."""
    name_of = _bind(c_name, ctypes.c_char_p, [_i32])
    values = {}
    while (name := name_of(len(values))) is not None:
        values[name.decode("ascii")] = len(values)
    missing = [w for w in wanted if w not in values]
    if missing:
        raise ImportError(f"native helper {_lib._name} has no {c_name.split('_')[1]} "
                          f"{', '.join(map(repr, missing))} (it has {', '.join(values)}); {_REBUILD}")
    return values


_check_abi()
METHOD_VALUES = _enum_values("cg_method_name", METHODS)  # "sps" -> CG_METHOD_SPS, ...
SOLVER_VALUES = _enum_values("cg_solver_name", SOLVERS)
BUDGET_VALUES = _enum_values("cg_budget_name", BUDGETS)

_rng_seed = _bind("cg_rng_seed", None, [_P, ctypes.c_uint64])
_rng_uniform = _bind("cg_rng_uniform", ctypes.c_double, [_P])
_workspace_size = _bind("cg_workspace_size", ctypes.c_int64, [_i32])
_warp = _bind("cg_warp", ctypes.c_int, [_P, _i32, _i32, _P, _P, _P, _P])
_sample_probs = _bind("cg_sample_probs", ctypes.c_int, [_P, _i32, _P, _P, _P])
_warp_sample = _bind("cg_warp_sample", ctypes.c_int, [_P, _i32, _i32, _P, _P, _P, _P, _P, _P])
_cactus_gamma = _bind("cg_cactus_gamma", ctypes.c_double, [ctypes.c_double, ctypes.c_double, _i32])
_verify = _bind("cg_verify", ctypes.c_int, [_P, _P, _P, _P, _i32, _i32, _P, _P, _P, _P, _P])
_emitted_law = _bind("cg_emitted_law", ctypes.c_int, [_P, _i32, _P, _i32, _P, _P, _P, _P])
_read_rows = _bind("cg_read_rows", ctypes.c_int, [_P, _i32, _i32, _i32, _P, _P, _P])
_compact_union = _bind("cg_compact_union", ctypes.c_int,
                       [_P, _P, _i32, _i32, _P, _P, _i32, _i32, _P, _i32, _P, _i32, _i32, _P, _P,
                        _P, _P, _P, _P, _P])
