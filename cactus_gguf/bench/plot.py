"""The benchmark plots (matplotlib, optional): acceptance length and tokens/s against δ; the
Pareto view, acceptance length and tokens/s against the divergence of what is emitted; tokens/s
against the draft length with ``-k auto``'s point; pass@1 against acceptance length."""
from __future__ import annotations

import os
from pathlib import Path

from .grid import FAMILIES, k_order

__all__ = ["plot_report", "plot_pareto", "pareto_points", "plot_k", "plot_quality",
           "FAMILY_STYLES"]

# One (colour, marker) per configuration family of the grid, no marker used twice (so a family
# is told apart in grey print too, mtp from mtp-sps say): the Pareto view and the k plot.
# plot_k's ``k=auto`` star is its own (a large "*" edged in black), so no family takes "*".
FAMILY_STYLES = {
    "cactus": ("tab:blue", "o"), "cactus-output": ("tab:purple", "s"),
    "cactus-exact": ("navy", "h"), "cactus-ends": ("tab:cyan", "p"),
    "cactus-ends-gap": ("teal", "H"), "sps": ("tab:orange", "D"), "typical": ("tab:green", "^"),
    "ears": ("goldenrod", "<"), "topk": ("tab:brown", "v"), "ngram": ("tab:red", "x"),
    "ngram-cactus": ("tab:pink", "P"), "hybrid": ("tab:olive", "8"),
    "mtp-sps": ("darkorange", "d"), "mtp": ("slateblue", ">"),
}
_PARETO_NAMES = {"cactus": "cactus (target budget)", "cactus-output": "cactus (output budget)"}


def _pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend; ImportError with a one-line install
    hint when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the plot needs matplotlib: pip install 'cactus-gguf[bench]'") from None
    return plt


def _save(plt, fig, path: str | os.PathLike[str]) -> Path:
    """Lay ``fig`` out, write it to ``path`` as PNG (110 dpi), close it; the path."""
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _legend(ax, **kw) -> None:
    """The panel's legend, when something on it has a label: a panel a run leaves empty (the
    acceptance length of ``--configs none``, which drafts nothing) gets none, where matplotlib
    would warn "No artists with labels found"."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kw)


def _seconds_per_answer(s: dict) -> float | None:
    return (s.get("per_answer") or {}).get("seconds")


# plot_report's styles. Cactus: one colour and marker per k. References: one colour per method,
# one line style per k. The verifier alone and the draft alone: their own lines.
_K_COLORS, _K_MARKERS = ["tab:blue", "tab:cyan", "navy", "tab:purple"], "os^D"
_K_STYLES = ["--", ":", "-.", (0, (5, 1))]
_REF_COLORS = {"sps": "tab:orange", "typical": "tab:green", "topk": "tab:brown", "ngram": "tab:red",
               "hybrid": "tab:olive"}
_ALONE = {"none": dict(color="black", lw=2.2, label="none (verifier alone)"),
          "draft": dict(color="grey", lw=1.6, ls="--", label="draft alone")}


def plot_report(report: dict, path: str | os.PathLike[str]) -> Path:
    """PNG: against δ for Cactus (one line per k), acceptance length, tokens/s (with its q25-q75
    as error bars) and the headline, mean seconds per answer end to end (what a user waits for: a
    rule that makes answers longer can win tokens/s and lose here); sps, none, the draft alone
    and the other configurations as horizontal lines.

    Raises ImportError with a one-line install hint when matplotlib is missing.
    """
    plt = _pyplot()
    summary = report["summary"]
    ks = sorted({s["k"] for s in summary if s["k"] is not None}, key=k_order)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax_al, ax_tps, ax_ans = axes
    panels = ((ax_tps, lambda s: s["tokens_per_second"]["median"]), (ax_ans, _seconds_per_answer))
    for s in summary:  # drawn first, so that a method on the same value stays visible on top
        if s["method"] in _ALONE:
            _hlines(panels, s, _ALONE[s["method"]])
    for i, k in enumerate(ks):
        cac = sorted((s for s in summary if s["method"] == "cactus" and s["k"] == k),
                     key=lambda s: s["delta"])
        if cac:
            _plot_cactus(axes, cac, i, f" k={k}" if len(ks) > 1 else "")
        for s in summary:
            if s["k"] == k and s["method"] in _REF_COLORS:
                style = dict(color=_REF_COLORS[s["method"]], ls=_K_STYLES[i % len(_K_STYLES)],
                             lw=1.4, label=s["label"])
                ax_al.axhline(s["mean_accepted_length"], **style)
                _hlines(panels, s, style)
    _label_delta_axes(axes, sorted({s["delta"] for s in summary if s["method"] == "cactus"}))
    fig.suptitle(_report_title(report), fontsize=8)
    return _save(plt, fig, path)


def _hlines(panels, s: dict, style: dict) -> None:
    """Configuration ``s`` as a horizontal line in ``style`` on each (axes, value) panel whose
    value it has."""
    for ax, value in panels:
        if value(s) is not None:
            ax.axhline(value(s), **style)


def _plot_cactus(axes, cac: list[dict], i: int, ksuf: str) -> None:
    """The i-th k's Cactus configurations ``cac`` (sorted by δ) as lines against δ on the three
    panels: acceptance length, median tokens/s with q25-q75 bars, and seconds per answer (when
    every configuration has it)."""
    ax_al, ax_tps, ax_ans = axes
    color, marker = _K_COLORS[i % len(_K_COLORS)], _K_MARKERS[i % len(_K_MARKERS)] + "-"
    d = [s["delta"] for s in cac]
    ax_al.plot(d, [s["mean_accepted_length"] for s in cac], marker, color=color,
               label=f"cactus{ksuf}")
    med = [s["tokens_per_second"]["median"] for s in cac]
    ax_tps.errorbar(d, med, yerr=[[m - s["tokens_per_second"]["q25"] for m, s in zip(med, cac)],
                                  [s["tokens_per_second"]["q75"] - m for m, s in zip(med, cac)]],
                    fmt=marker, color=color, capsize=4, label=f"cactus{ksuf} (bars: q25-q75)")
    if all(_seconds_per_answer(s) is not None for s in cac):
        ax_ans.plot(d, [_seconds_per_answer(s) for s in cac], marker, color=color,
                    label=f"cactus{ksuf}")


def _label_delta_axes(axes, cactus_deltas: list[float]) -> None:
    """Axis labels, ticks at the Cactus δs (nats), grid and legend of plot_report's panels."""
    for ax, ylabel in zip(axes, ("mean acceptance length (accepted drafts / step)",
                                 "tokens/s (median over prompts)",
                                 "seconds per answer, end to end (mean)")):
        ax.set_xlabel("Cactus δ (nats)")
        ax.set_ylabel(ylabel)
        if cactus_deltas:
            ax.set_xticks(cactus_deltas)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=7)


def _report_title(report: dict) -> str:
    """plot_report's title: the model files, the CPU, threads, tokens per answer, prompts."""
    models = report.get("models", {})
    title = " / ".join(m.get("file", "") for m in models.values())
    st = report["settings"]
    return (f"{title}  ({report['machine']['cpu']}, {st['n_threads']} threads, "
            f"n={st['n_predict']}, {st['n_prompts']} prompts)")


def pareto_points(report: dict) -> list[dict]:
    """The Pareto view's data, one point per speculative configuration: its family (sps, typical,
    topk, "cactus (target budget)", "cactus (output budget)", ngram...), k, δ, measured
    output KL (mean KL(P || q) per token, nats), acceptance length and median tokens/s."""
    return [{"family": _PARETO_NAMES.get(s["method"], s["method"]), "config": s["config"], "k": s["k"],
             "delta": s["delta"], "output_kl_mean": s.get("output_kl_mean"),
             "output_kl_max": s.get("output_kl_max"), "target_kl_mean": s["kl_mean"],
             "mean_accepted_length": s["mean_accepted_length"],
             "tokens_per_second": s["tokens_per_second"]["median"],
             "speedup_vs_none": s["speedup_vs_none"]}
            for s in report["summary"] if s["k"] is not None]


def _family_style(method: str) -> tuple[str, str]:
    """(colour, matplotlib format) of a family: its marker, joined by a line when its points
    are a δ sweep."""
    color, marker = FAMILY_STYLES.get(method, ("gray", "o"))
    return color, marker + ("-" if FAMILIES.get(method, {}).get("per_delta") else "")


def _label_points(ax, labels: list[tuple[float, float, str, str]], fontsize: float = 6) -> None:
    """Each (x, y, text, colour) as a label beside its point, moved up or down by a label's height
    until it overlaps no label placed before it (points at one place, or close, get their labels
    stacked instead of printed over each other). Call once the axes' data and size are final."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    placed = []
    for x, y, text, color in labels:
        note = ax.annotate(text, (x, y), textcoords="offset points", xytext=(4, 4),
                           fontsize=fontsize, color=color)
        step = 1.3 * fontsize
        for i in range(60):  # 4, then alternately above and below, a label's height apart
            note.xyann = (4, 4 + step * ((i + 1) // 2) * (1 if i % 2 else -1))
            box = note.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
        placed.append(note.get_window_extent(renderer))


def plot_pareto(report: dict, path: str | os.PathLike[str]) -> Path:
    """PNG: acceptance length (left) and tokens/s (right) against the measured output KL, one line
    per δ-family (points labelled with δ, labels never printed over each other), one marker per
    other rule (each family its own: FAMILY_STYLES); the verifier alone as a horizontal line on
    the right. Up and to the left is better: more acceptance per nat of real distortion. Raises
    ImportError with an install hint when matplotlib is missing."""
    plt = _pyplot()
    pts = pareto_points(report)
    fig, (ax_al, ax_tps) = plt.subplots(1, 2, figsize=(11, 4.2))
    methods = {v: k for k, v in _PARETO_NAMES.items()}
    labels: dict = {ax_al: [], ax_tps: []}
    for fam in dict.fromkeys(p["family"] for p in pts):
        for k in sorted({p["k"] for p in pts if p["family"] == fam}, key=k_order):
            line = sorted((p for p in pts if p["family"] == fam and p["k"] == k),
                          key=lambda p: (p["delta"] or 0.0))
            color, marker = _family_style(methods.get(fam, fam))
            label = fam + (f" k={k}" if len({p["k"] for p in pts}) > 1 else "")
            x = [p["output_kl_mean"] for p in line]
            for ax, key in ((ax_al, "mean_accepted_length"), (ax_tps, "tokens_per_second")):
                ax.plot(x, [p[key] for p in line], marker, color=color, label=label)
                labels[ax] += [(p["output_kl_mean"], p[key], f"δ={p['delta']:g}", color)
                               for p in line if p["delta"] is not None]
    for s in report["summary"]:
        if s["method"] == "none":
            ax_tps.axhline(s["tokens_per_second"]["median"], color="black", lw=1.8,
                           label="none (verifier alone)")
    for ax, ylabel in ((ax_al, "mean acceptance length (accepted drafts / step)"),
                       (ax_tps, "tokens/s (median over prompts)")):
        ax.set_xlabel("measured output KL, mean KL(P‖q) per token (nats)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=7)
    fig.tight_layout()  # the axes' final size: the labels are placed in points
    for ax, points in labels.items():
        _label_points(ax, points)
    st = report["settings"]
    warps = ", ".join(f"{k} {st[k]}" for k in ("temperature", "top_k", "top_p", "min_p") if k in st)
    fig.suptitle(f"acceptance per nat of real distortion ({warps}; {report['machine']['cpu']}, "
                 f"n={st['n_predict']}, {st['n_prompts']} prompts)", fontsize=8)
    return _save(plt, fig, path)


def plot_k(report: dict, path: str | os.PathLike[str]) -> Path | None:
    """PNG, two panels against the draft length: median tokens/s and mean seconds per answer
    (end to end), one line per configuration family over the fixed ks (δ the first of the grid
    for the Cactus families), and each ``k=auto`` configuration as a star at the mean length it
    drafted per step; the verifier alone as a horizontal line. Each family its own colour and
    marker (FAMILY_STYLES); the legends below the panels, where they hide no point. None when the
    run has fewer than two draft lengths (``auto`` counts as one). Raises ImportError with an
    install hint when matplotlib is missing."""
    summary = [s for s in report["summary"] if s["k"] is not None and not s.get("constrained")]
    if len({s["k"] for s in summary}) < 2:
        return None
    plt = _pyplot()
    n_entries = 2 * len({s["method"] for s in summary}) + 1  # a family's two, the verifier alone
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2 + 0.12 * n_entries))
    panels = ((axes[0], lambda s: s["tokens_per_second"]["median"], "tokens/s (median over prompts)"),
              (axes[1], _seconds_per_answer, "seconds per answer, end to end (mean)"))
    for ax, value, ylabel in panels:
        for fam in dict.fromkeys(s["method"] for s in summary):
            rows = [s for s in summary if s["method"] == fam]
            first_delta = rows[0]["delta"]
            rows = [s for s in rows if s["delta"] == first_delta and value(s) is not None]
            name = fam + (f" δ={first_delta:g}" if first_delta is not None else "")
            fixed = sorted((s for s in rows if s["k"] != "auto"), key=lambda s: s["k"])
            color, marker = FAMILY_STYLES.get(fam, ("gray", "o"))
            if fixed:
                ax.plot([s["k"] for s in fixed], [value(s) for s in fixed], marker + "-",
                        color=color, label=f"{name}, fixed k")
            for s in rows:
                if s["k"] == "auto":
                    ax.plot([s["mean_drafted_length"]], [value(s)], "*", ms=14, color=color,
                            markeredgecolor="black",
                            label=f"{name}, k=auto (at its mean drafted length)")
        for s in report["summary"]:
            if s["method"] == "none" and value(s) is not None:
                ax.axhline(value(s), color="black", lw=1.8, label="none (verifier alone)")
        ax.set_xlabel("draft length k (auto: mean tokens drafted per step)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14))  # below
    st = report["settings"]
    fig.suptitle(f"speed against draft length ({report['machine']['cpu']}, n={st['n_predict']}, "
                 f"{st['n_prompts']} prompts)", fontsize=8)
    return _save(plt, fig, path)


def plot_quality(report: dict, path: str | os.PathLike[str]) -> Path | None:
    """PNG: pass@1 with its 95% interval against acceptance length, one point per configuration
    that scored answers (none at AL 0). None when fewer than two configurations scored.

    Raises ImportError with a one-line install hint when matplotlib is missing.
    """
    points = [s for s in report["summary"] if s.get("n_scored")]
    if len(points) < 2:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for s in points:
        al = s["mean_accepted_length"] if s["k"] is not None else 0.0
        y = 100 * s["pass_at_1"]
        ci = s.get("pass_at_1_ci95") or [s["pass_at_1"]] * 2
        ax.errorbar([al], [y], yerr=[[y - 100 * ci[0]], [100 * ci[1] - y]], fmt="o", capsize=4,
                    color="black" if s["method"] == "none" else None, label=s["label"])
    none = next((s for s in points if s["method"] == "none"), None)
    if none is not None:
        ax.axhline(100 * none["pass_at_1"], color="black", lw=0.8, ls=":")
    n = max(s["n_scored"] for s in points)
    ax.set_xlabel("acceptance length AL (accepted drafts per verification step)")
    ax.set_ylabel("pass@1, % (95% Wilson interval)")
    ax.set_title(f"Task quality against acceptance, {n} problems")
    _legend(ax, fontsize=8, loc="lower center")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
