"""Sampling math: the parameter records, the native helper's facade and its NumPy reference.

- ``params``: SamplingParams (warps; ``draft_sampling``: the draft's, at its own temperature) and
  AcceptanceParams (the acceptance rule), from the options table;
- ``native``: ctypes facade over the C helper of native/ (warp, sample, one verification step,
  the emitted law); ``errors``: its exceptions, one per C status;
- ``reference``: the same math in plain NumPy, which the tests and the kernel benchmark compare
  the C against decision for decision.
"""
from .errors import (BadDistributionError, EmptyMaskError, NativeArgumentError, NativeError,
                     NonFiniteLogitsError)
from .native import Law, NativeSampler, Rng, StepResult, binary_kl, cactus_gamma, pack_allowed
from .params import (METHODS, SOLVERS, AcceptanceParams, SamplingParams, acceptance_params,
                     draft_sampling, draft_sampling_params, sampling_params)

__all__ = ["AcceptanceParams", "SamplingParams", "NativeSampler", "StepResult", "Law", "Rng",
           "NativeError", "NativeArgumentError", "NonFiniteLogitsError", "BadDistributionError",
           "EmptyMaskError", "binary_kl", "cactus_gamma", "pack_allowed", "acceptance_params",
           "sampling_params", "draft_sampling", "draft_sampling_params", "METHODS", "SOLVERS"]
