"""The data-size study: optimizer steps held across training-set sizes, each size's subset,
and its report (table, conclusions, figure) from synthetic cells."""
import copy
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from structinit.pipeline.load import load_params
from structinit.reporting.study_reports import data_size
from stages.train import data_size_cell
from structinit import stratified_subset
from structinit.reporting import stats
from structinit.data.specs import TRAIN_IMAGES
from structinit.training.config import match_steps, steps_per_epoch, subset_size, total_steps

REPO = Path(__file__).resolve().parents[1]
# the digits recipe at a fixed 20 epochs (warm-up 1): these tests check the step arithmetic on
# known numbers (440 steps), whatever budget params.yaml trains
DIGITS = {**load_params(REPO / "params.yaml")["recipes"]["digits"]["train"], "epochs": 20, "warmup_epochs": 1}


def _trainer_warmup_steps(train, n):
    """structinit/training/trainer.py's count of warm-up steps."""
    return round(train["warmup_epochs"] * steps_per_epoch(n, train["batch_size"]))


@pytest.mark.parametrize("n, per_epoch, epochs, warmup, eval_every", [
    (144, 2, 220, 11, 55),         # 10 % of digits
    (359, 5, 88, 4.4, 22),         # 25 %
    (1437, 22, 20, 1, 5),          # all: the recipe unchanged
])
def test_digits_subsets_train_the_main_grids_440_steps(n, per_epoch, epochs, warmup, eval_every):
    assert (DIGITS["epochs"], DIGITS["batch_size"], DIGITS["warmup_epochs"], DIGITS["eval_every"]) == (20, 64, 1, 5)
    m = match_steps(DIGITS, 1437, n)
    assert steps_per_epoch(n, 64) == per_epoch
    assert (m["epochs"], m["warmup_epochs"], m["eval_every"]) == (epochs, warmup, eval_every)
    assert total_steps(m, n) == total_steps(DIGITS, 1437) == 440
    assert _trainer_warmup_steps(m, n) == 22                       # the main grid's warm-up, in steps
    assert {k: v for k, v in m.items() if k not in ("epochs", "warmup_epochs", "eval_every")} == \
        {k: v for k, v in DIGITS.items() if k not in ("epochs", "warmup_epochs", "eval_every")}


def test_steps_round_to_the_nearest_whole_epoch():
    train = {"epochs": 20, "batch_size": 64, "warmup_epochs": 1, "eval_every": 1}
    # reference: 1000 images -> 15 steps/epoch, 300 steps; 450 images -> 7 steps/epoch
    m = match_steps(train, 1000, 450)
    assert m["epochs"] == 43 and total_steps(m, 450) == 301               # 300 / 7 = 42.9
    assert abs(total_steps(m, 450) - 300) <= steps_per_epoch(450, 64) / 2
    assert _trainer_warmup_steps(m, 450) == 15 and m["eval_every"] == 2   # 15 steps / 7, rounded
    # a subset of exactly one batch: one step per epoch
    m = match_steps(train, 1000, 64)
    assert (m["epochs"], m["warmup_epochs"], m["eval_every"]) == (300, 15, 15)
    # a warm-up over the whole reference run stays within the subset's epochs
    whole = dict(train, warmup_epochs=20)
    m = match_steps(whole, 1000, 450)
    assert m["warmup_epochs"] <= m["epochs"]


def test_a_subset_smaller_than_one_batch_is_refused():
    with pytest.raises(ValueError, match=r"n_subset=50: fewer images than one batch \(64\); allowed: 64..1437"):
        match_steps(DIGITS, 1437, 50)
    with pytest.raises(ValueError, match="n_subset=2000: more images than the reference"):
        match_steps(DIGITS, 1437, 2000)


def test_subset_size_is_stratified_subsets_count(digits):
    assert len(digits.train_labels) == TRAIN_IMAGES["digits"]
    for size in (None, 1.0, 0.1, 0.25, 1 / 3, 500):
        assert subset_size(1437, size) == len(stratified_subset(digits.train_labels, size, seed=0)), size


def test_a_cell_draws_its_subset_within_the_main_grids_and_logs_its_steps(digits):
    labels = digits.train_labels
    main = stratified_subset(labels, 300, seed=0)                         # data.train_size: 300
    a = SimpleNamespace(train_fraction=0.5, match_steps=True)
    subset, train, logged = data_size_cell(a, DIGITS, main, labels, 0)
    assert len(subset) == 150 and set(subset.tolist()) <= set(main.tolist())
    assert torch.bincount(labels[subset], minlength=10).min() >= 14      # still stratified
    assert logged == {"train_fraction": 0.5, "main_grid_train_images": 300, "match_steps": True,
                      "steps_per_epoch": 2, "steps": 80, "main_grid_steps": 80}
    assert train["epochs"] == 40
    # by default (all images) the cell's subset is data.train_size = the fraction itself
    subset, _, _ = data_size_cell(SimpleNamespace(train_fraction=0.1, match_steps=False), DIGITS,
                                  torch.arange(len(labels)), labels, 0)
    assert torch.equal(subset, stratified_subset(labels, 0.1, seed=0))
    with pytest.raises(SystemExit, match="--train-fraction 0.1: n_subset=30: fewer images than one batch"):
        data_size_cell(SimpleNamespace(train_fraction=0.1, match_steps=True), DIGITS, main, labels, 0)


# --- statistics: does a gap change? ---------------------------------------------------------

def test_gap_changes_claim_only_what_the_test_supports():
    seeds = lambda values: dict(enumerate(values))  # noqa: E731
    groups = {("trunc_normal", "all"): seeds([15, 16, 14]), ("trunc_normal", "10 %"): seeds([15, 14, 16]),
              ("impulse3", "all"): seeds([30, 33, 27]), ("impulse3", "10 %"): seeds([50, 54, 52]),
              ("mimetic", "all"): seeds([90, 91, 92]), ("mimetic", "10 %"): seeds([88, 93, 90])}
    changes = stats.compare_gap_changes(groups, reference="trunc_normal", base="all", family="digits")
    assert [(c.a, c.other, c.verdict) for c in changes] == [("impulse3", "10 %", ">"), ("mimetic", "10 %", "~")]
    lines = stats.gap_change_lines(changes)
    assert lines[0].startswith("- digits, impulse3 − trunc_normal: +15.00 points at all; "
                               "+37.00 at 10 %: **larger** by 22.00")
    assert lines[0].endswith("The gap is larger at 10 % than at all.")
    assert "change not distinguishable from 0" in lines[1] and "No change of the gap" in lines[1]


# --- the report, from synthetic cells -------------------------------------------------------

ACC = {"trunc_normal": {1.0: 15, 0.25: 15, 0.1: 15}, "mimetic": {1.0: 92, 0.25: 85, 0.1: 75},
       "impulse3": {1.0: 30, 0.25: 40, 0.1: 55}}
# Per-seed noise with mean 0 over seeds 0-2 and over 0-4 (the means stay ACC's), different per
# arm and size, so paired differences have some spread to test; seeds 3-4 in the main grid's
# cells (grid.seeds: the report's reference SD of paired differences reads all of them), and in
# the study's at 5 seeds.
JITTER = {"trunc_normal": [0.2, -0.1, -0.1, 0.4, -0.4], "mimetic": [-0.3, 0.1, 0.2, -0.5, 0.5],
          "impulse3": [0.1, 0.3, -0.4, 0.2, -0.2]}
SIZE_SIGN = {1.0: 1, 0.25: -1, 0.1: 2}


def _fake_run(folder: Path, acc: float, images: int, epochs: int, train: dict):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"final_test_acc": acc / 100, "best_test_acc": acc / 100,
                                                     "step": epochs - 1}))
    (folder / "plots/metrics/test").mkdir(parents=True)
    (folder / "plots/metrics/test/acc.tsv").write_text(f"step\tacc\n{epochs - 1}\t{acc / 100}\n")
    (folder / "params.yaml").write_text(yaml.safe_dump({"train_images": images, **train}))


def _fake_study(root: Path, params: dict, skip=None):
    s = params["studies"]["data_size"]
    for init in s["inits"]:
        for f in [1.0] + s["fractions"]:
            images = subset_size(1437, f)
            train = DIGITS if f == 1.0 else match_steps(DIGITS, 1437, images)
            cell = root / ("train" / Path(f"digits-{init}") if f == 1.0 else f"studies/data_size/digits-{f}-{init}")
            for seed in (params["grid"]["seeds"] if f == 1.0 else s["seeds"]):
                if (cell.name, seed) != skip:
                    acc = ACC[init][f] + seed - (len(s["seeds"]) - 1) / 2 + SIZE_SIGN[f] * JITTER[init][seed]
                    _fake_run(cell / f"seed{seed}", acc, images, train["epochs"], train)


@pytest.fixture
def params():
    p = copy.deepcopy(load_params(REPO / "params.yaml"))
    p["studies"]["data_size"].update(datasets=["digits"], fractions=[0.1, 0.25],
                                     inits=["trunc_normal", "mimetic", "impulse3"], seeds=[0, 1, 2])
    return p


def test_report_states_sizes_steps_and_only_supported_conclusions(tmp_path, params):
    params["studies"]["data_size"]["seeds"] = [0, 1, 2, 3, 4]        # 5 seeds: a study with verdicts
    _fake_study(tmp_path, params)
    text = data_size(params, tmp_path / "train", tmp_path / "studies", tmp_path / "reports/data_size.md",
                     tmp_path / "reports/figures/data_size")
    assert "Steps held: digits 144 images (10 %): 220 epochs × 2 = 440 steps; digits 359 images (25 %): " \
           "88 epochs × 5 = 440 steps; digits 1,437 images (100 %): 20 epochs × 22 = 440 steps" in text
    row = [line for line in text.splitlines() if "| Imp.-3" in line and "| 144 images (10 %)" in line]
    assert len(row) == 1 and "| 55.00 ± " in row[0] and "| 5 " in row[0]
    assert "- digits, 144 (10 %): Mimetic − Trunc Normal: +60.00 points, 95 % CI [" in text
    assert "n = 5 paired: **Mimetic > Trunc Normal** (p Holm = " in text
    # not planned (neither arm is the reference): described, no verdict
    assert "- digits, 1,437 (100 %): Mimetic − Imp.-3: +62.00 points, 95 % CI [" in text
    assert "Mimetic > Imp.-3" not in text
    gap = next(line for line in text.splitlines() if line.startswith("- digits, Imp.-3 − Trunc Normal"))
    assert "+15.00 points at 1,437 images (100 %)" in gap and "+40.00 at 144 images (10 %): **larger** by 25.00" in gap
    assert gap.endswith("The gap is larger at 359 images (25 %), 144 images (10 %) than at 1,437 images (100 %).")
    mimetic = next(line for line in text.splitlines() if line.startswith("- digits, Mimetic − Trunc Normal"))
    assert "**smaller** by 17.00" in mimetic                           # 77 -> 60 points at 10 %
    # planned in params.yaml, tested per size; what each test detects (Holm's first step)
    assert ("Planned in params.yaml (`studies.data_size.contrasts`) before the run, two-sided paired t tests "
            "Holm-corrected within each family (dataset, size) at α = 0.05: Imp.-3 vs Trunc Normal; "
            "Mimetic vs Trunc Normal.") in text
    change = [ACC["impulse3"][0.1] - ACC["trunc_normal"][0.1] + (SIZE_SIGN[0.1] - SIZE_SIGN[1.0])
              * (JITTER["impulse3"][s] - JITTER["trunc_normal"][s]) for s in range(5)]
    sd = float(np.std(change, ddof=1))
    assert (f"- digits, Imp.-3 − Trunc Normal, 144 images (10 %) vs 1,437 images (100 %): n = 5, α = 0.0125, "
            f"SD of the per-seed change {sd:.2f}: detectable change "
            f"{stats.min_detectable_difference(sd, 5, 0.0125):.2f} points") in text
    assert "## Smallest difference this design detects" in text
    assert "The paper has no data-size study" in text and "ImageNet-1K (1,281,167 images) +0.82" in text
    assert "![digits: accuracy vs training-set size](figures/data_size/digits.png)" in text
    png = tmp_path / "reports/figures/data_size/digits.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_at_3_seeds_the_report_describes_each_difference_and_its_change(tmp_path, params):
    """The default's 3 seeds: estimates and intervals, no verdict (study_reports.TESTED_FROM_SEEDS)."""
    _fake_study(tmp_path, params)
    text = data_size(params, tmp_path / "train", tmp_path / "studies", tmp_path / "reports/data_size.md",
                     tmp_path / "reports/figures/data_size")
    assert "## Estimates (descriptive: no verdict)" in text and "benchmarks/cpu_variation.md" in text
    assert "- digits, 144 (10 %): Mimetic − Trunc Normal: +60.00 points, 95 % CI [" in text
    assert "**" not in text.split("## Estimates")[1] and "detectable" not in text and "Holm-corrected" not in text
    gap = next(line for line in text.splitlines() if line.startswith("- digits, Imp.-3 − Trunc Normal"))
    assert gap.startswith("- digits, Imp.-3 − Trunc Normal: +15.00 points at 1,437 images (100 %); +25.00 at 359 "
                          "images (25 %): change +10.00, 95 % CI [") and gap.endswith("; n = 3 paired")
    assert "; +40.00 at 144 images (10 %): change +25.00, 95 % CI [" in gap


def test_report_fails_naming_a_missing_run(tmp_path, params):
    _fake_study(tmp_path, params, skip=("digits-0.25-impulse3", 1))
    # a FileNotFoundError to a caller (MissingFileError), an exit only in the stage (stages/common.run_stage)
    with pytest.raises(FileNotFoundError, match=r"missing results for 1 run\(s\).*digits-0.25-impulse3/seed1"):
        data_size(params, tmp_path / "train", tmp_path / "studies", tmp_path / "out.md", tmp_path / "figs")


def test_near_chance_reference_gets_a_generated_caveat():
    """A gap to an initializer that never left chance is that other initializer's accuracy: the
    report says so, and says nothing when the reference trained."""
    import pandas as pd

    from structinit.reporting.study_reports import near_chance_caveat

    stuck = pd.DataFrame({"dataset": ["digits"] * 4, "init": ["trunc_normal"] * 2 + ["mimetic"] * 2,
                          "size": ["144 (10 %)", "1,437 (100 %)"] * 2, "acc": [15.0, 12.0, 80.0, 90.0]})
    assert "digits: Trunc Normal stays near chance at every size (at most 15.0 % against 10 % chance)" \
        in near_chance_caveat(stuck)
    trained = stuck.assign(acc=[60.0, 70.0, 80.0, 90.0])
    assert near_chance_caveat(trained) == ""


def test_a_study_switched_off_writes_how_to_bring_it_back(tmp_path, params):
    """studies.<study>.datasets: [] is off: no runs are read, the report says so and names the
    one -S that brings it back, and figures of an earlier run are removed."""
    from structinit.reporting.study_reports import STUDY_REPORTS

    params["studies"]["data_size"]["datasets"] = []
    figures = tmp_path / "figs"
    figures.mkdir()
    (figures / "digits.png").write_bytes(b"stale")
    text = STUDY_REPORTS["data_size"](params, tmp_path / "train", tmp_path / "studies", tmp_path / "out.md", figures)
    assert "Not run in this configuration" in text
    assert "dvc exp run -S 'studies.data_size.datasets=[digits]'" in text
    assert not list(figures.glob("*.png"))
    # DVC deletes a stage's outputs before it runs: the declared folder is made again, with one
    # file (git holds no empty folder) saying why it has no figure
    shutil.rmtree(figures)
    STUDY_REPORTS["data_size"](params, tmp_path / "train", tmp_path / "studies", tmp_path / "out.md", figures)
    assert [f.name for f in figures.iterdir()] == ["README.md"] and "off" in (figures / "README.md").read_text()
