"""The benchmark report: the summary table (text and Markdown) and the files (JSON, table, plot)."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ..prompting.text import columns
from .summary import quantiles

__all__ = ["format_table", "format_markdown", "write_report", "fmt"]


def fmt(x: float | None, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def scored(report: dict) -> bool:
    """Whether the run scored answers (pass@1)."""
    return any(s.get("n_scored") for s in report["summary"])


def pass_cell(s: dict, dash: str) -> str:
    """pass@1 as "73% (120/164) [66–79]" (the 95% Wilson interval, when computed)."""
    if s.get("pass_at_1") is None:
        return dash
    text = f"{s['pass_at_1']:.0%} ({round(s['pass_at_1'] * s['n_scored'])}/{s['n_scored']})"
    ci = s.get("pass_at_1_ci95")
    return text + (f" [{ci[0]:.0%}–{ci[1]:.0%}]" if ci else "")


def paired_cell(s: dict, dash: str) -> list[str]:
    """The paired comparison against none: "+3 / −5 (p 0.73)"."""
    pv = s.get("paired_vs_none")
    if not pv:
        return [dash]
    return [f"+{pv['gained']} / −{pv['lost']} (p {pv['mcnemar_p']:.2f})"]


def structured(report: dict) -> bool:
    """Whether the run had structured-output prompts (answers checked against a JSON Schema)."""
    return any(s.get("n_checked") for s in report["summary"])


def structured_cells(s: dict, dash: str) -> list[str]:
    """The validity and grammar-mask cells of a summary row."""
    valid = (f"{s['valid_rate']:.0%} ({round(s['valid_rate'] * s['n_checked'])}/{s['n_checked']})"
             if s.get("valid_rate") is not None else dash)
    return [valid, fmt(s.get("grammar_ms_per_token"), ".3f", dash)]


# The per-answer table's figures: (PER_ANSWER name, column head, number format)
_PER_ANSWER_COLUMNS = (("seconds", "s/answer", ".2f"), ("decode_seconds", "decode s/answer", ".2f"),
                       ("verifier_calls", "verifier calls/answer", ".1f"),
                       ("draft_forwards", "draft forwards/answer", ".1f"),
                       ("tokens", "tokens/answer", ".1f"))


def _per_answer_cell(s: dict, name: str, spec: str, dash: str) -> str:
    """A per-answer figure with its ratios against none and sps: "12.3 (×0.81 none, ×1.05 sps)"."""
    value = (s.get("per_answer") or {}).get(name)
    if value is None:
        return dash
    ratios = [f"×{r:.2f} {base}" for base, r in
              (("none", (s.get("per_answer_vs_none") or {}).get(name)),
               ("sps", (s.get("per_answer_vs_sps") or {}).get(name))) if r is not None]
    return format(value, spec) + (f" ({', '.join(ratios)})" if ratios else "")


def per_answer_rows(report: dict, dash: str) -> list[list[str]]:
    """The headline table, a user's view: what one answer costs under each configuration (means
    over the prompts; ratios on the same prompts against none and sps at the same k), the share
    of answers with a test / example section, and pass@1."""
    rows = [["config"] + [head for _, head, _ in _PER_ANSWER_COLUMNS] + ["test sections"]
            + (["pass@1"] if scored(report) else [])]
    for s in report["summary"]:
        share = (s.get("per_answer") or {}).get("test_sections")
        rows.append([s["label"]] + [_per_answer_cell(s, n, f, dash) for n, _, f in _PER_ANSWER_COLUMNS]
                    + [fmt(share, ".0%", dash)]
                    + ([fmt(s.get("pass_at_1"), ".1%", dash)] if scored(report) else []))
    return rows


def peer_summaries(report: dict) -> list[dict]:
    """The summaries of the llama-server peers (``bench --peers``), in order."""
    return [s for s in report["summary"] if s["method"] == "llama-server"]


def peer_rows(report: dict, dash: str) -> list[list[str]]:
    """``bench --peers``: every configuration beside llama.cpp's own speculation, per answer
    (means over the prompts): seconds, verifier calls, tokens, acceptance (accepted / drafted,
    pooled), tokens per verifier call, and the verifier calls per answer as a ratio of each
    peer's at the same k on the same prompts (ratio of the means)."""
    peers = peer_summaries(report)
    rows = [["config", "s/answer", "verifier calls/answer", "tokens/answer", "accept",
             "tok/call"] + [f"calls × {p['label']}" for p in peers]]
    for s in report["summary"]:
        pa = s.get("per_answer") or {}
        vs = s.get("per_answer_vs_peers") or {}
        rows.append([s["label"], fmt(pa.get("seconds"), ".2f", dash),
                     fmt(pa.get("verifier_calls"), ".1f", dash), fmt(pa.get("tokens"), ".1f", dash),
                     fmt(s.get("acceptance_rate"), ".0%", dash),
                     fmt(s.get("tokens_per_verifier_call"), ".2f", dash)]
                    + [fmt((vs.get(p["config"]) or {}).get("verifier_calls"), ".2f", dash)
                       for p in peers])
    return rows


def per_prompt_rows(report: dict, dash: str) -> list[list[str]]:
    """Each prompt's verifier calls / tokens under every configuration (``bench --peers``'s
    per-answer view)."""
    runs = {(r["prompt"], r["config"]): r for r in report["runs"]}
    prompts = list(dict.fromkeys(r["prompt"] for r in report["runs"]))
    rows = [["prompt"] + [f"{s['label']}: calls / tokens" for s in report["summary"]]]
    for p in prompts:
        cells = []
        for s in report["summary"]:
            r = runs.get((p, s["config"]))
            cells.append(dash if r is None else f"{r['n_steps']} / {r['n_tokens']}")
        rows.append([p] + cells)
    return rows


def format_table(report: dict) -> list[str]:
    """The summary as aligned text lines: the per-answer table, then one row per configuration
    of the per-token figures, then the forward costs."""
    lines = ["per answer (mean; × the same prompts' none / sps):"]
    lines += columns(per_answer_rows(report, "-"))
    lines += ["", "per token:"]
    rows = [["config", "k", "tok/s median [q25-q75]", "x none", "x sps", "x none e2e", "AL",
             "accept", "tok/call", "draft/verify/accept/other", "KL target", "KL output",
             "pass@1 [95% CI]"] + (["vs none: +/- (p)"] if scored(report) else [])
            + (["valid", "mask ms/tok"] if structured(report) else [])]
    for s in report["summary"]:
        t = s["tokens_per_second"]
        share = s["time_share"]
        rows.append([
            s["label"], "-" if s["k"] is None else str(s["k"]),
            f"{fmt(t['median'], '.2f')} [{fmt(t['q25'], '.2f')}-{fmt(t['q75'], '.2f')}]",
            fmt(s["speedup_vs_none"], ".2f"), fmt(s["speedup_vs_sps"], ".2f"),
            fmt(s["end_to_end_speedup_vs_none"], ".2f"),
            fmt(s["mean_accepted_length"], ".2f") if s["k"] is not None else "-",
            fmt(s["acceptance_rate"], ".0%"),
            fmt(s["tokens_per_verifier_call"], ".2f"),
            "/".join(fmt(share[p], ".1%") for p in ("draft", "verify", "accept", "other")),
            fmt(s["kl_mean"], ".3f") if s["k"] is not None else "-",
            fmt(s.get("output_kl_mean"), ".3f") if s["k"] is not None else "-",
            pass_cell(s, "-"),
        ] + (paired_cell(s, "-") if scored(report) else [])
          + (structured_cells(s, "-") if structured(report) else []))
    lines += columns(rows)
    if peer_summaries(report):
        lines += ["", "beside llama-server (per answer, mean; calls × = ratio of the same "
                      "prompts' verifier calls per answer):"]
        lines += columns(peer_rows(report, "-"))
    fw = report["forward_ms"]["before"]
    ver = ", ".join(f"{n} tok {ms:.1f} ms" for n, ms in fw["verifier"].items())
    lines.append("")
    lines.append(f"forward cost (median of {fw['repeats']}): verifier {ver}"
                 + (f"; draft 1 tok {fw['draft']['1']:.1f} ms "
                    f"(= {fw['draft_over_verifier']:.2f} x verifier 1 tok)" if fw["draft"] else ""))
    util = quantiles([r["cpu_utilisation"] for r in report["runs"]
                      if r.get("cpu_utilisation") is not None])
    load = report.get("load_average") or {}
    if util["median"] is not None:
        lines.append(f"CPU time / wall time per run: median {util['median']:.2f}, min {util['min']:.2f} "
                     f"({report['settings']['n_threads']} threads; lower means other processes took "
                     f"cores)" + (f"; load average {load['before'][0]:.2f} before, "
                                  f"{load['after'][0]:.2f} after" if load.get("before") else ""))
    return lines


def _first_token_cell(s: dict) -> str:
    t = s.get("first_token_seconds")
    if not t or t.get("median") is None:
        return "–"
    ratio = s.get("first_token_vs_none")
    return fmt(t["median"], ".2f") + (f" ({ratio:.2f})" if ratio is not None else "")


def format_markdown(report: dict) -> str:
    """The summary as Markdown: the per-answer table (the headline), the per-token table, then
    the forward costs and the machine / model facts."""
    pa = per_answer_rows(report, "–")
    out = ["Per answer (mean over the prompts; × = ratio against the same prompts' none / sps):", "",
           "| " + " | ".join(pa[0]) + " |", "|" + "---|" * len(pa[0])]
    out += ["| " + " | ".join(row) + " |" for row in pa[1:]]
    out += ["", "Per token:", ""]
    head = ["config", "k", "tok/s median [q25–q75]", "× none", "× sps", "× none, with prefill",
            "first token, s (× none)", "drafted / step", "AL", "accept", "tok/call",
            "draft / verify / accept / other",
            "KL(h‖q) target, nats/draft", "KL(P‖q) output, nats/token", "pass@1 [95% CI]"] + (
                ["paired vs none: passes gained / lost (McNemar p)"] if scored(report) else []) + (
                ["valid JSON (schema)", "grammar mask, ms/token"] if structured(report) else [])
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in report["summary"]:
        t, share, spec = s["tokens_per_second"], s["time_share"], s["k"] is not None
        out.append("| " + " | ".join([
            s["label"], str(s["k"]) if spec else "–",
            f"{fmt(t['median'], '.2f')} [{fmt(t['q25'], '.2f')}–{fmt(t['q75'], '.2f')}]",
            fmt(s["speedup_vs_none"], ".2f", "–"), fmt(s["speedup_vs_sps"], ".2f", "–"),
            fmt(s["end_to_end_speedup_vs_none"], ".2f", "–"),
            _first_token_cell(s),
            fmt(s["mean_drafted_length"], ".2f") if spec else "–",
            fmt(s["mean_accepted_length"], ".2f") if spec else "–",
            fmt(s["acceptance_rate"], ".0%", "–"), fmt(s["tokens_per_verifier_call"], ".2f"),
            " / ".join(fmt(share[p], ".1%") for p in ("draft", "verify", "accept", "other")),
            fmt(s["kl_mean"], ".3f") if spec else "–",
            fmt(s.get("output_kl_mean"), ".3f", "–") if spec else "–",
            pass_cell(s, "–")]
            + (paired_cell(s, "–") if scored(report) else [])
            + (structured_cells(s, "–") if structured(report) else [])) + " |")
    if peer_summaries(report):
        out += _peers_markdown(report)
    fw = report["forward_ms"]
    out.append("")
    out.append("Forward cost, median ms of one `llama_decode` (before / after the runs):")
    out.append("")
    out.append("| forward | before | after |")
    out.append("|---|---|---|")
    for n in fw["before"]["verifier"]:
        out.append(f"| verifier, {n} token{'s' if n != '1' else ''} | "
                   f"{fw['before']['verifier'][n]:.1f} | {fw['after']['verifier'][n]:.1f} |")
    if fw["before"]["draft"]:
        out.append(f"| draft, 1 token | {fw['before']['draft']['1']:.1f} | {fw['after']['draft']['1']:.1f} |")
    probe = report.get("auto_probe")
    if probe:
        out.append("")
        out.append(f"`-k auto`'s cost model: {'read from the cache' if probe['cached'] else 'probed'}"
                   f" in {probe['seconds']:.2f} s at load.")
    m, b = report["machine"], report["build"]
    out.append("")
    out.append(f"Machine: {m['cpu']}, {m['cores_usable']} usable cores ({', '.join(m['simd'])}), "
               f"GPU {m['gpu']}, {m['os']}. llama-cpp-python {b['llama_cpp_python']}; "
               f"llama.cpp `{b['llama_system_info']}`, weight repacking "
               f"{'off (AMX guard, llama.cpp #20824)' if b['amx_repack_disabled'] else 'on'}; "
               f"cactus-gguf {b['cactus_gguf']} "
               f"(git {b['git_commit']}).")
    for role, mf in report["models"].items():
        out.append(f"{role.capitalize()}: {mf['file']} ({mf['description']}, sha256 {mf['sha256']}).")
    return "\n".join(out) + "\n"



def _peers_markdown(report: dict) -> list[str]:
    """bench.md's section on the llama-server peers: the per-answer comparison, each prompt's
    calls and tokens, and how llama-server's figures were read."""
    facts = report.get("peers") or {}
    pr, pp = peer_rows(report, "–"), per_prompt_rows(report, "–")
    out = ["", "Beside llama.cpp's own speculation (llama-server on the same prompts, seeds and "
           "sampling; per answer, mean over the prompts; calls × = ratio of the same prompts' "
           "verifier calls per answer):", "",
           "| " + " | ".join(pr[0]) + " |", "|" + "---|" * len(pr[0])]
    out += ["| " + " | ".join(row) + " |" for row in pr[1:]]
    out += ["", "Each answer's verifier calls / tokens:", "",
            "| " + " | ".join(pp[0]) + " |", "|" + "---|" * len(pp[0])]
    out += ["| " + " | ".join(row) + " |" for row in pp[1:]]
    if facts:
        version = facts.get("version") or "version unknown"
        out += ["", f"llama-server: `{facts.get('binary')}` ({version}). Verifier calls: "
                    f"{facts.get('verifier_calls')}. Acceptance: {facts.get('acceptance')}. "
                    f"Seconds: {facts.get('seconds')}. Drafting: {facts.get('drafting')}."]
        for cid, args in (facts.get("args") or {}).items():
            out.append(f"- `{cid}`: `llama-server {' '.join(args)}`")
    return out


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj




def write_report(report: dict, output_dir: str | os.PathLike[str], *,
                 plot: bool = True) -> dict[str, Path | str | None]:
    """Write ``bench.json``, ``bench.md`` (the Markdown table), ``bench.png`` and, when there is
    a speculative configuration, the Pareto view ``pareto.png`` with its data ``pareto.json``,
    with two or more draft lengths ``k.png`` (tokens/s against k, ``auto`` at the length it
    chose), and with two or more scored configurations ``quality.png`` (pass@1 against AL) (plots when
    ``plot`` and matplotlib is installed) into ``output_dir`` (created).
    Returns {"json": path, "md": path, "png": path or None, "pareto": path or None,
    "quality": path or None, "k": path or None, "note": message or None}.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "bench.json"
    json_path.write_text(json.dumps(_json_safe(report), indent=1, ensure_ascii=False,
                                    allow_nan=False) + "\n", encoding="utf-8")
    md_path = out / "bench.md"
    md_path.write_text(format_markdown(report), encoding="utf-8")
    png, pareto, quality, k_png, note = None, None, None, None, None
    from .plot import pareto_points

    points = pareto_points(report)
    if points:
        (out / "pareto.json").write_text(json.dumps(_json_safe(points), indent=1,
                                                    ensure_ascii=False) + "\n", encoding="utf-8")
    if plot:
        try:
            from .plot import plot_k, plot_pareto, plot_quality, plot_report

            png = plot_report(report, out / "bench.png")
            k_png = plot_k(report, out / "k.png")
            if points:
                pareto = plot_pareto(report, out / "pareto.png")
            quality = plot_quality(report, out / "quality.png")
        except ImportError as e:
            note = f"no plot: {e}"
    return {"json": json_path, "md": md_path, "png": png, "pareto": pareto, "quality": quality,
            "k": k_png, "note": note}


