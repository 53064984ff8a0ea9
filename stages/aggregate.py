"""aggregate: every cell of the current grid -> reports/ (tables, summary.json, cells.csv).

The reports are structinit/reporting/main_report.py's; the per-epoch curves (reports/curves.csv,
figures) are the `curves` stage's (stages/curves.py).
"""
import argparse
from pathlib import Path

from stages.common import run_stage, write_conclusions, write_json, write_text
from structinit.pipeline.load import load_params
from structinit.reporting.main_report import main_reports


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", default="results/train")
    ap.add_argument("--preopt", default="results/preopt")
    ap.add_argument("--reference", default="results/reference", help="reference_solve records")
    ap.add_argument("--out", default="reports")
    ap.add_argument("--figures", default="reports/figures/main", help="the main figure, <dataset>.png")
    ap.add_argument("--epoch-budgets", default="results/evidence/epoch_budget",
                    help="the epoch_budget stage's folder, drawn beside the main figure where it has the dataset "
                         "and is fresh")
    ap.add_argument("--replication", default="results/evidence/replication",
                    help="the replication stage's folder: its primary contrasts, quoted in the headline where "
                         "they replicated this run's and are fresh")
    a = ap.parse_args()
    reports = main_reports(load_params(), Path(a.results), Path(a.preopt), Path(a.reference), Path(a.figures),
                           Path(a.epoch_budgets), Path(a.replication))
    out = Path(a.out)
    for name, text in reports.texts.items():
        write_text(out / name, text)
    for name, record in reports.conclusions.items():
        write_conclusions(out / name, record)
    write_json(out / "summary.json", reports.summary)
    reports.runs.to_csv(out / "cells.csv", index=False, float_format="%.3f")
    print(reports.texts["main_table.md"])


if __name__ == "__main__":
    run_stage(main)
