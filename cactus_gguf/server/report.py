"""What a reply reports of its generation, shared by every API: the ``speculative`` block (what
speculation did), llama-server's ``timings`` (of a whole generation, of a stream's chunk so far
with ``timings_per_token``), its ``prompt_progress`` (``return_progress``), and the build this
server is (``build_info``, OpenAI's ``system_fingerprint``)."""
from __future__ import annotations

import importlib.metadata
from functools import lru_cache

import llama_cpp

from ..options.rule import rule_of
from ..stats import GenerationStats
from ..stats.table import speculative_fields
from ..stats.table import timings as stats_timings

__all__ = ["speculative_block", "timings", "prompt_progress", "telemetry", "build_info",
           "system_fingerprint"]


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


def prompt_progress(p) -> dict:
    """llama-server's ``prompt_progress`` (server-task.cpp result_prompt_progress) of a
    speculative.session.Progress: the prompt's ``total`` tokens, those reused (``cache``), those
    in the cache so far (``processed``, reused included), and the milliseconds since prompt
    processing began (``time_ms``, an integer as llama-server's)."""
    return {"total": p.total, "cache": p.cache, "processed": p.processed,
            "time_ms": int(p.seconds * 1e3)}


def _progress_stats(p) -> GenerationStats:
    """The statistics of a generation whose prompt is processed as far as ``p`` says: nothing
    predicted; the prompt time 0 until a token was decoded (llama-server's t_prompt_ms)."""
    return GenerationStats(n_prompt_tokens=p.processed, n_prompt_tokens_reused=p.cache,
                           prefill_seconds=p.seconds if p.processed > p.cache else 0.0)


def telemetry(request, progress=None, chunk=None) -> dict:
    """What llama-server adds to a streamed chunk when asked: ``prompt_progress`` of a progress
    report (``return_progress``) and the ``timings`` as of it or of a chunk
    (``timings_per_token``: the Chunk's ``stats``); {} otherwise."""
    out = {}
    if request.timings_per_token:
        if progress is not None:
            out["timings"] = timings(_progress_stats(progress))
        elif chunk is not None and chunk.stats is not None:
            out["timings"] = timings(chunk.stats)
    if progress is not None:
        out["prompt_progress"] = prompt_progress(progress)
    return out


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
