"""curves: every main-grid cell's training curves -> reports/curves.csv and one figure per
dataset (reports/figures/curves/<dataset>.png).

The expected runs are rebuilt from params.yaml as aggregate builds them (cells.main_runs:
grid.datasets × (grid.baselines + impulse<k> per grid.kernels) × grid.seeds), so a shrunk grid leaves
no stale rows and a missing run fails the stage, naming it. The CSV feeds `dvc plots show`
(the top-level plots of dvc.yaml, template .dvc/plots/mean_band.json).
"""
import argparse
from pathlib import Path

from stages.common import run_stage
from structinit.pipeline.load import load_params
from structinit.reporting import curves
from structinit.pipeline.cells import main_runs
from structinit.reporting.figures.curves import write_curves_figures


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default="results/train")
    ap.add_argument("--csv", default="reports/curves.csv")
    ap.add_argument("--figures", default="reports/figures/curves", help="folder: <dataset>.png")
    a = ap.parse_args()
    runs = main_runs(load_params())
    table = curves.long_table(Path(a.results), runs)
    curves.write_csv(table, a.csv)
    for path in write_curves_figures(table, a.figures):
        print(f"wrote {path}")
    print(f"wrote {a.csv}: {len(table)} rows ({len(runs)} runs)")


if __name__ == "__main__":
    run_stage(main)
