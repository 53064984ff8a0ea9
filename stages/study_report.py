"""<study>_report: one study's table under reports/, from its cells (and the main grid's).

    python -m stages.study_report {convmixer,pseudo_input,heads_width} --out reports/<table>.md
    python -m stages.study_report data_size --out reports/data_size.md --figures reports/figures/data_size

The report itself is structinit/reporting/study_reports.py's (one function per study).
"""
import argparse
from pathlib import Path

from stages.common import run_stage, write_conclusions, write_text
from structinit.pipeline.load import load_params
from structinit.reporting import stats
from structinit.reporting.budget import read_budget_finals
from structinit.reporting.study_reports import STUDY_REPORTS


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("study", choices=sorted(STUDY_REPORTS))
    ap.add_argument("--main", default="results/train")
    ap.add_argument("--studies", default="results/studies")
    ap.add_argument("--out", required=True)
    ap.add_argument("--figures", help="data_size: the folder of its figures, <dataset>.png")
    ap.add_argument("--epoch-budgets", default="results/evidence/epoch_budget",
                    help="the epoch_budget stage's folder: is the study's budget converged?")
    a = ap.parse_args()
    if (a.study == "data_size") != bool(a.figures):
        ap.error("--figures FOLDER goes with the data_size study, and only with it")
    params = load_params()
    with stats.recording_conclusions() as conclusions:
        text = STUDY_REPORTS[a.study](params, Path(a.main), Path(a.studies), Path(a.out),
                                      Path(a.figures) if a.figures else None,
                                      read_budget_finals(Path(a.epoch_budgets), params["studies"][a.study]["datasets"]))
    write_text(a.out, text)
    write_conclusions(a.out, stats.conclusions_record(Path(a.out).name, conclusions))
    print(text)


if __name__ == "__main__":
    run_stage(main)
