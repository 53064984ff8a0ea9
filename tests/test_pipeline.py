"""End to end: the real `dvc repro` on a tiny configuration, in a temporary copy of the repo."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from structinit.pipeline import scratch

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def sh(cwd, *cmd, check=True):
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", DVC_NO_ANALYTICS="1",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", STRUCTINIT_CKPT_DIR=str(Path(cwd) / ".ckpt"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)     # stages write __pycache__/ as on a user's machine
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and r.returncode:
        raise AssertionError(f"{cmd} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return r


def set_params(repo, **updates):
    p = yaml.safe_load((repo / "params.yaml").read_text())
    for dotted, value in updates.items():
        *path, last = dotted.split(".")
        d = p
        for key in path:
            d = d[key]
        d[last] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))


def tiny_repo_copy(root: Path) -> Path:
    """A fresh copy of the project (what git would clone) with a tiny grid, committed, not run."""
    repo = Path(root) / "repo"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        if ((f.split("/")[0] in scratch.OUTPUTS and not f.startswith(scratch.FROZEN_OUTPUTS))
                or not (REPO / f).exists()):
            continue                                   # start as if nothing had run yet; the frozen
                                                       # stages' committed outputs are inputs
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, repo / f)
    set_params(repo, **{"grid.baselines": ["trunc_normal"], "grid.kernels": [3, 5], "grid.seeds": [0, 1],
                        "data.train_size": 300, "recipes.digits.model.embed_dim": 24,
                        "recipes.digits.model.depth": 1, "recipes.digits.train.epochs": 3,
                        "recipes.digits.train.warmup_epochs": 1, "recipes.digits.train.eval_every": 2,
                        "studies.convmixer.datasets": ["digits"], "studies.pseudo_input.datasets": ["digits"],
                        "studies.heads_width.datasets": ["digits"], "studies.data_size.datasets": ["digits"],
                        "studies.convmixer.modes": ["learned", "impulse"],
                        "convmixer_sizes.cm64d4k3": {"dim": 16, "depth": 1, "kernel_size": 3, "patch_size": 1},
                        "studies.pseudo_input.variants": ["UP"],
                        "studies.pseudo_input.contrasts": {"alpha": 0.05, "planned": ["UP vs PP"]},
                        "studies.convmixer.seeds": [0], "studies.pseudo_input.seeds": [0],
                        "studies.heads_width.seeds": [0],
                        "studies.heads_width.shapes": ["h6"],
                        "studies.heads_width.inits": ["trunc_normal", "impulse3"],
                        # a fraction of the main grid's 300 images that holds a batch of 64
                        "studies.data_size.fractions": [0.5], "studies.data_size.seeds": [0],
                        "studies.data_size.inits": ["trunc_normal", "impulse3"]})
    sh(repo, "git", "init", "-q")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "tiny")
    return repo


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory):
    """tiny_repo_copy, with its main table run once."""
    repo = tiny_repo_copy(tmp_path_factory.mktemp("structinit"))
    first = sh(repo, "dvc", "repro", "aggregate")         # the main table alone
    return repo, first


def test_repro_builds_reports_and_leaves_git_clean(tiny_repo):
    repo, first = tiny_repo
    table = (repo / "reports/main_table.md").read_text()
    for row in ("Trunc Normal", "Imp.-3 (ours)", "Imp.-5"):
        assert row in table
    ours, paper = table.split("## The paper's numbers")
    assert "Mimetic" not in ours and "Kaiming" not in ours         # only the grid's rows
    assert "| Mimetic " in paper and "ImageNet-1K" in paper         # the paper's, always in view
    assert "seeds [0, 1] (n = 2); training images per dataset: 300" in table
    assert "digits: the paper's recipe, departing in: epochs 3 (paper 200)" in table
    from structinit.numerics import package_versions          # what the stages ran with, as logged
    assert f"With {package_versions()} (6 runs)" in table      # 3 arms x 2 seeds
    assert "## Conclusions" in table and "n = 2 paired" in table
    assert "Planned but not run (an arm is not in this grid): impulse3 vs mimetic" in table
    preopt = (repo / "reports/preopt_table.md").read_text()
    assert "official solver's mass" in preopt and "softness law" in preopt
    assert "official solver's mass" in (repo / "reports/kernel_table.md").read_text()
    for seed in (0, 1):
        reference = json.loads((repo / f"results/reference/digits-3/seed{seed}.json").read_text())
        assert reference["steps_run"] == 10_000 and 0 < reference["target_mass"] < 1
        assert reference["seed"] == seed
    # one stage per cell, its seeds trained stacked; each seed keeps its own outputs
    assert first.stdout.count("Running stage 'train_") == 3
    for cell in ("digits-trunc_normal", "digits-impulse3", "digits-impulse5"):
        for seed in (0, 1):
            assert (repo / f"results/train/{cell}/seed{seed}/metrics.json").exists()
            assert (repo / f"results/train/{cell}/seed{seed}/plots/metrics/test/acc.tsv").exists()
            assert (repo / f"models/{cell}/seed{seed}.pt").exists()
        accs = [json.loads((repo / f"results/train/{cell}/seed{s}/metrics.json").read_text())["final_test_acc"]
                for s in (0, 1)]
        assert accs[0] != accs[1]                               # two seeds, two different runs
    conclusions = json.loads((repo / "reports/conclusions/main_table.json").read_text())
    # planned (params.yaml contrasts) on the arms this grid has: the primary, one secondary,
    # and the speed endpoint's primary, alone at alpha at the first tested epoch (every 2 of 3)
    # at or after 1/8 of the budget; the third pair is described without a test
    assert [(c["id"], c["role"]) for c in conclusions["conclusions"]] == [
        ("digits: impulse3 vs trunc_normal", "primary"), ("digits: impulse3 vs impulse5", "secondary"),
        ("digits, epoch 2: impulse3 vs trunc_normal", "primary")]
    assert [c["id"] for c in conclusions["described"]] == ["digits: trunc_normal vs impulse5"]
    kernel = json.loads((repo / "reports/conclusions/kernel_table.json").read_text())
    assert kernel["conclusions"] == [] and [c["id"] for c in kernel["described"]] == ["digits: impulse3 vs impulse5"]
    summary = json.loads((repo / "reports/summary.json").read_text())
    assert summary["digits"]["ours"]["init"] == "impulse3"
    primary = summary["digits"]["primary"]
    assert primary["contrast"] == "impulse3 - trunc_normal" and primary["n"] == 2
    assert primary["ci95_low"] <= primary["diff"] <= primary["ci95_high"]      # scalars: dvc metrics diff subtracts
    assert (repo / "reports/figures/main/digits.png").read_bytes().startswith(b"\x89PNG")
    assert (repo / "reports/headline.md").read_text().startswith("| Method")
    assert 0 < summary["digits"]["trunc_normal"]["acc"] <= 100
    # the curves stage: every seed's curves from the cells just trained, nothing retrained
    run = sh(repo, "dvc", "repro", "curves")
    assert "Running stage 'curves'" in run.stdout and "Running stage 'train_" not in run.stdout
    curves = (repo / "reports/curves.csv").read_text().split("\n")
    assert curves[0] == "dataset,init,seed,epoch,train_acc,train_loss,test_acc,test_loss"
    rows = [line.split(",") for line in curves[1:] if line]
    assert len(rows) == 3 * 2 * 3                                # 3 cells x 2 seeds x 3 epochs
    assert ["digits", "impulse3", "1", "3"] in [r[:4] for r in rows]
    assert sorted({r[3] for r in rows if r[6]}) == ["2", "3"]   # test accuracy: evaluated epochs only
    assert (repo / "reports/figures/curves/digits.png").read_bytes().startswith(b"\x89PNG")
    # outputs DVC caches are git-ignored; what remains is what a user commits
    status = sh(repo, "git", "status", "--porcelain", "--untracked-files=all").stdout.split("\n")
    untracked = sorted(line[3:] for line in status if line.startswith("??"))
    assert all(p == "dvc.lock" or p.endswith(".gitignore") or p.split("/")[0] in ("results", "reports")
               for p in untracked), untracked
    assert not any(p.startswith(("data/", "models/", "artifacts/")) and not p.endswith(".gitignore")
                   for p in untracked)


def test_main_table_does_not_wait_for_studies(tiny_repo):
    repo, first = tiny_repo
    assert "Running stage 'study_" not in first.stdout and "Running stage 'aggregate'" in first.stdout


def test_study_stages_build_their_tables_reusing_main_cells(tiny_repo):
    repo, _ = tiny_repo
    r = sh(repo, "dvc", "repro", "pseudo_input_report")
    assert r.stdout.count("Running stage 'study_pseudo_input@") == 1      # only UP: PP is reused
    assert "Running stage 'train_" not in r.stdout
    table = (repo / "reports/pseudo_input.md").read_text()
    assert "P → P, shared (main grid)" in table and "U → P, shared" in table
    assert "seeds [0] (n = 1)" in table and "epochs 3 (paper 200)" in table
    r = sh(repo, "dvc", "repro")                              # everything else: the other two studies
    assert r.stdout.count("Running stage 'study_heads_width@") == 2      # h6 x 2 inits
    assert r.stdout.count("Running stage 'study_convmixer@") == 2
    for name in ("convmixer_filters", "heads_width"):
        assert "| digits" in (repo / f"reports/{name}.md").read_text()
    # on 1 seed, fewer than a verdict needs, every study describes its pairs (tests/test_study_reports.py: tested)
    for name in ("convmixer_filters", "pseudo_input", "heads_width", "data_size"):
        assert "## Estimates (descriptive: no verdict)" in (repo / f"reports/{name}.md").read_text(), name
    assert "recipe" in (repo / "reports/heads_width.md").read_text()
    # data size: 150 of the main grid's 300 images, at the main grid's 3 x 4 = 12 optimizer steps
    assert r.stdout.count("Running stage 'study_data_size@") == 2        # 0.5 x 2 inits
    size = (repo / "reports/data_size.md").read_text()
    assert "Steps held: digits 150 images (50 %): 6 epochs × 2 = 12 steps; digits 300 images (100 %): " \
           "3 epochs × 4 = 12 steps" in size
    assert (repo / "reports/figures/data_size/digits.png").exists()
    # each report says what the epoch evidence (results/evidence/epoch_budget) makes of its budget: here, that
    # it was not measured on these cells (its record names the committed cells, not the tiny ones)
    assert "digits: Epoch budget 3: " in size and "the main grid's budget, whose steps this study holds" in size
    for name in ("main_table", "attention", "pseudo_input", "heads_width"):
        assert "digits: Epoch budget 3: " in (repo / f"reports/{name}.md").read_text(), name
    # attention: every main-grid cell analysed (depth 1: one block), the report and its figures
    assert r.stdout.count("Running stage 'analyze_") == 3 and "Running stage 'train_" not in r.stdout
    attention = (repo / "reports/attention.md").read_text()
    assert "| Imp.-3 " in attention and "| Trunc Normal " in attention and "CKA" in attention
    figures = sorted(p.name for p in (repo / "reports/figures/attention").iterdir())
    assert figures == ["attention_images_digits.png", "attention_pseudo_digits.png",
                       "cka_between_inits_digits.png", "cka_init_vs_trained_digits.png",
                       "impulse_kernels_digits.png", "mean_distance_digits.png"]
    index = (repo / "reports/README.md").read_text()       # every table and figure, linked
    for name in ["main_table.md", "attention.md", "data_size.md", "figures/curves/digits.png",
                 "figures/data_size/digits.png"] + [f"figures/attention/{f}" for f in figures]:
        assert f"]({name})" in index, name


def test_second_repro_does_nothing(tiny_repo):
    repo, _ = tiny_repo
    again = sh(repo, "dvc", "repro")
    assert "Running stage" not in again.stdout
    assert "Data and pipelines are up to date" in again.stdout


def test_plots_render(tiny_repo):
    repo, _ = tiny_repo
    sh(repo, "dvc", "repro", "curves")                      # a no-op where an earlier test ran it
    shown = json.loads(sh(repo, "dvc", "plots", "show", "--json").stdout)
    assert set(shown) == {"data"}, shown.get("errors")           # an "errors" key if any failed
    assert set(shown["data"]) == {"test accuracy (%)", "train accuracy (%)", "test loss", "train loss"}


# slow: minutes of dvc repro (pytest -m slow); the default suite keeps tests/test_pipeline.py's tiny repro
@pytest.mark.slow
def test_one_cell_and_kernel_experiment_and_metrics_diff(tiny_repo):
    repo, _ = tiny_repo
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "tiny results")
    one = sh(repo, "dvc", "repro", "-f", "-s", "train_impulse@digits-5")
    assert one.stdout.count("Running stage") == 1
    exp = sh(repo, "dvc", "exp", "run", "-S", "init.kernel=5")
    assert "Running stage 'aggregate'" in exp.stdout
    assert "Running stage 'train" not in exp.stdout            # Imp.-5 is already trained
    diff = sh(repo, "dvc", "metrics", "diff").stdout
    assert "digits.ours.init" in diff or "digits.ours.acc" in diff, diff
    summary = json.loads((repo / "reports/summary.json").read_text())
    assert summary["digits"]["ours"]["init"] == "impulse5"


def test_kernel_outside_grid_and_missing_cell_fail_loudly(tiny_repo):
    repo, _ = tiny_repo
    bad = sh(repo, "dvc", "exp", "run", "-S", "init.kernel=7", check=False)
    assert bad.returncode != 0 and "params.yaml: init.kernel = 7: must be one of grid.kernels [3, 5]" in bad.stderr
    assert "Running stage 'train" not in bad.stdout and "Traceback" not in bad.stderr
    set_params(repo, **{"init.kernel": 5})                  # the failed exp left 7 in the workspace
    shutil.move(repo / "results/train/digits-impulse5/seed1", repo / "moved")
    try:
        r = sh(repo, "python", "-m", "stages.aggregate", "--out", str(repo / "scratch"), check=False)
        assert r.returncode != 0 and "digits-impulse5-1" in r.stderr
    finally:
        shutil.move(repo / "moved", repo / "results/train/digits-impulse5/seed1")


def test_what_a_change_of_grid_seeds_reruns(tiny_repo):
    """The README's promise: a seed added re-runs the main table's stages (each cell's seeds
    train together), not the studies' training. (`--dry` lists the stages stale now: the study
    reports read grid.seeds, for the main grid's SD of paired differences, so they are among them;
    reports_index follows once the reports change.)"""
    repo, _ = tiny_repo
    sh(repo, "dvc", "repro")                    # everything built (a no-op after the tests above)
    set_params(repo, **{"grid.seeds": [0, 1, 2]})
    try:
        dry = sh(repo, "dvc", "repro", "--dry").stdout
    finally:
        set_params(repo, **{"grid.seeds": [0, 1]})
    ran = {line.split("'")[1].split("@")[0] for line in dry.split("\n") if "Running stage" in line}
    assert ran == {"check_params", "preoptimize", "reference_solve", "train_baseline", "train_impulse",
                   "aggregate", "curves", "analyze_baseline", "analyze_impulse", "attention_report",
                   "convmixer_report", "pseudo_input_report", "heads_width_report", "data_size_report"}, ran


# slow: minutes of dvc repro (pytest -m slow); the default suite keeps tests/test_pipeline.py's tiny repro
@pytest.mark.slow
def test_shrunk_grid_leaves_no_stale_rows(tiny_repo):
    repo, _ = tiny_repo
    sh(repo, "dvc", "exp", "run", "-S", "grid.kernels=[3]", "-S", "init.kernel=3")
    table = (repo / "reports/main_table.md").read_text().split("## The paper's numbers")[0]
    assert "Imp.-3" in table and "Imp.-5" not in table


def test_a_dvc_remote_shares_every_trained_cell(tiny_repo, tmp_path):
    """Issue 14's shared cache: one machine pushes its DVC cache (datasets, pre-optimization
    artifacts, trained models, analyses) to a remote, here a local directory; a fresh clone
    pulls it and `dvc repro` has nothing to do: no stage re-runs, nothing retrained."""
    repo, _ = tiny_repo
    sh(repo, "dvc", "repro")                                 # whatever the tests above left stale
    sh(repo, "dvc", "remote", "add", "-d", "shared", str(tmp_path / "remote"))
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "results and the shared remote")
    pushed = sh(repo, "dvc", "push").stdout
    assert "pushed" in pushed, pushed
    clone = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", str(repo), str(clone))
    assert not (clone / "models").exists() or not any((clone / "models").rglob("*.pt"))
    sh(clone, "dvc", "pull")
    assert sorted(p.name for p in (clone / "models/digits-impulse3").iterdir()) == ["seed0.pt", "seed1.pt"]
    sh(clone, sys.executable, "-m", "compileall", "-q", "structinit")   # bytecode is not a change
    assert any((clone / "structinit/init").rglob("*.pyc"))
    assert "Data and pipelines are up to date" in sh(clone, "dvc", "status").stdout
    again = sh(clone, "dvc", "repro").stdout
    assert "Running stage" not in again, again
    assert sh(clone, "git", "status", "--porcelain").stdout == ""


# slow: minutes of dvc repro (pytest -m slow); the default suite keeps tests/test_pipeline.py's tiny repro
@pytest.mark.slow
def test_the_first_experiment_after_a_clone_retrains_unless_allow_missing(tiny_repo, tmp_path):
    """README, "Right after a clone": a clone has the committed results and reports but none
    of the DVC-tracked outputs (models, prepared data), so `dvc exp run -S init.kernel=5` would
    first retrain every cell; with --allow-missing only the stages that read `init` would run
    (the reports), and `aggregate` alone runs from the committed results: the headline becomes
    Imp.-5. Then back to the committed state."""
    repo, _ = tiny_repo
    set_params(repo, **{"grid.kernels": [3, 5], "init.kernel": 3})   # whatever an earlier test's experiment left
    sh(repo, "dvc", "repro")
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "committed run", check=False)      # nothing to commit after the remote test
    clone = tmp_path / "clone"
    sh(tmp_path, "git", "clone", "-q", str(repo), str(clone))
    # every cell counts as changed (its models are not there), so a plain run retrains it
    stale = json.loads(sh(clone, "dvc", "status", "--json").stdout)
    assert {"train_impulse@digits-3", "train_baseline@digits-trunc_normal"} <= set(stale), stale
    set_params(clone, **{"init.kernel": 5})
    cheap = sh(clone, "dvc", "repro", "--dry", "--allow-missing").stdout
    assert "Running stage 'aggregate'" in cheap and "Running stage 'train" not in cheap, cheap
    sh(clone, "git", "checkout", "--", "params.yaml")
    # the main table's stage: the attention report also reads init, and needs the analyses
    # (DVC-cached artifacts a clone does not have), so the README's command names `aggregate`
    exp = sh(clone, "dvc", "exp", "run", "--allow-missing", "-S", "init.kernel=5", "aggregate").stdout
    assert "Running stage 'aggregate'" in exp and "Running stage 'train" not in exp, exp
    assert json.loads((clone / "reports/summary.json").read_text())["digits"]["ours"]["init"] == "impulse5"
    # back to the committed state: the tracked files as committed
    sh(clone, "git", "checkout", "--", ".")
    assert sh(clone, "git", "status", "--porcelain").stdout == ""
    assert json.loads((clone / "reports/summary.json").read_text())["digits"]["ours"]["init"] == "impulse3"
