"""The main grid's reports: main_table.md, kernel_table.md, preopt_table.md, their
conclusions, summary.json (the headline for `dvc metrics diff`) and cells.csv, from every cell
of the current grid.

The expected cells are rebuilt from params.yaml, so a grid that shrinks leaves no stale
rows, and a missing cell fails, naming it (no silent holes in a table).
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from structinit.pipeline import cells
from structinit.pipeline.cells import impulse_init, main_cell, run_name, seed_dir, solve_cell
from structinit.reporting import paper, stats
from structinit.reporting import tables as report
from structinit.reporting.presentation import init_label
from structinit.reporting.runs import ran_with, read_cell


@dataclass
class MainReports:
    texts: dict          # file name -> markdown
    conclusions: dict    # file name -> its conclusions record (stats.conclusions_record)
    summary: dict        # summary.json
    runs: pd.DataFrame   # cells.csv: one row per trained run


def main_reports(params: dict, results: Path, preopt: Path, reference: Path) -> MainReports:
    """results: the trained cells; preopt / reference: the Q/K solves' and the official
    solver's records (stages preoptimize and reference_solve)."""
    results, preopt, reference = Path(results), Path(preopt), Path(reference)
    grid, kernel = params["grid"], params["init"]["kernel"]
    if kernel not in grid["kernels"]:
        raise SystemExit(f"init.kernel={kernel} is not in grid.kernels={grid['kernels']}: the headline "
                  f"('ours') must be a trained cell. Run e.g. dvc exp run -S init.kernel={kernel} "
                  f"-S 'grid.kernels={sorted(set(grid['kernels']) | {kernel})}'")
    inits, ours = cells.main_inits(params), impulse_init(kernel)
    expected = cells.main_runs(params)
    missing = [run_name(main_cell(d, i), s) for d, i, s in expected
        if not (seed_dir(results / main_cell(d, i), s) / "metrics.json").exists()]
    if missing:
        raise SystemExit(f"missing results for {len(missing)} run(s) (cell-seed): {missing}")
    runs = pd.DataFrame([{"dataset": d, "init": i, "seed": s,
                    **read_cell(results / main_cell(d, i), s)[0]} for d, i, s in expected])
    solves = list(itertools.product(grid["datasets"], grid["kernels"], grid["seeds"]))

    def record(folder, d, k, s):
        return json.loads(seed_dir(folder / solve_cell(d, k), s).with_suffix(".json").read_text())
    preopt_runs = pd.DataFrame([record(preopt, *solve) for solve in solves])
    reference_runs = [record(reference, *solve) for solve in solves]
    preopt_runs["official_target_mass"] = [r["target_mass"] for r in reference_runs]
    preopt_runs["official_fit_mse"] = [r["fit_mse"] for r in reference_runs]

    texts = {}
    run = report.what_ran(params, grid["datasets"], grid["seeds"], ran_with(
        seed_dir(results / main_cell(d, i), s) for d, i, s in expected))
    comparisons = report.pairwise_comparisons(runs, "init")
    with stats.recording_conclusions() as main_conclusions:
        main_block = stats.conclusions_block(comparisons, init_label)
    kernel_cmp = report.pairwise_comparisons(runs[runs.init.map(cells.impulse_kernel).notna()], "init")
    with stats.recording_conclusions() as kernel_conclusions:
        kernel_block = stats.conclusions_block(kernel_cmp, init_label)
    texts["main_table.md"] = (
        "# Main table: test accuracy (%) by initializer\n\n"
        "Final-epoch top-1, mean ± std over seeds; in brackets the difference to Trunc Normal; "
        "95% CI = t-interval of the mean; n = seeds. \"paper\" is the paper's single-run "
        "number (ViT-T/2, 200 epochs) where it has one.\n\n"
        f"What ran: {run}\n\n"
        + report.main_table(runs, grid["datasets"], inits, ours) + "\n\n"
        + main_block + "\n"
        + report.paper_main_block())
    texts["kernel_table.md"] = (
        "# Structured init by kernel size\n\n"
        f"What ran: {run}\n\n"
        "init target mass: mean attention on the target key of the init that ran; official "
        "solver's mass: the paper's own solver (10,000 Adam steps) on the same shape, offsets "
        "and seeds (stage reference_solve).\n\n"
        + report.kernel_table(runs, preopt_runs, grid["datasets"], grid["kernels"], kernel) + "\n\n"
        + kernel_block + "\n"
        + report.paper_main_block([i for i in paper.MAIN if cells.impulse_kernel(i)]))
    texts["preopt_table.md"] = (
        "# Pre-optimization (Q/K solve) per configuration\n\n"
        "fit = MSE between the solved maps and the impulse targets on the pseudo-input; "
        "target mass = mean attention on the target key (rows with a target). "
        "official = the paper's own solver (10,000 Adam steps, stage reference_solve) on the "
        "same shape, offsets and seed; the structured init is meant to match its softness. "
        "The paper publishes no solver figures: the official solver, run here, is the "
        "reference.\n\n"
        f"Structured init: {report.init_description(params['solve'])}.\n\n"
        + report.preopt_table(preopt_runs) + "\n")
    return MainReports(texts, {"main_table.md": stats.conclusions_record("main_table.md", main_conclusions),
                        "kernel_table.md": stats.conclusions_record("kernel_table.md", kernel_conclusions)},
                report.summary(runs, grid["datasets"], inits, ours), runs)
