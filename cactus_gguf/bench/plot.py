"""The benchmark plot: acceptance length and tokens/s against δ (matplotlib, optional)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["plot_report"]


def plot_report(report: dict, path: str | os.PathLike[str]) -> Path:
    """PNG: acceptance length and tokens/s against δ for Cactus (one line per k; tokens/s with its
    q25-q75 as error bars), with sps, none and the other configurations as horizontal lines.

    Raises ImportError with a one-line install hint when matplotlib is missing.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the plot needs matplotlib: pip install 'cactus-gguf[bench]'") from None
    summary = report["summary"]
    ks = sorted({s["k"] for s in summary if s["k"] is not None})
    fig, (ax_al, ax_tps) = plt.subplots(1, 2, figsize=(11, 4.2))
    cactus_deltas = sorted({s["delta"] for s in summary if s["method"] == "cactus"})
    # Cactus: one colour and marker per k. References: one colour per method, one style per k.
    k_colors, k_markers = ["tab:blue", "tab:cyan", "navy", "tab:purple"], "os^D"
    k_styles = ["--", ":", "-.", (0, (5, 1))]
    ref_colors = {"sps": "tab:orange", "typical": "tab:green", "topk": "tab:brown", "ngram": "tab:red"}
    for s in summary:  # drawn first, so that a method on the same value stays visible on top
        if s["method"] == "none":
            ax_tps.axhline(s["tokens_per_second"]["median"], color="black", lw=2.2,
                           label="none (verifier alone)")
    for i, k in enumerate(ks):
        color, ksuf = k_colors[i % len(k_colors)], (f" k={k}" if len(ks) > 1 else "")
        cac = sorted((s for s in summary if s["method"] == "cactus" and s["k"] == k),
                     key=lambda s: s["delta"])
        if cac:
            d = [s["delta"] for s in cac]
            marker = k_markers[i % len(k_markers)] + "-"
            ax_al.plot(d, [s["mean_accepted_length"] for s in cac], marker, color=color,
                       label=f"cactus{ksuf}")
            med = [s["tokens_per_second"]["median"] for s in cac]
            ax_tps.errorbar(d, med, yerr=[[m - s["tokens_per_second"]["q25"] for m, s in zip(med, cac)],
                                          [s["tokens_per_second"]["q75"] - m for m, s in zip(med, cac)]],
                            fmt=marker, color=color, capsize=4, label=f"cactus{ksuf} (bars: q25-q75)")
        for s in summary:
            if s["k"] == k and s["method"] in ref_colors:
                style = dict(color=ref_colors[s["method"]], ls=k_styles[i % len(k_styles)], lw=1.4,
                             label=s["label"])
                ax_al.axhline(s["mean_accepted_length"], **style)
                ax_tps.axhline(s["tokens_per_second"]["median"], **style)
    for ax, ylabel in ((ax_al, "mean acceptance length (accepted drafts / step)"),
                       (ax_tps, "tokens/s (median over prompts)")):
        ax.set_xlabel("Cactus δ (nats)")
        ax.set_ylabel(ylabel)
        if cactus_deltas:
            ax.set_xticks(cactus_deltas)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    models = report.get("models", {})
    title = " / ".join(m.get("file", "") for m in models.values())
    fig.suptitle(f"{title}  ({report['machine']['cpu']}, {report['settings']['n_threads']} threads, "
                 f"n={report['settings']['n_predict']}, {report['settings']['n_prompts']} prompts)",
                 fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


