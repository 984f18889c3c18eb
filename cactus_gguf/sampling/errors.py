"""The native helper's errors: one exception per cg_status (native/cactus_native.h), each an
EngineError (a bad argument is also an InputError).

The codes' values are the library's: each status is looked up by its name (``cg_status_name``,
as _clib.py looks up the other enums), and at import the library must have exactly the statuses
this module maps, else ImportError (a stale build)."""
from __future__ import annotations

from ..errors import EngineError, InputError
from ._clib import _REBUILD, _enum_values, _lib

__all__ = ["NativeError", "NativeArgumentError", "NonFiniteLogitsError", "BadDistributionError",
           "EmptyMaskError", "raise_status", "CG_OK"]


class NativeError(EngineError):
    """A call into the native helper failed."""


class NativeArgumentError(NativeError, InputError):
    """CG_ERR_BAD_ARGUMENT: a token id outside [0, V), or a parameter outside its range."""


class NonFiniteLogitsError(NativeError):
    """CG_ERR_NONFINITE_LOGITS: a logits row holds NaN or +inf, or is -inf everywhere."""


class BadDistributionError(NativeError):
    """CG_ERR_BAD_DISTRIBUTION: a probability row holds a negative, NaN or inf entry, or sums to 0."""


class EmptyMaskError(NativeError):
    """CG_ERR_EMPTY_MASK: an allowed-token mask leaves no token with a finite logit in a row."""


# cg_status name (CG_ERR_* in lower case) -> its exception and what it means
_ERRORS = {
    "bad_argument": (NativeArgumentError,
                     "invalid argument (a token id outside [0, V) or a parameter out of range)"),
    "nonfinite_logits": (NonFiniteLogitsError,
                         "non-finite logits (NaN or +inf, or every logit -inf)"),
    "bad_distribution": (BadDistributionError,
                         "bad probability row (negative, NaN or inf entry, or zero sum)"),
    "empty_mask": (EmptyMaskError, "empty mask (no allowed token has a finite logit)"),
}


def _status_values() -> dict[str, int]:
    """name -> value of every cg_status, from the library (cg_status_name): "ok" and exactly the
    names ``_ERRORS`` maps, else ImportError."""
    values = _enum_values("cg_status_name", ("ok", *_ERRORS))
    unmapped = [name for name in values if name != "ok" and name not in _ERRORS]
    if unmapped:
        raise ImportError(f"native helper {_lib._name} has status {', '.join(unmapped)}, which "
                          f"this package has no exception for; {_REBUILD}")
    return values


STATUS_VALUES = _status_values()  # "ok" -> CG_OK, "bad_argument" -> CG_ERR_BAD_ARGUMENT, ...
CG_OK = STATUS_VALUES["ok"]
_BY_VALUE = {STATUS_VALUES[name]: error for name, error in _ERRORS.items()}


def raise_status(status: int, where: str) -> None:
    """Raise the exception of a non-OK cg_status returned by ``where``."""
    cls, what = _BY_VALUE.get(status, (NativeError, f"unknown status {status}"))
    raise cls(f"{where}: {what}")
