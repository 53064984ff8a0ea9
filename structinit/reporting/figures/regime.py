"""The regime study's figure: accuracy against how sharp each arm's attention prior is. One point
per arm at its mean mass on the heads' offsets at init (on test images; log x), its mean over
seeds with the 95 % t-interval, each seed a circle; left the final test accuracy, right the
test accuracy at the speed endpoint's epoch.

Input: regime_report.regime_runs's rows (arm, seed, images_at_init, acc, speed_acc).
"""
from __future__ import annotations

import math

import pandas as pd

from structinit.reporting.figures.style import plt
from structinit.reporting.presentation import init_color
from structinit.reporting.stats import summarize


def regime_figure(runs: pd.DataFrame, label, dataset: str, epochs: int, speed_epoch: int | None = None):
    """label(arm) -> its name in the legend; arms in the rows' order."""
    if runs.empty:
        raise ValueError("no runs to draw")
    panels = [("acc", f"final test accuracy (%), epoch {epochs}")]
    if speed_epoch is not None and "speed_acc" in runs:
        panels.append(("speed_acc", f"test accuracy (%) at epoch {speed_epoch}"))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 2.2, 3.6), squeeze=False)
    arms = list(dict.fromkeys(runs.arm))
    for ax, (column, ylabel) in zip(axes[0], panels):
        for arm in arms:
            g = runs[runs.arm == arm]
            if g.images_at_init.isna().all():
                continue                                    # no mass measured: no place on the x axis
            x, s, color = float(g.images_at_init.mean()), summarize(g[column].tolist(), bounded=True), init_color(arm)
            below, above = ((s.mean - s.ci_low, s.ci_high - s.mean) if s.n > 1 and not math.isnan(s.ci_low)
                            else (0.0, 0.0))
            ax.errorbar([x], [s.mean], yerr=[[below], [above]], color=color, marker="o", markersize=5, capsize=3,
                        linewidth=1.5, label=f"{label(arm)} (n = {s.n})")
            ax.scatter(g.images_at_init, g[column], s=14, facecolors="none", edgecolors=color, linewidths=0.9,
                       alpha=0.8, zorder=3)
        ax.set_xscale("log")
        ax.set_xlabel("mass on the heads' offsets at init, test images (log scale)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, linewidth=0.5)
    axes[0][0].set_title(f"{dataset}: accuracy against the sharpness of the attention prior\n"
                         "mean over seeds with 95 % t-interval; circles: single seeds", loc="left")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
    fig.tight_layout()
    return fig
