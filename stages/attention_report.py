"""attention_report: the analyze stages' outputs -> reports/attention.md and its figures.

    python -m stages.attention_report --analysis artifacts/analysis --out reports/attention.md \
        --figures reports/figures/attention

The report itself is structinit/reporting/attention_report.py's.
"""
import argparse
from pathlib import Path

from stages.common import run_stage, write_conclusions, write_text
from structinit.pipeline.load import load_params
from structinit.reporting import stats
from structinit.reporting.attention_report import attention_report


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--analysis", default="artifacts/analysis")
    ap.add_argument("--results", default="results/train", help="the trained cells (their logged dtype and CPU)")
    ap.add_argument("--out", default="reports/attention.md")
    ap.add_argument("--figures", default="reports/figures/attention")
    ap.add_argument("--epoch-budgets", default="results/evidence/epoch_budget",
                    help="the epoch_budget stage's folder: is the trained models' budget converged?")
    ap.add_argument("--gpu-analysis", default="results/analysis_gpu",
                    help="the GPU datasets' compact analyses (<dataset>.pt, stage analyze_gpu)")
    a = ap.parse_args()
    params = load_params()
    with stats.recording_conclusions() as conclusions:
        text = attention_report(params, Path(a.analysis), Path(a.results), Path(a.figures),
                                Path(a.epoch_budgets), Path(a.gpu_analysis))
    write_text(a.out, text)
    write_conclusions(a.out, stats.conclusions_record(Path(a.out).name, conclusions))
    print(text[:2000])


if __name__ == "__main__":
    run_stage(main)
