"""regime_report@<dataset>: the regime study's table (beyond the paper), from its cells and the
main grid's (structinit/reporting/regime_report.py).

    python -m stages.regime_report --dataset <dataset> --out reports/regime_<dataset>.md \
        --figure reports/figures/regime_<dataset>.png

Off the default (studies.regime.datasets: []); the frozen `regime` stage (stages/regime.py) runs the study in a copy.
"""
import argparse
from pathlib import Path

from stages.common import run_stage, write_conclusions, write_text
from structinit.pipeline.load import load_params
from structinit.reporting import stats
from structinit.reporting.regime_report import regime_report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--main", default="results/train", help="the main grid's cells (the reused seeds)")
    ap.add_argument("--studies", default="results/studies/regime", help="the study's own cells")
    ap.add_argument("--analysis", default="artifacts/analysis", help="every cell's attention analysis")
    ap.add_argument("--out", required=True)
    ap.add_argument("--figure", help="where to draw accuracy against the prior's sharpness (a .png)")
    a = ap.parse_args()
    params = load_params()
    with stats.recording_conclusions() as conclusions:
        text = regime_report(params, a.dataset, Path(a.main), Path(a.studies), Path(a.analysis),
                             Path(a.figure) if a.figure else None)
    write_text(a.out, text)
    write_conclusions(a.out, stats.conclusions_record(Path(a.out).name, conclusions))
    print(text)


if __name__ == "__main__":
    run_stage(main)
