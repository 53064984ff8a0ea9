"""reports_index: reports/README.md, the index of every table and figure the pipeline wrote
(structinit/reporting/index.py). It runs after every report stage (it depends on their outputs).
"""
import argparse
from pathlib import Path

from stages.common import run_stage, write_text
from structinit.pipeline.load import load_params
from structinit.reporting.index import build_index


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reports", default="reports")
    a = ap.parse_args()
    params = load_params()
    text = build_index(Path(a.reports), params["grid"]["datasets"],
                       {study: s["datasets"] for study, s in params["studies"].items()})
    write_text(Path(a.reports) / "README.md", text)


if __name__ == "__main__":
    run_stage(main)
