"""The main result in one figure per dataset (reports/figures/main/<dataset>.png).

Left: each seed's final test accuracy per initializer, a thin line joining the same seed across
the arms (the comparison is paired by seed: parallel lines = a consistent difference, crossing
lines = one that the seeds do not agree on), the mean as a short bar, and the paper's number
as a cross where the dataset is one of the paper's. Right, where the epoch evidence measured
this dataset and is fresh (results/evidence/epoch_budget): each arm's mean final accuracy against the epoch
budget, the default's budget marked, so a reader sees what a shorter run would have said; its
title names the CPU and dtype the budgets ran with (several, if they differ).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from structinit.reporting import paper
from structinit.reporting.figures.style import plt, save_figure
from structinit.reporting.presentation import init_color, init_label


def main_figure(runs: pd.DataFrame, dataset: str, inits: list[str], budgets: pd.DataFrame | None = None,
                epochs: int | None = None):
    """runs: dataset, init, seed, acc (%), one row per trained run. budgets: the epoch
    evidence's final accuracies (init, budget, seed, test_acc) on this dataset, or None."""
    rows = runs[runs.dataset == dataset]
    inits = [i for i in inits if i in set(rows.init)]
    with_budgets = budgets is not None and not budgets.empty
    fig, axes = plt.subplots(1, 2 if with_budgets else 1, figsize=(10.5 if with_budgets else 6, 4.2),
                             squeeze=False, gridspec_kw={"width_ratios": [1.3, 1]} if with_budgets else None)
    ax = axes[0, 0]
    x = {init: k for k, init in enumerate(inits)}
    for _, g in rows.groupby("seed"):
        g = g.set_index("init").reindex(inits)
        ax.plot(range(len(inits)), g.acc, color="0.55", linewidth=0.8, alpha=0.8, zorder=1)
    for init in inits:
        acc = rows[rows.init == init].acc
        ax.scatter([x[init]] * len(acc), acc, color=init_color(init), s=22, zorder=3, edgecolors="white",
                   linewidths=0.5)
        ax.hlines(acc.mean(), x[init] - 0.22, x[init] + 0.22, color="black", linewidth=2, zorder=4)
        quoted = paper.MAIN.get(init, {}).get(dataset)
        if quoted is not None:
            ax.scatter([x[init] + 0.3], [quoted], marker="x", color="black", s=30, zorder=4,
                       label="paper" if init == next(i for i in inits if i in paper.MAIN) else None)
    ax.set_xticks(range(len(inits)), [init_label(i) for i in inits], rotation=20, ha="right")
    ax.set_ylabel("final test accuracy (%)")
    n = rows.seed.nunique()
    ax.set_title(f"{dataset}: final accuracy of each seed (n = {n});\na grey line joins one seed's arms, bar = mean")
    ax.grid(axis="y", alpha=0.3, linewidth=0.5)
    if dataset in paper.DATASETS:
        ax.legend(frameon=False, loc="lower right")
    if with_budgets:
        ax = axes[0, 1]
        for init in [i for i in inits if i in set(budgets.init)]:
            b = budgets[budgets.init == init].groupby("budget").test_acc.agg(["mean", "std"]).reset_index()
            ax.errorbar(b.budget, b["mean"], yerr=b["std"], color=init_color(init), marker="o", markersize=3.5,
                        linewidth=1.3, capsize=2, label=init_label(init))
        if epochs is not None:
            ax.axvline(epochs, color="black", linewidth=0.8, linestyle="--")
            ax.annotate(f"this run: {epochs} epochs", (epochs, ax.get_ylim()[0]), xytext=(3, 4),
                        textcoords="offset points", fontsize=8)
        ax.set_xscale("log", base=2)
        ticks = sorted(budgets.budget.unique())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("epoch budget (each a complete run)")
        ax.set_ylabel("final test accuracy (%)")
        seeds = budgets.seed.nunique()
        ax.set_title("mean final accuracy against the epoch budget\n"
                     f"(stage epoch_budget; n = {seeds} seeds, bars ± std)\n{budget_machines(budgets)}",
                     fontsize=9)
        ax.grid(alpha=0.3, linewidth=0.5)
        ax.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))  # off the lines
    fig.tight_layout()
    return fig


def budget_machines(budgets: pd.DataFrame) -> str:
    """Where the panel's runs ran: "AMD EPYC, bf16" when one CPU and dtype ran every budget
    (budgets from several CPUs compare kernels too, so the panel says so)."""
    if "cpu" not in budgets or budgets.cpu.isna().all():
        return "CPU not recorded"
    dtype = budgets.dtype.fillna("?") if "dtype" in budgets else pd.Series("?", index=budgets.index)
    where = sorted({f"{str(c).split(',')[0]}, {d}" for c, d in zip(budgets.cpu.fillna("CPU not recorded"), dtype)})
    return where[0] if len(where) == 1 else f"{len(where)} CPUs/dtypes: " + "; ".join(where)


def write_main_figures(runs: pd.DataFrame, datasets: list[str], inits: list[str], out_dir: str | Path,
                       budgets: dict[str, pd.DataFrame] | None = None,
                       epochs: dict[str, int] | None = None) -> list[Path]:
    """<out_dir>/<dataset>.png per dataset; PNGs of datasets no longer in the grid are removed.
    budgets / epochs: per dataset, the epoch evidence's finals and the budget that ran."""
    out_dir = Path(out_dir)
    paths = [out_dir / f"{d}.png" for d in datasets]
    for d, path in zip(datasets, paths):
        save_figure(main_figure(runs, d, inits, (budgets or {}).get(d), (epochs or {}).get(d)), path)
    for stale in set(out_dir.glob("*.png")) - set(paths):
        stale.unlink()
    return paths
