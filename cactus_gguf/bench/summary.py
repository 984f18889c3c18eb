"""Summaries over the per-run records of a benchmark: pure functions (quantiles, per-prompt speed
ratios, pooled acceptance counters, pass@1)."""
from __future__ import annotations

import math
import statistics
from typing import Sequence

import numpy as np

from ..options import MODEL_DRAFTERS

__all__ = ["quantiles", "median_ratio", "summarize", "finite", "pass_at_1_statistics",
           "per_answer", "per_answer_ratios", "PER_ANSWER"]

# What one answer costs, from a run record: the figure's name -> how to read it off the record.
# Verifier calls are the steps (verification batches or verifier-alone decodes); draft forwards
# are the draft model's decodes (absent from runs recorded before they were counted: None).
PER_ANSWER = {
    "seconds": lambda r: r["prefill_seconds"] + r["decode_seconds"],  # end to end
    "decode_seconds": lambda r: r["decode_seconds"],
    "verifier_calls": lambda r: r["n_steps"],
    "draft_forwards": lambda r: r.get("n_draft_forwards"),
    "tokens": lambda r: r["n_tokens"],
}


def quantiles(values: Sequence[float]) -> dict[str, float | None]:
    """min, q25, median, q75, max of ``values`` (linear interpolation between order statistics,
    NumPy's default); all None for no values."""
    if not values:
        return {"min": None, "q25": None, "median": None, "q75": None, "max": None}
    a = np.asarray(values, dtype=np.float64)
    q = np.percentile(a, [0, 25, 50, 75, 100])
    return {"min": float(q[0]), "q25": float(q[1]), "median": float(q[2]), "q75": float(q[3]),
            "max": float(q[4])}


def median_ratio(num: dict[str, float], den: dict[str, float]) -> float | None:
    """Median over prompts of ``num[p] / den[p]`` (prompts present in both, with den[p] > 0):
    the per-prompt speed ratio, immune to drift that slows every configuration of a prompt alike.
    None when no prompt qualifies."""
    ratios = [num[p] / den[p] for p in num if p in den and den[p] > 0]
    return float(statistics.median(ratios)) if ratios else None


def finite(x: float | None) -> float | None:
    return x if x is None or math.isfinite(x) else None


def pass_at_1_statistics(scored: Sequence[dict], baseline: Sequence[dict] | None) -> dict:
    """pass@1's 95% interval (Wilson score, scipy.stats.binomtest) and, against ``baseline`` (the
    same problems' runs of ``none``), the paired comparison: ``gained`` = problems this
    configuration passes and none fails, ``lost`` the reverse, ``mcnemar_p`` the exact McNemar
    test (two-sided binomial test of gained vs lost at 1/2). None where there is nothing to test
    or scipy is missing."""
    out = {"pass_at_1_ci95": None, "paired_vs_none": None}
    if not scored:
        return out
    try:
        from scipy.stats import binomtest
    except ImportError:
        return out
    n_pass = sum(bool(r["passed"]) for r in scored)
    ci = binomtest(n_pass, len(scored)).proportion_ci(0.95, method="wilson")
    out["pass_at_1_ci95"] = [float(ci.low), float(ci.high)]
    if baseline:
        base = {r["prompt"]: bool(r["passed"]) for r in baseline}
        pairs = [(bool(r["passed"]), base[r["prompt"]]) for r in scored if r["prompt"] in base]
        gained = sum(a and not b for a, b in pairs)
        lost = sum(b and not a for a, b in pairs)
        p = binomtest(gained, gained + lost, 0.5).pvalue if gained + lost else 1.0
        out["paired_vs_none"] = {"n": len(pairs), "gained": gained, "lost": lost,
                                 "difference": (gained - lost) / len(pairs) if pairs else None,
                                 "mcnemar_p": float(p)}
    return out


def per_answer(runs: Sequence[dict]) -> dict:
    """Mean cost of one answer over ``runs``: every PER_ANSWER figure (seconds end to end and
    of decoding, verifier calls, draft forwards, tokens), and ``test_sections``, the share of
    answers with a test / example section (scoring.has_test_section). None where no run has the
    figure."""
    from .scoring import has_test_section

    out: dict = {}
    for name, read in PER_ANSWER.items():
        values = [read(r) for r in runs]
        out[name] = (float(np.mean(values)) if values and None not in values else None)
    out["test_sections"] = (sum(has_test_section(r.get("text", "")) for r in runs) / len(runs)
                            if runs else None)
    return out


def per_answer_ratios(runs: Sequence[dict], base: Sequence[dict]) -> dict | None:
    """Each PER_ANSWER figure of ``runs`` as a ratio against ``base`` (another configuration's
    runs) on the prompts both ran: total over those prompts / the base's total, i.e. the ratio
    of the mean answers (a paired comparison: the same prompts, seeds and warps). None for a
    figure the base does not have or totals 0 (draft forwards of ``none``); None without base."""
    if not base:
        return None
    theirs = {r["prompt"]: r for r in base}
    pairs = [(r, theirs[r["prompt"]]) for r in runs if r["prompt"] in theirs]
    if not pairs:
        return None
    out: dict = {"n_prompts": len(pairs)}
    for name, read in PER_ANSWER.items():
        a = [read(r) for r, _ in pairs]
        b = [read(t) for _, t in pairs]
        ok = None not in a and None not in b and sum(b) > 0
        out[name] = float(sum(a) / sum(b)) if ok else None
    return out


def _end_to_end(run: dict) -> float:
    """Tokens per second including prompt processing (prefill) of every model involved."""
    t = run["prefill_seconds"] + run["decode_seconds"]
    return run["n_tokens"] / t if t > 0 else 0.0


# Per-prompt figures whose per-prompt ratios summarize reports: name -> how to read it off a run.
_PER_PROMPT = {
    "tokens_per_second": lambda r: r["tokens_per_second"],  # decode only
    "end_to_end": _end_to_end,
    "first_token": lambda r: r.get("first_token_seconds", 0.0),
}


def summarize(configs: Sequence[dict], runs: Sequence[dict],
              forward_ms: dict | None = None) -> list[dict]:
    """One summary per configuration from the per-run records (``run_bench``'s ``runs``).

    The headline is per answer: ``per_answer`` (mean seconds end to end and of decoding, verifier
    calls, draft forwards, tokens, share with test sections) and its ratios against ``none``
    (``per_answer_vs_none``), against ``sps`` at the same k (``per_answer_vs_sps``) and against
    each llama-server peer at the same k (``per_answer_vs_peers``: peer id -> ratios; None
    without ``--peers``) on the same prompts. Speed per token: tokens/s per prompt (decode only),
    its quantiles, and speedups as medians of per-prompt
    ratios against ``none`` and against ``sps`` at the same k (for ``none``: the first sps);
    ``end_to_end_*`` the same with prompt processing included (speculation prefills the draft too).
    Acceptance counters are pooled over prompts (total accepted / total steps ...). Time shares
    are fractions of the summed decode time. pass@1 = passed / scored (None if nothing scored);
    valid_rate = answers valid under their prompt's JSON Schema / checked (structured-output
    sets); grammar_ms_per_token = grammar-engine time per emitted token (constrained configs).
    With ``forward_ms`` (the forward-cost probe), ``predicted_speedup_vs_none`` is the ratio the
    forward costs alone imply: tokens per verifier call x t_verifier(1) /
    (drafted per step x t_draft(1) + t_verifier(k+1)) for the model drafter.
    """
    by_cfg: dict[str, list[dict]] = {c["id"]: [] for c in configs}
    for r in runs:
        by_cfg[r["config"]].append(r)
    tables = {name: {cid: {r["prompt"]: read(r) for r in rs} for cid, rs in by_cfg.items()}
              for name, read in _PER_PROMPT.items()}
    # sps at the same k and under the same constraint (a structured run has both)
    sps_ids = {(c["k"], bool(c.get("constrained"))): c["id"] for c in configs
               if c["method"] == "sps"}
    peers = [c for c in configs if c.get("decoder") == "llama-server"]  # bench --peers
    out = []
    for c in configs:
        rs = by_cfg[c["id"]]
        tot = _totals(rs)
        sps_id = _sps_for(c, sps_ids) if c["method"] != "sps" else None
        s = {
            "config": c["id"], "label": c["label"], "method": c["method"], "k": c["k"],
            "delta": c["delta"], "budget": c.get("budget"), "drafter": c["drafter"],
            "n_prompts": len(rs),
            "tokens": tot["n_tokens"],
            **_speed(c["id"], rs, by_cfg, tables, sps_id),
            **_acceptance(rs, tot),
            **_quality(c, rs, by_cfg, tot),
            "cpu_utilisation_median": quantiles([r["cpu_utilisation"] for r in rs
                                                 if r.get("cpu_utilisation") is not None])["median"],
            "predicted_speedup_vs_none": None,
        }
        s["predicted_speedup_vs_none"] = _predicted_speedup(c, s, forward_ms)
        # against each llama-server peer at the same k (every peer for none and draft)
        s["per_answer_vs_peers"] = {
            p["id"]: per_answer_ratios(rs, by_cfg[p["id"]]) for p in peers
            if p["id"] != c["id"] and c["k"] in (None, p["k"])} if peers else None
        out.append(s)
    return out


def _totals(rs: Sequence[dict]) -> dict[str, float | None]:
    """The counters and seconds of one configuration's runs, summed over its prompts; None for
    a figure its runs do not measure (llama-server's draft / verify / accept split)."""
    def total(key: str) -> float | None:
        # output_kl_sum: absent from runs recorded before it existed
        values = [r.get(key, 0.0) if key == "output_kl_sum" else r[key] for r in rs]
        return None if rs and all(v is None for v in values) else sum(values)

    return {key: total(key) for key in
            ("n_tokens", "n_steps", "n_drafted", "n_accepted", "n_evaluated", "kl_sum",
             "output_kl_sum", "decode_seconds", "draft_seconds", "verify_seconds", "accept_seconds",
             "other_seconds", "prefill_seconds")}


def _sps_for(c: dict, sps_ids: dict[tuple, str]) -> str | None:
    """The sps configuration ``c`` is compared with: the one at its k under its constraint, else
    the first under its constraint, else the first sps (``sps_ids``: (k, constrained) -> id)."""
    constrained = bool(c.get("constrained"))
    first_sps = next(iter(sps_ids.values()), None)
    return sps_ids.get((c["k"], constrained),
                       next((v for (k, con), v in sps_ids.items() if con == constrained),
                            first_sps))


def _ratio_vs(table: dict[str, dict[str, float]], cid: str, base: str | None) -> float | None:
    """Median per-prompt ratio of configuration ``cid``'s figure to ``base``'s in ``table``
    (config id -> prompt -> figure); None without base, or when ``cid`` is the base."""
    return median_ratio(table[cid], table[base]) if base in table and base != cid else None


def _speed(cid: str, rs: Sequence[dict], by_cfg: dict[str, list[dict]],
           tables: dict[str, dict], sps_id: str | None) -> dict:
    """Configuration ``cid``'s speed: tokens/s (decode only, then end to end) and its per-prompt
    speedups, what one answer costs and its ratios, seconds to the first token; against ``none``
    and ``sps_id``."""
    tps, e2e, ttft = tables["tokens_per_second"], tables["end_to_end"], tables["first_token"]
    return {
        "tokens_per_second": quantiles([r["tokens_per_second"] for r in rs]),
        "speedup_vs_none": _ratio_vs(tps, cid, "none"),
        "speedup_vs_sps": _ratio_vs(tps, cid, sps_id),
        "end_to_end_tokens_per_second": quantiles(list(e2e[cid].values())),
        "end_to_end_speedup_vs_none": _ratio_vs(e2e, cid, "none"),
        "vs_sps_config": sps_id,
        # the headline: what one answer costs (a user waits for answers, not tokens)
        "per_answer": per_answer(rs),
        "per_answer_vs_none": per_answer_ratios(rs, by_cfg.get("none")) if cid != "none" else None,
        "per_answer_vs_sps": per_answer_ratios(rs, by_cfg[sps_id]) if sps_id else None,
        # seconds from the start of prompt processing to the first emitted token
        "first_token_seconds": quantiles([r.get("first_token_seconds", 0.0) for r in rs]),
        "first_token_vs_none": _ratio_vs(ttft, cid, "none"),
    }


def _acceptance(rs: Sequence[dict], tot: dict[str, float]) -> dict:
    """Pooled acceptance counters (per verification step, per drafted token), the KL of the
    rule's target and of what is emitted (nats, mean per token and max), the seconds spent by
    part and their shares of the decode time."""
    steps, dec = tot["n_steps"], tot["decode_seconds"]
    return {
        "mean_accepted_length": tot["n_accepted"] / steps if steps else 0.0,
        "acceptance_rate": tot["n_accepted"] / tot["n_drafted"] if tot["n_drafted"] else None,
        "mean_drafted_length": tot["n_drafted"] / steps if steps else 0.0,
        "tokens_per_verifier_call": tot["n_tokens"] / steps if steps else 0.0,
        "kl_mean": tot["kl_sum"] / tot["n_evaluated"] if tot["n_evaluated"] else 0.0,
        "kl_max": finite(max((r["kl_max"] for r in rs), default=0.0)),
        "output_kl_mean": tot["output_kl_sum"] / (tot["n_accepted"] + steps) if steps else 0.0,
        "output_kl_max": max((r.get("output_kl_max", 0.0) for r in rs), default=0.0),
        "seconds": {k.removesuffix("_seconds"): v for k, v in tot.items() if k.endswith("_seconds")},
        "time_share": {part: (tot[f"{part}_seconds"] / dec
                              if dec > 0 and tot[f"{part}_seconds"] is not None else None)
                       for part in ("draft", "verify", "accept", "other")},
    }


def _quality(c: dict, rs: Sequence[dict], by_cfg: dict[str, list[dict]],
             tot: dict[str, float]) -> dict:
    """Configuration ``c``'s answers: pass@1 (with its interval and the paired comparison with
    ``none``), the JSON Schema valid rate, the grammar engine's ms per emitted token."""
    checked = [r["valid"] for r in rs if r.get("valid") is not None]
    grammar_s = sum(r.get("grammar_seconds", 0.0) for r in rs)
    scored = [r for r in rs if r.get("passed") is not None]
    baseline = ([r for r in by_cfg.get("none", []) if r.get("passed") is not None]
                if c["id"] != "none" else None)
    return {
        "pass_at_1": sum(bool(r["passed"]) for r in scored) / len(scored) if scored else None,
        "n_scored": len(scored),
        **pass_at_1_statistics(scored, baseline),
        "valid_rate": sum(checked) / len(checked) if checked else None,
        "n_checked": len(checked),
        "constrained": bool(c.get("constrained")),
        "grammar_ms_per_token": (1e3 * grammar_s / tot["n_tokens"]
                                 if c.get("constrained") and tot["n_tokens"] else None),
    }


def _predicted_speedup(c: dict, s: dict, forward_ms: dict | None) -> float | None:
    """The speedup over ``none`` that the forward costs (``forward_ms``: model -> str(rows) -> ms)
    alone imply for summary ``s`` of configuration ``c`` (see :func:`summarize`); None without
    them, for ``k`` auto or no runs, or when a cost is missing."""
    if not (forward_ms and isinstance(c["k"], int) and s["n_prompts"]):
        return None
    tv1 = forward_ms["verifier"].get("1")
    tvk = forward_ms["verifier"].get(str(c["k"] + 1))
    td = forward_ms["draft"].get("1", 0.0) if c["drafter"] in MODEL_DRAFTERS else 0.0
    if tv1 and tvk and td is not None:
        return s["tokens_per_verifier_call"] * tv1 / (s["mean_drafted_length"] * td + tvk)
    return None
