"""epoch_budget (frozen; about 2 h on 2 cores): is recipes.digits.train.epochs converged?

    python -m stages.epoch_budget --cells results/train --out results/evidence/epoch_budget

Trains the main grid's digits arms at half and double the recipe's budget (each a complete
run, every arm's seeds stacked as a cell's), reads the recipe's budget from the pipeline's own
cells (--cells), and checks on --check-inits that training that budget here gives the cells'
runs to the bit. Writes into --out: epochs.csv and epochs.md (the runs, tables and verdict),
cells_check.csv and cells_check.md (the check), and inputs.json, the DVC hash of every cell it
read (structinit.records: the reports quote the verdict only while those cells are unchanged).
The evidence itself is structinit/evidence/epoch_budget.py's; --report-only trains nothing:
it takes the cells' budget from --cells into epochs.csv again and rewrites the markdown from
the CSVs (the record is left as it is).

An interrupted run loses no finished epoch: each stacked run keeps its checkpoint under
.ckpt/evidence/epoch_budget/ (outside DVC's outputs, which DVC deletes before a stage runs;
STRUCTINIT_CKPT_DIR moves it), and the same command resumes there, reading back the runs that
had finished. STRUCTINIT_RESTART=1 discards them first. The folder goes once the results are
written.
"""
import argparse
import os
import shutil
import time
from pathlib import Path

import pandas as pd
import torch

from stages.common import (RESTART_VAR, requested_checkpoint_seconds, restart_requested, run_stage, write_json,
                           write_text)
from structinit import prepare_dataset
from structinit.records import RECORD, inputs_record
from structinit.evidence import epoch_budget as ev
from structinit.numerics import cpu_model
from structinit.pipeline import cells as cell_names
from structinit.pipeline.load import load_params
from structinit.reporting.budget import budget_finals
from structinit.reporting.presentation import init_label


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", type=Path, default=Path("results/train"), help="the pipeline's main-grid cells")
    ap.add_argument("--out", type=Path, default=Path("results/evidence/epoch_budget"))
    ap.add_argument("--budgets", type=int, nargs="+", help="default: half and double the recipe's epochs")
    ap.add_argument("--inits", nargs="+", default=ev.ARMS)
    ap.add_argument("--check-inits", nargs="*", default=["impulse3"],
                    help="arms trained here at the cells' budget and compared with them (cells_check)")
    ap.add_argument("--tolerance", type=float, default=1.0, help="points a doubling may move an arm's mean")
    ap.add_argument("--report-only", action="store_true", help="train nothing: rewrite the .md from the .csv")
    a = ap.parse_args()
    params = load_params()
    seeds = params["grid"]["seeds"]
    here = f"{cpu_model()}, {torch.get_num_threads()} threads"
    primary = cell_names.planned_contrast(params, params["contrasts"]["primary"])
    out = a.out
    if unknown := sorted(set(a.inits) - set(ev.ARMS)):
        ap.error(f"--inits {unknown}: not main-grid arms; choose among {ev.ARMS}")
    if a.report_only:                      # the cells' budget taken (again) from --cells, the rest kept
        for name in ("epochs", "cells_check"):
            if not (out / f"{name}.csv").exists():
                continue
            curves = pd.read_csv(out / f"{name}.csv")
            if name == "epochs":
                try:
                    curves = ev.with_cells(ev.with_source(curves), a.cells, list(dict.fromkeys(curves.init)),
                                           sorted(int(x) for x in set(curves.seed)))
                except FileNotFoundError as e:
                    ap.error(str(e))
                curves = curves.sort_values("budget", kind="stable").reset_index(drop=True)
                curves.to_csv(out / f"{name}.csv", index=False)
            write_text(out / f"{name}.md", ev.report(curves, a.tolerance, sorted(curves.seed.unique().tolist()),
                                                     False, here, ev.pipeline_check(curves, a.cells, a.tolerance),
                                                     primary))
        return
    if len(seeds) < 3:
        ap.error(f"grid.seeds {seeds}: the criterion needs at least 3 seeds")
    try:                                   # missing cells: said before any training
        cells_budget = int(ev.cells_curves(a.cells, a.inits, seeds).budget.iloc[0])
    except FileNotFoundError as e:
        ap.error(str(e))
    budgets = a.budgets or [cells_budget // 2, 2 * cells_budget]
    if cells_budget in budgets:
        ap.error(f"--budgets {budgets}: {cells_budget} is the cells' budget, read from {a.cells}")
    record = inputs_record("epoch_budget", [str(a.cells / cell_names.main_cell("digits", i)) for i in a.inits])
    data = prepare_dataset("digits")
    rec = params["recipes"]["digits"]
    every_s = requested_checkpoint_seconds()
    ckpt = Path(os.environ.get("STRUCTINIT_CKPT_DIR", ".ckpt")) / "evidence" / "epoch_budget"
    if restart_requested() and ckpt.exists():
        shutil.rmtree(ckpt)
        print(f"{RESTART_VAR}=1: discarded {ckpt}; every budget trains from its first epoch")
    elif ckpt.exists():
        print(f"resuming from {ckpt} where a run there matches this one (recipe, seeds, inits, code)")

    def train(budget_list, inits):
        frames = []
        for b in sorted(budget_list):
            t0 = time.perf_counter()
            frames.append(ev.run_budget(data, rec, inits, seeds, b, False, here, checkpoint_dir=ckpt,
                                        checkpoint_every_s=every_s))
            final = budget_finals(frames[-1])
            print(f"{b} epochs ({time.perf_counter() - t0:.0f} s): " + ", ".join(
                f"{init_label(i)} {g.test_acc.mean():.2f}" for i, g in final.groupby("init", sort=False)), flush=True)
        return pd.concat(frames, ignore_index=True)

    outputs = {}
    if a.check_inits:                       # first: the check is what makes the rest the pipeline's
        check = train([cells_budget], a.check_inits)
        outputs["cells_check"] = check
    curves = ev.with_cells(train(budgets, a.inits), a.cells, a.inits, seeds)
    outputs["epochs"] = curves.sort_values("budget", kind="stable").reset_index(drop=True)
    for name, frame in outputs.items():
        text = ev.report(frame, a.tolerance, seeds, False, here, ev.pipeline_check(frame, a.cells, a.tolerance),
                         primary)
        out.mkdir(parents=True, exist_ok=True)
        frame.to_csv(out / f"{name}.csv", index=False)
        write_text(out / f"{name}.md", text)
        print(text)
    write_json(out / RECORD, record)
    shutil.rmtree(ckpt, ignore_errors=True)      # every result is written: nothing left to resume


if __name__ == "__main__":
    run_stage(main)
