"""Accuracy and loss per epoch, one line per initializer: the mean over seeds, with a band of
±1 standard deviation over seeds (ddof=1, as the tables' "mean ± std"). One figure per
dataset, 2×2: train / test accuracy above, train / test loss below.

Input: the long table of structinit/reporting/curves.py (the one reports/curves.csv holds), so the PNG
and `dvc plots show` draw the same numbers.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from structinit.reporting.curves import mean_band
from structinit.reporting.figures.style import plt, write_per_dataset
from structinit.reporting.presentation import init_color, init_label

# (metric, panel title, y label), row by row: accuracies above, losses below
PANELS = (("train_acc", "train accuracy", "accuracy (%)"), ("test_acc", "test accuracy", "accuracy (%)"),
          ("train_loss", "train loss", "loss"), ("test_loss", "test loss", "loss"))


def curves_figure(table: pd.DataFrame, dataset: str):
    """The 2×2 figure of one dataset; initializers in the table's order (the grid's)."""
    rows = table[table.dataset == dataset]
    if rows.empty:
        raise ValueError(f"dataset={dataset!r}: no rows in the curves table "
                         f"(datasets there: {sorted(table.dataset.unique())})")
    inits = list(dict.fromkeys(rows.init))
    n_seeds = {i: rows[rows.init == i].seed.nunique() for i in inits}
    same_n = len(set(n_seeds.values())) == 1
    fig, axes = plt.subplots(2, 2, figsize=(7.6, 5.6), sharex=True)
    for ax, (metric, title, ylabel) in zip(axes.flat, PANELS):
        stats = mean_band(rows, metric)
        # the test set is seen only every eval_every epochs: mark those points, so that a
        # straight segment is not read as measured in between
        marker = "o" if metric.startswith("test") else None
        for init in inits:
            s = stats[stats.init == init].sort_values("epoch")
            color = init_color(init)
            ax.fill_between(s.epoch, s["mean"] - s["std"], s["mean"] + s["std"], color=color,
                            alpha=0.18, linewidth=0)
            ax.plot(s.epoch, s["mean"], color=color, marker=marker, markersize=3.5, linewidth=1.5,
                    label=init_label(init) + ("" if same_n else f" (n = {n_seeds[init]})"))
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, linewidth=0.5)
    for ax in axes[1]:
        ax.set_xlabel("epoch")
    seeds = f"n = {next(iter(n_seeds.values()))} seeds" if same_n else "n seeds in the legend"
    fig.suptitle(f"{dataset}: mean over seeds (line), ±1 std over seeds (band); {seeds}")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(inits), 5), frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.045, 1, 1))
    return fig


def write_curves_figures(table: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """<out_dir>/<dataset>.png for every dataset of the table; PNGs of datasets no longer in
    it are removed (a shrunk grid leaves no stale figure). Returns the paths written."""
    return write_per_dataset(table, curves_figure, out_dir)
