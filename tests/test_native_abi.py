"""The boundary between Python and the native helper: enum values (statuses included) come from
the library (and its header), struct mirrors are checked against the library's layout field by
field (offset and size of each), C structs are filled by name.

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
from cactus_gguf.sampling import AcceptanceParams, SamplingParams, _clib, errors, native

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


def header_statuses() -> dict[str, int]:
    """``CG_OK = 0`` and the ``CG_ERR_NAME = value`` entries of the header, as {"name": value}."""
    text = HEADER.read_text()
    found = {m.group(1).lower(): int(m.group(2))
             for m in re.finditer(r"\bCG_ERR_([A-Z_]+) = (\d+)", text)}
    return {"ok": int(re.search(r"\bCG_OK = (\d+)", text).group(1)), **found}


def test_status_codes_are_the_headers_and_each_has_its_exception():
    assert errors.STATUS_VALUES == header_statuses()
    assert errors.CG_OK == 0
    name_of = _clib._lib.cg_status_name
    name_of.restype, name_of.argtypes = ctypes.c_char_p, [ctypes.c_int32]
    assert name_of(-1) is None and name_of(len(errors.STATUS_VALUES)) is None
    expected = {"bad_argument": native.NativeArgumentError,
                "nonfinite_logits": native.NonFiniteLogitsError,
                "bad_distribution": native.BadDistributionError,
                "empty_mask": native.EmptyMaskError}
    for name, cls in expected.items():
        with pytest.raises(cls, match=r"^cg_x: "):
            errors.raise_status(header_statuses()[name], "cg_x")
    with pytest.raises(native.NativeError, match="unknown status 99"):
        errors.raise_status(99, "cg_x")


def test_a_status_without_an_exception_is_an_import_error(monkeypatch):
    monkeypatch.setattr(errors, "_ERRORS", {k: v for k, v in errors._ERRORS.items()
                                            if k != "empty_mask"})
    with pytest.raises(ImportError, match=r"has status empty_mask, which this package has no "
                                          r"exception for; .*pip install \."):
        errors._status_values()


def header_fields() -> dict[str, list[str]]:
    """The fields of each public struct of the header, in declaration order."""
    text = HEADER.read_text()
    out = {}
    for body, name in re.findall(r"typedef struct \{(.*?)\} (cg_\w+);", text, re.S):
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        # a field is a declaration's last name (``s[4]``), or a function pointer's (``(*name)(...)``)
        out[name] = [(re.search(r"\(\*(\w+)\)", d)
                      or re.search(r"(\w+)(?:\[\d+\])?$", d)).group(1)
                     for d in map(str.strip, body.split(";")) if d]
    return out


def test_struct_mirrors_match_the_library_field_by_field():
    lib = _clib._library_layout()
    assert lib == _clib._mirror_layout(_clib._ABI_STRUCTS)
    # the library's table lists every field of the header, in its order, each after its struct
    rows = list(lib)
    expected = [row for struct, fields in header_fields().items()
                for row in [struct, *(f"{struct}.{f}" for f in fields)]]
    assert rows == expected
    assert lib["cg_accept_params.end_mask"][1] == ctypes.sizeof(ctypes.c_void_p)
    abi_field = _clib._lib.cg_abi_field
    assert abi_field(-1, None, None) is None and abi_field(len(rows), None, None) is None
    assert abi_field(0, None, None) == b"cg_sampler_params"  # NULL outs: the name alone


def mirrors_with(c_name: str, mirror) -> tuple:
    return tuple((name, mirror if name == c_name else m) for name, m in _clib._ABI_STRUCTS)


def test_a_struct_size_mismatch_is_a_one_line_import_error(monkeypatch):
    class ShortLaw(ctypes.Structure):
        _fields_ = [("kl", ctypes.c_double), ("acceptance", ctypes.c_double)]

    monkeypatch.setattr(_clib, "_ABI_STRUCTS", mirrors_with("cg_law", ShortLaw))
    with pytest.raises(ImportError) as err:
        _clib._check_abi()
    msg = str(err.value)
    assert "\n" not in msg and "cg_law is 24 bytes in C and 16 in Python" in msg
    assert "cg_law.delta is in C, not in the Python mirror" in msg
    assert "pip install ." in msg


@pytest.mark.parametrize("c_name,mirror,swapped", [
    ("cg_sampler_params", _clib._SamplerParamsC, ("top_p", "min_p")),         # two floats
    ("cg_accept_params", _clib._AcceptParamsC, ("delta", "typical_epsilon")),  # two doubles
    ("cg_step_result", _clib._StepResultC, ("n_accepted", "next_token")),      # two int32
])
def test_a_mirror_with_two_fields_of_one_size_swapped_is_refused(monkeypatch, c_name, mirror,
                                                                  swapped):
    fields = list(mirror._fields_)
    i, j = (next(n for n, f in enumerate(fields) if f[0] == name) for name in swapped)
    fields[i], fields[j] = fields[j], fields[i]
    reordered = type("Reordered", (ctypes.Structure,), {"_fields_": fields})
    assert ctypes.sizeof(reordered) == ctypes.sizeof(mirror)  # a size check alone would pass
    monkeypatch.setattr(_clib, "_ABI_STRUCTS", mirrors_with(c_name, reordered))
    with pytest.raises(ImportError) as err:
        _clib._check_abi()
    msg = str(err.value)
    lib = _clib._library_layout()
    a, b = (f"{c_name}.{name}" for name in swapped)
    assert "\n" not in msg and msg.count(" in C and at byte ") == 2
    assert (f"{a} is at byte {lib[a][0]} ({lib[a][1]} bytes) in C and at byte {lib[b][0]} "
            f"({lib[b][1]} bytes) in Python") in msg
    assert "pip install ." in msg


def test_a_renamed_field_is_refused(monkeypatch):
    class Renamed(ctypes.Structure):
        _fields_ = [("kl", ctypes.c_double), ("accept", ctypes.c_double),
                    ("delta", ctypes.c_double)]

    monkeypatch.setattr(_clib, "_ABI_STRUCTS", mirrors_with("cg_law", Renamed))
    with pytest.raises(ImportError, match=r"cg_law.acceptance is in C, not in the Python mirror; "
                                          r"cg_law.accept is in the Python mirror, not in C"):
        _clib._check_abi()


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
