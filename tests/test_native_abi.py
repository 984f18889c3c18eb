"""The boundary between Python and the native helper: enum values come from the library (and its
header), struct mirrors are checked against the library's sizes, C structs are filled by name.

A stale or foreign build must fail at import with one line saying how to rebuild, never run with
Python and C disagreeing on what a number or a byte means.
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
from pathlib import Path

import pytest

from cactus_gguf import options
from cactus_gguf.sampling import AcceptanceParams, SamplingParams, _clib, native

HEADER = Path(__file__).resolve().parents[1] / "native" / "cactus_native.h"


def header_enum(prefix: str) -> dict[str, int]:
    """``CG_<PREFIX>_NAME = value`` entries of the public header, as {"name": value}."""
    text = HEADER.read_text()
    return {m.group(1).lower(): int(m.group(2))
            for m in re.finditer(rf"\bCG_{prefix}_([A-Z]+) = (\d+)", text)}


@pytest.mark.parametrize("prefix,values,wanted", [
    ("METHOD", _clib.METHOD_VALUES, options.METHODS),
    ("SOLVER", _clib.SOLVER_VALUES, options.SOLVERS),
    ("BUDGET", _clib.BUDGET_VALUES, options.BUDGETS),
])
def test_enum_values_are_the_headers_not_a_tuple_order(prefix, values, wanted):
    assert values == header_enum(prefix)
    assert set(wanted) <= set(values)  # every option value has its C value
    name_of = getattr(_clib._lib, f"cg_{prefix.lower()}_name")
    name_of.restype, name_of.argtypes = ctypes.c_char_p, [ctypes.c_int32]
    assert name_of(-1) is None and name_of(len(values)) is None


def test_struct_mirrors_match_the_library():
    sizes = (ctypes.c_int64 * 8)()
    n = _clib._lib.cg_abi_sizes(ctypes.addressof(sizes), 8)
    assert n == len(_clib._ABI_STRUCTS) == 5
    assert list(sizes[:n]) == [ctypes.sizeof(m) for _, m in _clib._ABI_STRUCTS]
    assert list(sizes[n:]) == [0, 0, 0]  # nothing written past what it reports
    assert _clib._lib.cg_abi_sizes(None, 5) == 5


def test_a_struct_size_mismatch_is_a_one_line_import_error(monkeypatch):
    class ShortLaw(ctypes.Structure):
        _fields_ = [("kl", ctypes.c_double), ("acceptance", ctypes.c_double)]

    broken = tuple((name, ShortLaw if name == "cg_law" else m) for name, m in _clib._ABI_STRUCTS)
    monkeypatch.setattr(_clib, "_ABI_STRUCTS", broken)
    with pytest.raises(ImportError) as err:
        _clib._check_abi()
    msg = str(err.value)
    assert "\n" not in msg and "cg_law is 24 bytes in C and 16 in Python" in msg
    assert "pip install ." in msg


def test_an_older_library_is_an_import_error_naming_the_fix():
    with pytest.raises(ImportError, match=r"has no cg_not_there .*pip install \."):
        _clib._bind("cg_not_there", None, [])
    with pytest.raises(ImportError, match=r"has no method 'eagle' \(it has sps, cactus"):
        _clib._enum_values("cg_method_name", ("sps", "eagle"))


def test_library_file_names_per_platform():
    assert _clib._library_names("win32")[0] == "_cactus_native.dll"
    assert _clib._library_names("darwin")[0] == "_cactus_native.dylib"
    names = _clib._library_names("linux")
    assert names[0] == "_cactus_native.so" and len(names) == len(set(names))


@pytest.mark.parametrize("method", options.METHODS)
def test_c_params_fills_by_field_name(method):
    acc = AcceptanceParams(method=method, delta=0.25, solver="exact", budget="output",
                           output_kl=True, typical_epsilon=0.125, typical_alpha=0.5,
                           accept_top_k=7)
    c = native.c_params(_clib._AcceptParamsC, acc)
    assert (c.method, c.solver, c.budget) == (_clib.METHOD_VALUES[method],
                                              _clib.SOLVER_VALUES["exact"],
                                              _clib.BUDGET_VALUES["output"])
    assert (c.delta, c.typical_epsilon, c.typical_alpha, c.accept_top_k, c.output_kl) == (
        0.25, 0.125, 0.5, 7, 1)
    sp = native.c_params(_clib._SamplerParamsC, SamplingParams(0.5, 3, 0.75, 0.125))
    assert (sp.temperature, sp.top_k, sp.top_p, sp.min_p) == (0.5, 3, 0.75, 0.125)


def test_c_params_refuses_a_record_whose_fields_differ():
    @dataclasses.dataclass(frozen=True)
    class Extra:
        temperature: float = 1.0
        top_k: int = 0
        top_p: float = 1.0
        min_p: float = 0.0
        typical_p: float = 1.0  # a field C does not have

    with pytest.raises(TypeError, match="typical_p"):
        native.c_params(_clib._SamplerParamsC, Extra())


def test_the_sampler_builds_its_structs_once():
    s = native.NativeSampler(8, SamplingParams(), AcceptanceParams(method="topk"), 0)
    assert s._ap.method == _clib.METHOD_VALUES["topk"]
    assert s._ap_p == ctypes.addressof(s._ap) and s._sp_p == ctypes.addressof(s._sp)
