"""The benchmark plots (bench/plot.py) read back from their figures (issue 52): every configuration
family has its own marker (``mtp`` and ``mtp-sps`` shared one), δ labels are never printed over
each other in the Pareto view, and the k plot's legend covers no point."""
from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from cactus_gguf.bench import plot  # noqa: E402
from cactus_gguf.bench.grid import FAMILIES  # noqa: E402


def _row(method, k, delta=None, al=2.0, tps=10.0, kl=0.0, seconds=1.0, drafted=None):
    return {"method": method, "config": f"{method}-d{delta}-k{k}", "label": method, "k": k,
            "delta": delta, "output_kl_mean": kl, "output_kl_max": kl, "kl_mean": kl,
            "mean_accepted_length": al, "tokens_per_second": {"median": tps, "q25": tps,
                                                              "q75": tps},
            "speedup_vs_none": 1.0, "per_answer": {"seconds": seconds},
            "mean_drafted_length": drafted if drafted is not None else k}


def _report(summary):
    return {"summary": summary, "machine": {"cpu": "cpu"}, "models": {},
            "settings": {"n_predict": 16, "n_prompts": 2, "n_threads": 1, "temperature": 0.8}}


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions save, kept open to be read."""
    saved = []

    def keep(plt, fig, path):
        fig.tight_layout()
        fig.canvas.draw()
        saved.append(fig)
        return path

    monkeypatch.setattr(plot, "_save", keep)
    yield saved
    import matplotlib.pyplot as plt

    for fig in saved:
        plt.close(fig)


SPECULATIVE = [f for f, fam in FAMILIES.items() if fam["acceptance"] is not None]


def test_every_family_has_its_own_marker():
    assert set(SPECULATIVE) == set(plot.FAMILY_STYLES)  # none / draft: horizontal lines
    markers = [plot.FAMILY_STYLES[f][1] for f in SPECULATIVE]
    assert len(set(markers)) == len(markers) and "*" not in markers  # "*": k=auto's star
    assert len({plot.FAMILY_STYLES[f][0] for f in SPECULATIVE}) == len(SPECULATIVE)


def test_mtp_and_mtp_sps_are_told_apart_in_both_plots(figures, tmp_path):
    rows = [_row(m, k, al=al, tps=tps) for m, al, tps in (("mtp", 2.0, 10.0),
                                                           ("mtp-sps", 1.5, 9.0))
            for k in (2, 4)]
    plot.plot_pareto(_report(rows), tmp_path / "p.png")
    plot.plot_k(_report(rows), tmp_path / "k.png")
    for fig in figures:
        for ax in fig.axes:
            style = {line.get_label().split(",")[0].split(" k=")[0]: line.get_marker()
                     for line in ax.get_lines() if not line.get_label().startswith("_")}
            assert style["mtp"] == ">" and style["mtp-sps"] == "d", style


def test_delta_labels_are_never_printed_over_each_other(figures, tmp_path):
    # δ 0.5 and 1 land on one point; δ 2 and 4 a hair apart; the output budget beside them
    rows = [_row("cactus", 4, d, al=al, tps=tps, kl=kl) for d, al, tps, kl in (
        (0.5, 2.0, 10.0, 0.01), (1.0, 2.0, 10.0, 0.01), (2.0, 2.5, 11.0, 0.05),
        (4.0, 2.51, 11.02, 0.051))]
    rows += [_row("cactus-output", 4, d, al=al, tps=tps, kl=0.01) for d, al, tps in (
        (0.5, 2.01, 10.01), (1.0, 2.02, 10.02))]
    plot.plot_pareto(_report(rows), tmp_path / "p.png")
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts]
        assert len(boxes) == len(rows)
        for i, (a, box_a) in enumerate(boxes):
            for b, box_b in boxes[i + 1:]:
                assert not box_a.overlaps(box_b), (a, b)


def test_the_k_plots_legend_covers_no_point(figures, tmp_path):
    rows = []
    for j, m in enumerate(("cactus", "sps", "typical", "ngram", "hybrid", "mtp", "mtp-sps")):
        rows += [_row(m, k, 1.0 if FAMILIES[m]["per_delta"] else None, tps=5.0 + k + j,
                      seconds=3.0 - 0.2 * k + 0.1 * j) for k in (1, 2, 4, 8)]
        rows.append(_row(m, "auto", 1.0 if FAMILIES[m]["per_delta"] else None, tps=20.0 - j,
                         seconds=0.5 + 0.1 * j, drafted=1.0 + j))
    rows.append(_row("none", None, tps=6.0, seconds=2.5))
    assert plot.plot_k(_report(rows), tmp_path / "k.png") is not None
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend().get_window_extent(renderer)
        assert not legend.overlaps(ax.get_window_extent(renderer))  # outside the panel
