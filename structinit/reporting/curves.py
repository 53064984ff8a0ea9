"""Training curves: every seed's dvclive curves as one long table, and their mean and spread.

A trained seed's folder (results/train/<dataset>-<init>/seed<s>) holds dvclive's
plots/metrics/{train,test}/{acc,loss}.tsv, columns `step` and the value; step 0 is epoch 1.
The train curves have every epoch; the test curves only the evaluated ones (every
`eval_every` epochs), so test_* is empty (NaN) on the other epochs.

The long table has one row per (dataset, init, seed, epoch), accuracies in %, rounded to
DIGITS so that the CSV written from it is the same bytes on every run. Pure: paths in, frames
out; the figure is structinit/reporting/figures/curves.py, the DVC plot .dvc/plots/mean_band.json.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from structinit.pipeline.cells import main_cell, run_name, seed_dir
from structinit.errors import StructinitError
from structinit.io import write_atomic

METRICS = ("train_acc", "train_loss", "test_acc", "test_loss")
COLUMNS = ("dataset", "init", "seed", "epoch", *METRICS)
DIGITS = 4                      # 1e-4 % / 1e-4 nats: far below seed-to-seed differences


def _tsv(run: Path, split: str, name: str) -> Path:
    return run / "plots" / "metrics" / split / f"{name}.tsv"


def seed_run(results: str | Path, dataset: str, init: str, seed: int) -> Path:
    """One seed's dvclive folder, as the training stages write it."""
    return seed_dir(Path(results) / main_cell(dataset, init), seed)


def missing_runs(results: str | Path, runs: list[tuple[str, str, int]]) -> list[str]:
    """The (dataset, init, seed) runs lacking a curve file, named <dataset>-<init>-<seed> as in
    aggregate's errors."""
    return [run_name(main_cell(d, i), s) for d, i, s in runs
            if not all(_tsv(seed_run(results, d, i, s), m.split("_")[0], m.split("_")[1]).exists()
                       for m in METRICS)]


def read_run(run: str | Path) -> pd.DataFrame:
    """One seed's curves: columns epoch, train_acc, train_loss, test_acc, test_loss (acc in %),
    one row per epoch that has any value."""
    run = Path(run)
    frames = []
    for metric in METRICS:
        split, name = metric.split("_")
        path = _tsv(run, split, name)
        t = pd.read_csv(path, sep="\t")
        if list(t.columns) != ["step", name]:
            raise StructinitError(f"{path}: expected columns ['step', '{name}'] (dvclive), "
                                  f"found {list(t.columns)}")
        twice = sorted(t["step"][t["step"].duplicated()])
        if twice:
            raise StructinitError(f"{path}: step(s) {twice} logged twice: which value is the epoch's "
                                  "is ambiguous")
        scale = 100.0 if name == "acc" else 1.0      # the reports give accuracy in %
        frames.append(pd.DataFrame({"epoch": t["step"].astype(int) + 1,
                                    metric: t[name].astype(float) * scale}).set_index("epoch"))
    # outer join: train has every epoch, test only the evaluated ones (NaN elsewhere)
    return pd.concat(frames, axis=1, join="outer").sort_index().reset_index()


def long_table(results: str | Path, runs: list[tuple[str, str, int]]) -> pd.DataFrame:
    """Every (dataset, init, seed) run's curves, in the order given; StructinitError naming
    every missing run (no silent hole in a figure)."""
    missing = missing_runs(results, runs)
    if missing:
        raise StructinitError(f"missing training curves for {len(missing)} run(s) under "
                              f"{results}: {missing}")
    frames = [read_run(seed_run(results, d, i, s)).assign(dataset=d, init=i, seed=s)
              for d, i, s in runs]
    table = pd.concat(frames, ignore_index=True)[list(COLUMNS)]
    table[list(METRICS)] = table[list(METRICS)].round(DIGITS)
    return table


def write_csv(table: pd.DataFrame, path: str | Path) -> None:
    """The long table as CSV: fixed decimals, empty where an epoch was not evaluated."""
    write_atomic(path, lambda tmp: table.to_csv(tmp, index=False, float_format=f"%.{DIGITS}f"))


def mean_band(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Per (dataset, init, epoch): mean, sample std (ddof=1; 0 for one seed) and n over the
    seeds that have a value (evaluated epochs only, for test_*). The same statistics as the
    DVC plot (Vega-Lite's `mean` and `stdev`)."""
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r}: expected one of {METRICS}")
    valid = table.dropna(subset=[metric])
    g = valid.groupby(["dataset", "init", "epoch"], sort=False)[metric]
    out = g.agg(mean="mean", std="std", n="count").reset_index()
    out["std"] = out["std"].fillna(0.0)
    return out
