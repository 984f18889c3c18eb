"""The C generator (native/rng.c: xoshiro256** seeded by splitmix64) as a Python object."""
from __future__ import annotations

import ctypes

import numpy as np

from ._checks import is_int
from ._clib import _RngC, _rng_seed, _rng_uniform

__all__ = ["Rng", "check_seed"]


def check_seed(seed) -> int:
    """``seed`` as an int; ValueError unless it is an integer in [0, 2**64)."""
    if not is_int(seed) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2**64), got {seed!r}")
    return int(seed)


class Rng:
    """The C generator (xoshiro256** seeded by splitmix64) as an object; for tests and tools.

    ``Rng(seed)`` gives the stream a ``NativeSampler`` with the same seed consumes.
    """

    __slots__ = ("_c",)

    def __init__(self, seed: int) -> None:
        self._c = _RngC()
        _rng_seed(ctypes.addressof(self._c), check_seed(seed))

    def uniform(self) -> float:
        """One uniform double in [0, 1) (53 random bits)."""
        return _rng_uniform(ctypes.addressof(self._c))

    def uniforms(self, n: int) -> np.ndarray:
        """The next ``n`` uniforms: float64 [n]."""
        a = ctypes.addressof(self._c)
        return np.array([_rng_uniform(a) for _ in range(n)], dtype=np.float64)

    def copy(self) -> Rng:
        """An independent generator at the same point of the stream."""
        other = Rng.__new__(Rng)
        other._c = _RngC()
        ctypes.pointer(other._c)[0] = self._c
        return other

    @property
    def state(self) -> tuple[int, int, int, int]:
        """The four 64-bit words of the xoshiro256** state."""
        return tuple(self._c.s)
