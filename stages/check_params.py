"""check_params: params.yaml against its schema (structinit/pipeline/params.py), on every change to it.

The pipeline's first stage: every other stage depends on its output, so a bad value anywhere in
the file stops `dvc repro` here, in seconds, before any download, solve or training. The output
is the same line whatever the params are, so a valid edit re-runs only the stages that read
the changed keys; the other stages read params.yaml as it is and never import the schema.
"""
import argparse

from stages.common import run_stage, write_text
from structinit.pipeline.params import ParamsError, check_params_file

CHECKED = "params.yaml passed its schema (structinit/pipeline/params.py)\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, help="a file every stage depends on; its bytes never change")
    a = ap.parse_args()
    try:
        check_params_file()
    except ParamsError as e:
        raise SystemExit(f"error: {e}") from None
    write_text(a.out, CHECKED)
    print("params.yaml: valid")


if __name__ == "__main__":
    run_stage(main)
