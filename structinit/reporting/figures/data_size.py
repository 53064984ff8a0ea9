"""Final test accuracy against training-set size, one line per initializer: the mean over
seeds with its 95 % t-interval (the tables' "95% CI"), and each seed as a dot. One figure per
dataset; the x axis is the number of training images (log scale), ticked at the sizes that
ran, with their share of the main grid's training set.

Input: the data-size report's cells (structinit/reporting/study_reports.py): one row per run with dataset,
init, train_images, fraction, acc (%), steps.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from structinit.data.specs import DATASETS
from structinit.reporting.tables import size_label
from structinit.reporting.stats import summarize

from structinit.reporting.figures.style import plt, write_per_dataset
from structinit.reporting.presentation import init_color, init_label

# Each initializer's points are shifted by this factor per position (log x), so that error
# bars at the same size do not hide one another; its seeds' dots sit just right of its bar.
DODGE = 1.06
SEED_SHIFT = 1.018


def data_size_figure(cells: pd.DataFrame, dataset: str):
    """The figure of one dataset; initializers in the cells' order."""
    rows = cells[cells.dataset == dataset]
    if rows.empty:
        raise ValueError(f"dataset={dataset!r}: no cells (datasets there: {sorted(cells.dataset.unique())})")
    inits = list(dict.fromkeys(rows.init))
    sizes = rows.groupby("train_images").fraction.first().sort_index()
    fig, ax = plt.subplots(figsize=(6.8, 3.8))
    for k, init in enumerate(inits):
        cell = rows[rows.init == init]
        shift = DODGE ** (k - (len(inits) - 1) / 2)
        stats = [(n, summarize(g.acc, bounded=True)) for n, g in cell.groupby("train_images")]
        x = [n * shift for n, _ in stats]
        mean = [s.mean for _, s in stats]
        low = [s.mean - s.ci_low if s.n > 1 else 0 for _, s in stats]
        high = [s.ci_high - s.mean if s.n > 1 else 0 for _, s in stats]
        n_seeds = sorted({s.n for _, s in stats})
        color = init_color(init)
        ax.errorbar(x, mean, yerr=[low, high], color=color, marker="o", markersize=4, linewidth=1.5,
                    capsize=3, label=f"{init_label(init)} (n = {', '.join(map(str, n_seeds))})")
        ax.scatter(cell.train_images * shift * SEED_SHIFT, cell.acc, s=16, facecolors="none",
                   edgecolors=color, linewidths=0.9, alpha=0.8, zorder=3)
    if dataset in DATASETS:                       # where "no better than guessing" lies
        chance = 100 / DATASETS[dataset].num_classes
        ax.axhline(chance, color="#7f7f7f", linestyle=":", linewidth=1, label=f"chance ({chance:.3g} %)")
    ax.set_xscale("log")
    ax.set_xticks(list(sizes.index), [size_label(n, f).replace(" (", "\n(") for n, f in sizes.items()])
    ax.minorticks_off()
    ax.set_xlim(sizes.index.min() / 1.3, sizes.index.max() * 1.3)
    ax.set_xlabel("training images (log scale; % of the main grid's training set)")
    ax.set_ylabel("final test accuracy (%)")
    ax.grid(alpha=0.3, linewidth=0.5)
    steps = sorted(rows.steps.unique())
    held = (f"{steps[0]:,} optimizer steps per run" if len(steps) == 1
            else f"optimizer steps {min(steps):,}-{max(steps):,}")
    ax.set_title(f"{dataset}: accuracy vs training-set size, {held}\n"
                 "mean over seeds with 95 % t-interval; circles: single seeds")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)   # never over the data
    fig.tight_layout()
    return fig


def write_data_size_figures(cells: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """<out_dir>/<dataset>.png for every dataset of the cells; PNGs of datasets no longer in
    them are removed (a shrunk study leaves no stale figure). Returns the paths written."""
    return write_per_dataset(cells, data_size_figure, out_dir)
