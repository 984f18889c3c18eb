"""What a reply reports of its generation, shared by every API: the ``speculative`` block (what
speculation did), llama-server's ``timings``, and the build this server is (``build_info``,
OpenAI's ``system_fingerprint``)."""
from __future__ import annotations

import importlib.metadata
from functools import lru_cache

import llama_cpp

from ..options.rule import rule_of
from ..stats.table import speculative_fields
from ..stats.table import timings as stats_timings

__all__ = ["speculative_block", "timings", "build_info", "system_fingerprint"]


def speculative_block(request, result) -> dict:
    """The speculative block of a reply: the whole rule that ran (options/rule.py: each setting
    where it applies, null elsewhere; k = 0 reports method none, the verifier alone), then what
    it did (the statistics table's ``speculative`` fields of ``result.stats``, stats/table.py:
    AL is ``acceptance_length``, the residual / bonus token not counted), then the seed."""
    return {**rule_of(request), **speculative_fields(result.stats, request.speculates),
            "seed": result.seed}


def timings(s, n_predicted: int | None = None) -> dict:
    """llama-server's ``timings`` of a generation's stats ``s``: the statistics table's
    ``timings`` fields (stats/table.py ``timings``: prompt the tokens decoded, those reused
    ``cache_n``; predicted the emitted tokens, or ``n_predicted``, the first token left out of
    the per-token figures as llama-server does; draft_n / draft_n_accepted when any were
    drafted). Times in milliseconds."""
    return stats_timings(s, n_predicted)


@lru_cache(maxsize=1)
def build_info() -> str:
    """This server's build, as ``/props`` reports it."""
    try:
        version = importlib.metadata.version("cactus-gguf")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "source"
    return f"cactus-gguf {version} (llama-cpp-python {llama_cpp.__version__})"


@lru_cache(maxsize=1)
def system_fingerprint() -> str:
    """OpenAI's ``system_fingerprint``: llama-server sends ``b<build>-<commit>``; here ``b`` and
    the same build, one word."""
    return "b-" + build_info().replace(" (", "-").replace(")", "").replace(" ", "-")
