"""The studies' reports: one function per study (params, its cells -> the report's markdown).

Like the main table, the expected runs come from params.yaml (cells.study_runs) and a missing
one fails, naming it. Runs the main grid already trained (the structured init with the main
init settings, the recipe's own model shape) are read from the main grid's results. The
stage (stages/study_report.py) picks the function from STUDY_REPORTS and writes what it returns.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import yaml

from structinit.config import FILTER_MODES
from structinit.data.specs import get_spec
from structinit.pipeline.cells import STUDIES, Run, impulse_init, main_variant, parse_pseudo_variant, study_runs
from structinit.reporting import paper, stats
from structinit.reporting import tables as report
from structinit.reporting.budget import budget_sentences
from structinit.reporting.presentation import init_label
from structinit.reporting.runs import ran_with, read_cell
from structinit.training.steps import steps_per_epoch


SOFTNESS_CAVEAT = (
    "Softness: the closed form follows the official solver's softness for the P pseudo-input "
    "(softness law). On U, G, A and B the official solver's maps are sharper (digits shape: "
    "benchmarks/softness_law.csv), so the non-P rows compare pseudo-inputs at P's softness; "
    "`-S solve.solver=adam` runs the official solver on each.\n\n")


# Whose budget the epoch benchmark (benchmarks/epochs.csv: the recipe's ViT, main arms) speaks
# for: a study on the recipe's model and epochs, or holding the main grid's steps. ConvMixer
# trains another model, which the benchmark did not measure.
BUDGET_NOTES = {"pseudo_input": "", "heads_width": " (measured on the recipe's shape, not these)",
                "data_size": " (the main grid's budget, whose steps this study holds)"}


def _what_ran(params, study, extra, runs, budgets=None):
    s = params["studies"][study]
    extra = ". ".join(e for e in (extra, runs.attrs["ran_with"]) if e)
    measured = {d: budgets[d] for d in s["datasets"] if d in (budgets or {})}
    budget = ""
    if measured and study in BUDGET_NOTES:
        epochs = {d: params["recipes"][d]["train"]["epochs"] for d in measured}
        budget = budget_sentences(measured, epochs, init_label).rstrip(".") + BUDGET_NOTES[study] + "."
    return ("What ran: " + report.what_ran(params, s["datasets"], s["seeds"], extra, vit=study != "convmixer")
            + budget + " Final-epoch test "
            "accuracy (%), mean ± std over seeds, n = seeds; " + stats.INTERVAL + ".")


def versus(reference: str):
    """A study's plan: every other value against `reference` (when the study has it)."""
    return lambda values: [(v, reference) for v in values if v != reference] if reference in values else []


def _collect(runs: list[Run], logged=()):
    """runs (cells.study_runs) -> DataFrame, one row per run; fails naming every missing run.
    logged: keys of each run's logged params (its params.yaml) to add as columns."""
    missing = [str(r.dir) for r in runs if not (r.dir / "metrics.json").exists()]
    if missing:
        raise SystemExit(f"missing results for {len(missing)} run(s): {missing}")

    def params_of(r):
        logged_params = yaml.safe_load((r.dir / "params.yaml").read_text()) if logged else {}
        return {k: logged_params[k] for k in logged}
    frame = pd.DataFrame([{**r.fields, "seed": r.seed, **read_cell(r.folder, r.seed)[0], **params_of(r)}
                          for r in runs])
    frame.attrs["ran_with"] = ran_with(r.dir for r in runs)       # for _what_ran
    return frame


def convmixer(params, main: Path, studies: Path, out: Path, figures: Path | None = None,
              budgets: dict | None = None) -> str:
    s = params["studies"]["convmixer"]
    runs = _collect(study_runs(params, "convmixer", main, studies))
    sizes = "; ".join(f"{z} = {params['convmixer_sizes'][z]}" for z in s["sizes"])
    return ("# ConvMixer: learned vs frozen spatial filters\n\n"
            "Why impulse filters: depthwise k×k filters learned, or frozen random U(±1/k), frozen "
            "impulse (one-hot) or frozen box (all taps equal); channel mixing always learned. "
            "paper = CIFAR-10 numbers quoted from the paper.\n\n"
            + _what_ran(params, "convmixer", f"ConvMixer sizes: {sizes}", runs, budgets) + "\n\n"
            + report.study_table(runs, "size", "mode", rows=s["sizes"], cols=s["modes"],
                                 quoted=paper.CONVMIXER, paper_dataset="cifar10") + "\n\n"
            + stats.contrasts_block(report.study_contrasts(runs, "mode", versus("learned"), within="size"))
            + "\nPlanned: each frozen mode against learned filters, per size (the premise: a frozen "
            "impulse trains about as well as learned filters).\n\n"
            + report.paper_block("ConvMixer on CIFAR-10 (top-1 %, quoted from the paper)",
                                 paper.CONVMIXER, {m: m for m in FILTER_MODES},
                                 "Single runs. Also quoted: a ViT with width 256 and 8 heads, "
                                 "impulse-initialized 90.67 vs Trunc Normal 87.27.", row_label=str))


def pseudo_input(params, main: Path, studies: Path, out: Path, figures: Path | None = None,
                 budgets: dict | None = None) -> str:
    s = params["studies"]["pseudo_input"]
    k, main_row = s["kernel"], main_variant(params)
    runs = _collect(study_runs(params, "pseudo_input", main, studies))
    variants = list(dict.fromkeys([main_row] + list(s["variants"])))
    runs["kernel"] = impulse_init(k)            # init names, as the paper's numbers are keyed
    paper_init = paper.PSEUDO_INPUT_INIT

    def label(variant):
        o = parse_pseudo_variant(variant)
        return (f"{o['pseudo_input']} → {o['pseudo_input_rest']}, " + ("per-layer" if o["per_layer"] else "shared")
                + (" (main grid)" if variant == main_row else ""))
    return ("# Pseudo-input ablation for the structured init\n\n"
            "Pseudo-input of the first block → of the later blocks (P: sin-cos encoding, U: uniform, "
            "G: truncated normal, A = P+U, B = P+G), one Q/K solve shared by every block or one per "
            "block. paper = CIFAR-10, PE everywhere with shared Q/K.\n\n"
            + _what_ran(params, "pseudo_input", f"Kernel {k}", runs, budgets) + "\n\n"
            + (SOFTNESS_CAVEAT if params["solve"]["solver"] == "closed_form" else "")
            + report.study_table(runs, "variant", "kernel", rows=variants, cols=[impulse_init(k)],
                                 quoted=paper.PSEUDO_INPUT, paper_dataset="cifar10",
                                 row_label=label, col_label=init_label) + "\n\n"
            + stats.contrasts_block(report.study_contrasts(runs, "variant", versus(main_row)), label)
            + "\nPlanned: each variant against the main grid's pseudo-input.\n\n"
            + report.paper_block(f"pseudo-input ablation on CIFAR-10 (top-1 %, {init_label(paper_init)})",
                                 paper.PSEUDO_INPUT, {paper_init: init_label(paper_init)},
                                 "Single runs. P → P with one shared solve is the paper's best "
                                 "(90.75; 90.39 averaged over its runs); purely random pseudo-inputs "
                                 "were 3–4 points worse. The other variants' numbers are not quoted.",
                                 row_label=label))


def heads_width(params, main: Path, studies: Path, out: Path, figures: Path | None = None,
                budgets: dict | None = None) -> str:
    s = params["studies"]["heads_width"]
    runs = _collect(study_runs(params, "heads_width", main, studies))
    shapes = ["recipe"] + list(s["shapes"])
    desc = "; ".join(f"{z} = {params['model_shapes'][z]}" for z in s["shapes"])
    recipes = "; ".join(f"{d} recipe = {params['recipes'][d]['model']}" for d in s["datasets"])
    return ("# Heads and width: structured init vs baselines\n\n"
            "Each shape overrides the dataset recipe's model; \"recipe\" rows are the main grid's "
            "cells. paper = CIFAR-100 numbers quoted from the paper.\n\n"
            + _what_ran(params, "heads_width", f"{recipes}; {desc}", runs, budgets) + "\n\n"
            + report.study_table(runs, "shape", "init", rows=shapes, cols=list(s["inits"]),
                                 quoted=paper.HEADS_WIDTH, paper_dataset="cifar100",
                                 col_label=init_label) + "\n\n"
            + stats.contrasts_block(report.study_contrasts(runs, "init", versus("trunc_normal"), within="shape"),
                                    init_label)
            + "\nPlanned: each initializer against Trunc Normal, per shape.\n\n" + report.paper_block(
                "heads and width on CIFAR-100 (top-1 %, quoted from the paper)",
                {"recipe (ViT-T/h3)": {i: paper.MAIN[i]["cifar100"] for i in paper.HEADS_WIDTH_INITS},
                 **paper.HEADS_WIDTH},
                {i: init_label(i) for i in paper.HEADS_WIDTH_INITS},
                "Single runs; the recipe row is the main table's CIFAR-100 column.", row_label=str))


def data_size(params, main: Path, studies: Path, out: Path, figures: Path | None = None,
              budgets: dict | None = None) -> str:
    from structinit.reporting.figures.data_size import write_data_size_figures  # matplotlib: this study only

    s = params["studies"]["data_size"]
    runs = _data_size_runs(params, main, studies)
    sizes = list(dict.fromkeys(runs["size"]))
    images = lambda z: z.replace(" (", " images (", 1)  # noqa: E731  "144 images (10 %)"
    held = "; ".join(f"{d} {images(z)}: {g.epochs.iloc[0]} epochs × {g.steps_per_epoch.iloc[0]} = "
                     f"{g.steps.iloc[0]:,} steps" for (d, z), g in runs.groupby(["dataset", "size"], sort=False))
    figures_md = "".join(f"![{p.stem}: accuracy vs training-set size]"
                         f"({Path(os.path.relpath(p, Path(out).parent)).as_posix()})\n\n"
                         for p in write_data_size_figures(runs, figures))
    return ("# When does it matter? Accuracy against training-set size\n\n"
            "The main initializers trained on stratified subsets of the main grid's training set "
            "(`studies.data_size.fractions`, drawn with `data.subset_seed`: the same images for every "
            "initializer and seed); the 100 % rows are the main grid's cells, reused. **The optimizer's "
            "step count is held at the main grid's, not the epoch count**: the same epochs on 10 % of "
            "the images would be 10 % of the steps, and every initializer would look worse for being "
            "trained less. Steps per epoch = images // batch (drop-last; the batch is kept); epochs = "
            "round(main grid's steps / steps per epoch); the warm-up lasts the main grid's warm-up "
            "steps, and the test set is evaluated about as often in steps, and at the last epoch "
            "(`structinit/training/steps.py`).\n\n"
            + _what_ran(params, "data_size", f"Steps held: {held}", runs, budgets) + "\n\n"
            + report.schedule_table(runs) + "\n\n"
            + report.study_table(runs, "init", "size", rows=list(s["inits"]), cols=sizes,
                                 row_label=init_label, col_label=images) + "\n\n"
            + figures_md
            + stats.contrasts_block(report.study_contrasts(runs, "init", versus("trunc_normal"), within="size"),
                                    init_label)
            + "\nPlanned: each initializer against Trunc Normal, per size.\n"
            + _gap_block(runs, s, images)
            + "\n" + report.paper_main_block(s["inits"], note=(
                "The paper has no data-size study. Its datasets differ in size and, for ImageNet-1K, "
                "in recipe, so its columns are its only evidence on size, and a confounded one: "
                + report.paper_gaps(s["inits"]) + ".")))


def _data_size_runs(params, main, studies):
    """Every run of the study and its 100 % points (the main grid's cells), with what each ran:
    its training images (logged), the epochs it logged metrics for, and the optimizer steps."""
    runs = _collect(study_runs(params, "data_size", main, studies),
                    logged=("train_images", "batch_size", "warmup_epochs", "eval_every"))
    ran = runs.attrs["ran_with"]
    runs["steps_per_epoch"] = [steps_per_epoch(n, b) for n, b in zip(runs.train_images, runs.batch_size)]
    runs["steps"] = runs.epochs * runs.steps_per_epoch
    runs = runs.sort_values(["dataset", "train_images"], kind="stable").reset_index(drop=True)
    runs["size"] = [report.size_label(n, f) for n, f in zip(runs.train_images, runs.fraction)]
    runs.attrs["ran_with"] = ran                 # not left to pandas' attrs propagation
    return runs


def _gap_block(runs, s, condition) -> str:
    """Does each initializer's difference to Trunc Normal change from the main grid's set to the
    smaller ones? Empty without Trunc Normal in the study."""
    if "trunc_normal" not in s["inits"] or len(s["inits"]) < 2:
        return ""
    changes = []
    for d, rows in runs.groupby("dataset", sort=False):
        groups = {key: dict(zip(g.seed.tolist(), g.acc.tolist()))
                  for key, g in rows.groupby(["init", "size"], sort=False)}
        full = rows[rows.fraction == 1.0]["size"].iloc[0]
        smaller = [z for z in reversed(list(dict.fromkeys(rows["size"]))) if z != full]  # largest first
        changes += stats.compare_gap_changes({(i, z): groups[i, z] for i in s["inits"] for z in [full] + smaller},
                                             reference="trunc_normal", base=full, family=d)
    return ("\n## Does the gap to Trunc Normal change as the data shrinks?\n\n"
            "Generated: each initializer's difference to Trunc Normal at each smaller size against "
            "the same difference on the main grid's set, paired by seed: per seed, (gap at the size) − "
            "(gap on the full set), a paired t-test on those, Holm-corrected over the dataset's tests; a "
            "change is stated only when the corrected p < 0.05 and not fragile.\n\n"
            + "\n".join(stats.gap_change_lines(changes, init_label, condition)) + "\n"
            + near_chance_caveat(runs))


def near_chance_caveat(runs) -> str:
    """A generated caveat when the reference of the gaps never left chance: its 'gap' is then the
    other initializer's accuracy, not a difference between two trained models."""
    notes = []
    for d, rows in runs[runs.init == "trunc_normal"].groupby("dataset", sort=False):
        chance = 100 / get_spec(d).num_classes
        top = rows.groupby("size", sort=False).acc.mean().max()
        if top < 2 * chance:
            notes.append(f"{d}: Trunc Normal stays near chance at every size (at most {top:.1f} % "
                         f"against {chance:.0f} % chance), so a gap to it is mostly the other "
                         "initializer's own accuracy")
    return ("\nCaveat, generated: " + "; ".join(notes) + ".\n") if notes else ""


_REPORTS = {"convmixer": convmixer, "pseudo_input": pseudo_input, "heads_width": heads_width,
            "data_size": data_size}
TITLES = {"convmixer": "ConvMixer: learned vs frozen spatial filters",
          "pseudo_input": "Pseudo-input ablation for the structured init",
          "heads_width": "Heads and width: structured init vs baselines",
          "data_size": "When does it matter? Accuracy against training-set size"}


def off_report(params: dict, study: str) -> str:
    """The report of a study the params switch off (studies.<study>.datasets: [])."""
    return (f"# {TITLES[study]}\n\n"
            f"**Not run in this configuration**: `studies.{study}.datasets` is empty. The embedded default "
            "spends its time budget on the main grid at its full epoch budget and leaves this study out "
            "(docs/studies.md: what it costs). Bring it back with\n\n"
            f"    dvc exp run -S 'studies.{study}.datasets=[digits]'\n")


OFF_NOTE = "README.md"             # what an off study's figure folder holds


def _report(study: str):
    def write(params, main: Path, studies: Path, out: Path, figures: Path | None = None,
              budgets: dict | None = None) -> str:
        """budgets: the epoch benchmark's finals per dataset (budget.read_budget_finals)."""
        if figures is not None:                               # no stale figure of an earlier run
            Path(figures).mkdir(parents=True, exist_ok=True)
            for stale in [*Path(figures).glob("*.png"), Path(figures) / OFF_NOTE]:
                stale.unlink(missing_ok=True)
        if not params["studies"][study]["datasets"]:
            if figures is not None:
                # the stage's declared output folder must exist (DVC refuses a missing output),
                # and git cannot hold an empty folder: one file says why it has no figure
                (Path(figures) / OFF_NOTE).write_text(
                    f"No figure: the {study} study is off in this configuration "
                    f"(`studies.{study}.datasets: []`); its report says how to bring it back.\n")
            return off_report(params, study)
        return _REPORTS[study](params, main, studies, out, figures, budgets)
    return write


STUDY_REPORTS = {study: _report(study) for study in _REPORTS}
assert set(STUDY_REPORTS) == set(STUDIES), "every study in cells.STUDIES has a report here"
