"""What a reply reports of its generation, shared by every API: the ``speculative`` block (what
speculation did), llama-server's ``timings``, and the build this server is (``build_info``,
OpenAI's ``system_fingerprint``)."""
from __future__ import annotations

import importlib.metadata
from functools import lru_cache

import llama_cpp

from ..options.rule import rule_of

__all__ = ["speculative_block", "timings", "build_info", "system_fingerprint"]


def speculative_block(request, result) -> dict:
    """The speculative block of a reply: the whole rule that ran (options/rule.py: each setting
    where it applies, null elsewhere; k = 0 reports method none, the verifier alone), then what
    it did (``result.stats``: a GenerationStats, stats.py's glossary)."""
    s = result.stats
    speculates = request.speculates
    return {**rule_of(request),
            # AL: accepted drafts per step, the residual / bonus token not counted (vLLM's
            # mean acceptance length is AL + 1; stats.py's glossary)
            "acceptance_length": s.mean_accepted_length, "acceptance_rate": s.acceptance_rate,
            "tokens_per_verifier_call": s.tokens_per_verifier_call, "kl_mean": s.kl_mean,
            "kl_max": s.kl_max, "output_kl_mean": s.output_kl_mean,
            "output_kl_max": s.output_kl_max, "output_kl_sum": s.output_kl_sum,
            "draft_seconds": s.draft_seconds,
            "verify_seconds": s.verify_seconds, "prefill_seconds": s.prefill_seconds,
            "first_token_seconds": s.first_token_seconds,
            "tokens_per_second": s.tokens_per_second,
            "prompt_tokens_reused": s.n_prompt_tokens_reused,
            "draft_stopped_at": s.draft_stopped_at,
            # how the draft's tokens reached the verifier, and (another vocabulary) the
            # verifier's mass on the tokens it could propose
            "draft_vocab": s.draft_vocab if speculates else None,
            "vocab_coverage": s.vocab_coverage if speculates else None,
            "seed": result.seed}


def timings(s) -> dict:
    """llama-server's ``timings`` of a generation's stats ``s`` (prompt: the tokens decoded,
    those reused are ``cache_n``; predicted: the emitted tokens; draft_n / draft_n_accepted:
    drafted and accepted tokens, when any were drafted). Times in milliseconds."""
    n_prompt = s.n_prompt_tokens - s.n_prompt_tokens_reused
    out = {"cache_n": s.n_prompt_tokens_reused, "prompt_n": n_prompt,
           "prompt_ms": s.prefill_seconds * 1e3,
           "prompt_per_token_ms": s.prefill_seconds * 1e3 / max(n_prompt, 1),
           "prompt_per_second": n_prompt / s.prefill_seconds if s.prefill_seconds else 0.0,
           "predicted_n": s.n_tokens, "predicted_ms": s.decode_seconds * 1e3,
           "predicted_per_token_ms": s.decode_seconds * 1e3 / max(s.n_tokens, 1),
           "predicted_per_second": s.tokens_per_second}
    if s.n_drafted:
        out.update(draft_n=s.n_drafted, draft_n_accepted=s.n_accepted)
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
