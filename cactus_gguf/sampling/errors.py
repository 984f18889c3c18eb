"""The native helper's errors: one exception per cg_status (native/cactus_native.h), each an
EngineError (a bad argument is also an InputError)."""
from __future__ import annotations

from ..errors import EngineError, InputError

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


CG_OK = 0
_ERRORS = {
    1: (NativeArgumentError, "invalid argument (a token id outside [0, V) or a parameter out of range)"),
    2: (NonFiniteLogitsError, "non-finite logits (NaN or +inf, or every logit -inf)"),
    3: (BadDistributionError, "bad probability row (negative, NaN or inf entry, or zero sum)"),
    4: (EmptyMaskError, "empty mask (no allowed token has a finite logit)"),
}


def raise_status(status: int, where: str) -> None:
    """Raise the exception of a non-OK cg_status returned by ``where``."""
    cls, what = _ERRORS.get(status, (NativeError, f"unknown status {status}"))
    raise cls(f"{where}: {what}")
