"""Comparison tables from per-cell results (pandas + tabulate). Pure: frames in, text out.

A cell is one trained run: (dataset, init, seed) with init one of the baselines or
"impulse<k>". Accuracy is the *final-epoch* test accuracy (no model selection on the test
set), in percent, as mean +- std over seeds (std with ddof=1; "n=1" when one seed).
"""
from __future__ import annotations

import pandas as pd
from tabulate import tabulate

# The paper's main table (method page, section 7), top-1 %.
PAPER_MAIN = {
    "kaiming_uniform": {"cifar10": 86.36, "cifar100": 63.50, "svhn": 94.51},
    "trunc_normal": {"cifar10": 88.63, "cifar100": 66.50, "svhn": 93.20},
    "mimetic": {"cifar10": 91.16, "cifar100": 70.40, "svhn": 97.53},
    "impulse3": {"cifar10": 91.62, "cifar100": 68.81, "svhn": 97.21},
    "impulse5": {"cifar10": 90.67, "cifar100": 70.46, "svhn": 97.23},
}
LABELS = {"kaiming_uniform": "Kaiming Uniform", "trunc_normal": "Trunc Normal", "mimetic": "Mimetic"}


def label(init: str) -> str:
    return LABELS.get(init) or f"Imp.-{init.removeprefix('impulse')}"


def seed_stats(cells: pd.DataFrame, value: str = "acc") -> pd.DataFrame:
    """(dataset, init) -> mean, std, n of `value` over seeds."""
    g = cells.groupby(["dataset", "init"], sort=False)[value]
    return pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1).fillna(0.0), "n": g.count()})


def _fmt(mean: float, std: float, n: int) -> str:
    return f"{mean:.2f} ± {std:.2f}" if n > 1 else f"{mean:.2f} (n=1)"


def main_table(cells: pd.DataFrame, datasets: list[str], inits: list[str], ours: str) -> str:
    """Rows = initializers, columns = datasets: ours (delta vs Trunc Normal) | paper."""
    stats = seed_stats(cells)
    rows = []
    for init in inits:
        row = [label(init) + (" (ours)" if init == ours else "")]
        for ds in datasets:
            s = stats.loc[(ds, init)]
            base = stats.loc[(ds, "trunc_normal"), "mean"] if (ds, "trunc_normal") in stats.index else None
            cell = _fmt(s["mean"], s["std"], int(s["n"]))
            if base is not None and init != "trunc_normal":
                cell += f" ({s['mean'] - base:+.2f})"
            paper = PAPER_MAIN.get(init, {}).get(ds)
            row += [cell, f"{paper:.2f}" if paper is not None else "—"]
        rows.append(row)
    headers = ["Method"] + [h for ds in datasets for h in (f"{ds} (ours)", f"{ds} (paper)")]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def kernel_table(cells: pd.DataFrame, preopt: pd.DataFrame, datasets: list[str],
                 kernels: list[int], ours_kernel: int) -> str:
    stats = seed_stats(cells)
    rows = []
    for ds in datasets:
        base = stats.loc[(ds, "trunc_normal"), "mean"] if (ds, "trunc_normal") in stats.index else None
        for k in kernels:
            s = stats.loc[(ds, f"impulse{k}")]
            p = preopt[(preopt.dataset == ds) & (preopt.kernel == k)]
            rows.append([ds, k, "yes" if k == ours_kernel else "", _fmt(s["mean"], s["std"], int(s["n"])),
                         f"{s['mean'] - base:+.2f}" if base is not None else "—",
                         f"{p.target_mass.mean():.3f}", f"{p.loss.mean():.5f}"])
    return tabulate(rows, headers=["dataset", "kernel", "ours", "test acc %", "Δ vs Trunc Normal",
                                   "init target mass", "init fit (MSE)"],
                    tablefmt="github", disable_numparse=True)


def preopt_table(preopt: pd.DataFrame) -> str:
    rows = [[r.dataset, r.kernel, r.seed, r.solver, f"{r.solve_seconds:.3f}", f"{r.loss:.5f}",
             f"{r.target_mass:.3f}", r.solves] for r in preopt.itertuples()]
    return tabulate(rows, headers=["dataset", "kernel", "seed", "solver", "solve s", "fit (MSE)",
                                   "target mass", "solves"], tablefmt="github", disable_numparse=True)


def summary(cells: pd.DataFrame, datasets: list[str], inits: list[str], ours: str) -> dict:
    """Headline numbers for `dvc metrics show/diff`: per dataset, each init's mean and
    std, and `ours` (the structured init at init.kernel) with its delta to Trunc Normal."""
    stats = seed_stats(cells)
    out: dict = {}
    for ds in datasets:
        d = {init: {"acc": round(stats.loc[(ds, init), "mean"], 3), "std": round(stats.loc[(ds, init), "std"], 3)}
             for init in inits}
        d["ours"] = {"init": ours, **d[ours]}
        if "trunc_normal" in d:
            d["ours"]["delta_vs_trunc_normal"] = round(d[ours]["acc"] - d["trunc_normal"]["acc"], 3)
        out[ds] = d
    return out


# --- the paper's other studies (method page, sections 6-7) ------------------------------

# ConvMixer on CIFAR-10 (secondary quotes): size -> mode -> top-1 %.
PAPER_CONVMIXER = {"cm512d6k3": {"learned": 92.82, "random": 92.2, "impulse": 92.2},
                   "cm256d8k3": {"learned": 91.76}}
# CIFAR-100 by shape (secondary quotes): shape -> init -> top-1 %.
PAPER_HEADS_WIDTH = {"vit_s_h6": {"trunc_normal": 66.81, "mimetic": 73.86, "impulse3": 75.97},
                     "vit_s_h16": {"trunc_normal": 67.25, "mimetic": 72.72, "impulse3": 75.40}}
# CIFAR-10 pseudo-input ablation: PE for every layer, shared Q/K.
PAPER_PSEUDO_INPUT = {"PP": 90.75}


def study_table(cells: pd.DataFrame, row_key: str, col_key: str, rows: list, cols: list,
                paper: dict | None = None, paper_dataset: str | None = None,
                row_label=str, col_label=str) -> str:
    """Mean ± std table: per dataset, one row per `row_key` value and one column per
    `col_key` value; on `paper_dataset`, the paper's number in brackets where it has one."""
    out = []
    for ds in cells.dataset.unique():
        sub = cells[cells.dataset == ds]
        g = sub.groupby([row_key, col_key])["acc"]
        stats = pd.DataFrame({"mean": g.mean(), "std": g.std(ddof=1).fillna(0.0), "n": g.count()})
        for r in rows:
            line = [ds, row_label(r)]
            for c in cols:
                s = stats.loc[(r, c)]
                txt = _fmt(s["mean"], s["std"], int(s["n"]))
                ref = (paper or {}).get(r, {}).get(c) if ds == paper_dataset else None
                line.append(txt + (f" [paper {ref:.2f}]" if ref is not None else ""))
            out.append(line)
    return tabulate(out, headers=["dataset", row_key] + [col_label(c) for c in cols],
                    tablefmt="github", disable_numparse=True)
