"""The committed epoch evidence (the epoch_budget stage's results/evidence/epoch_budget/epochs.csv,
.md) is what it says it is: one CPU, the pipeline's stacking and seeds, its 160-epoch row the
pipeline's own cells, and the evidence's trainer the pipeline's (cells_check.csv against
results/train). Whether the reports may quote it is tests/test_evidence.py's (its freshness)."""
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from structinit.evidence.epoch_budget import PIPELINE, cells_curves, pipeline_check, report
from structinit.reporting.budget import budget_finals

REPO = Path(__file__).resolve().parents[1]
CELLS = REPO / "results/train"
EPOCHS = "results/evidence/epoch_budget"
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())


@pytest.fixture(scope="module", autouse=True)
def committed_cells():
    """These files describe the committed run's cells: after a re-run (another CPU's bytes in
    results/train, uncommitted) there is nothing here to check."""
    changed = subprocess.run(["git", "status", "--porcelain", "--", "results/train"], cwd=REPO,
                             capture_output=True, text=True).stdout
    if changed.strip():
        pytest.skip("results/train differs from the committed cells (a re-run): the evidence describes those")


@pytest.fixture(scope="module")
def evidence() -> pd.DataFrame:
    return pd.read_csv(REPO / EPOCHS / "epochs.csv")


def made_at(report: str) -> str:
    """The commit that made a committed evidence report (and the .csv beside it), as its
    first-line label names it."""
    import re

    first = (REPO / report).read_text().splitlines()[0]
    found = re.match(rf"<!-- {re.escape(report)}: made at ([0-9a-f]{{7,40}}) by the trainer of that commit", first)
    assert found, f"{report}: no label naming the commit that made it: {first!r}"
    return found.group(1)


def trainer_changed_since(commit: str) -> list[str]:
    """The training stage's code files (train_impulse@digits-3's .py deps in the committed
    dvc.lock) whose content at `commit` differs from the code that trained the committed cells."""
    import hashlib

    deps = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]["train_impulse@digits-3"]["deps"]
    changed = []
    for dep in deps:
        if not dep["path"].endswith(".py"):
            continue
        then = subprocess.run(["git", "show", f"{commit}:{dep['path']}"], cwd=REPO, capture_output=True)
        if then.returncode or hashlib.md5(then.stdout).hexdigest() != dep["md5"]:
            changed.append(dep["path"])
    return changed


def same_trainer_as_the_cells(report: str) -> None:
    """A file compared with the cells bit for bit describes the trainer of the commit that made
    it: once the cells were re-trained by other code, the comparison says so (a skip naming
    both) instead of failing; its label in the file says the same. A file its stage made
    records the cells it read (inputs.json): it describes them while they are the workspace's."""
    from structinit.records import RECORD, evidence_freshness

    path = report
    if (REPO / path).parent.joinpath(RECORD).exists():
        fresh = evidence_freshness((REPO / path).parent, REPO)
        if not fresh.fresh:
            pytest.skip(f"{path} was made from other cells than the workspace's ({fresh})")
        return
    commit = made_at(report)
    changed = trainer_changed_since(commit)
    if changed:
        pytest.skip(f"{path} was made at {commit}; the committed cells were trained by other code since "
                    f"({', '.join(changed[:3])}{', ...' if len(changed) > 3 else ''}): it describes {commit}'s trainer")


def without_label(text: str) -> str:
    """A committed evidence file's text without its first-line label (an HTML comment)."""
    first, _, rest = text.partition("\n")
    return rest if first.startswith("<!--") else text


def test_every_budget_ran_on_the_committed_run_s_cpu_dtype_and_stacking(evidence):
    logged = {(p["cpu"], p["cpu_threads"], p["compute_dtype"]) for p in
              (yaml.safe_load(f.read_text()) for f in CELLS.glob("digits-*/seed*/params.yaml"))}
    assert len(logged) == 1
    cpu, threads, dtype = logged.pop()
    assert set(evidence.cpu) == {f"{cpu}, {threads} threads"} and set(evidence.dtype) == {dtype}
    assert set(evidence.stacking) == {"cell"}
    # every accuracy names the images it was counted on (the criterion's exact arithmetic)
    from structinit.data.specs import TEST_IMAGES
    assert (evidence.evaluated == TEST_IMAGES["digits"]).all()
    assert sorted(set(evidence.seed)) == PARAMS["grid"]["seeds"]
    # every budget has every arm at every seed
    finals = budget_finals(evidence)
    assert (finals.groupby("budget").size() == len(set(finals.init)) * len(PARAMS["grid"]["seeds"])).all()


def test_the_recipe_s_budget_is_the_pipeline_s_own_cells(evidence):
    same_trainer_as_the_cells(f"{EPOCHS}/epochs.md")        # and the epochs.csv it reports
    epochs = PARAMS["recipes"]["digits"]["train"]["epochs"]
    here = evidence[evidence.budget == epochs]
    assert set(here.source) == {PIPELINE} and set(evidence[evidence.budget != epochs].source) == {"benchmark"}
    cells = cells_curves(CELLS, list(dict.fromkeys(here.init)), sorted(set(here.seed)))
    merged = here.merge(cells, on=["init", "seed", "epoch"], suffixes=("", "_cells"), how="outer", indicator=True)
    assert (merged._merge == "both").all() and (merged.test_acc == merged.test_acc_cells).all()


def test_the_evidence_trains_what_the_pipeline_trained():
    """cells_check.csv: the evidence at the recipe's budget, its runs equal to
    the cells' at every epoch both evaluated (the same accuracies to the 3 decimals kept)."""
    same_trainer_as_the_cells(f"{EPOCHS}/cells_check.md")   # and its .csv
    check = pd.read_csv(REPO / EPOCHS / "cells_check.csv")
    assert set(check.source) == {"benchmark"}
    cells = cells_curves(CELLS, list(dict.fromkeys(check.init)), sorted(set(check.seed)))
    both = check.merge(cells, on=["init", "seed", "epoch"], suffixes=("", "_cells"))
    runs = check.groupby(["init", "seed"]).ngroups
    assert len(both) == len(check) and runs >= 5 and len(both) >= runs * 16
    assert (both.test_acc == both.test_acc_cells).all() and (both.test_loss == both.test_loss_cells).all()
    said = f"{runs} of {runs} runs identical in test accuracy and test loss (to the bit)"
    assert said in pipeline_check(check, CELLS, 1.0)
    assert said in without_label((REPO / EPOCHS / "cells_check.md").read_text())


def test_the_committed_report_is_generated_from_the_committed_file(evidence):
    same_trainer_as_the_cells(f"{EPOCHS}/epochs.md")      # its check against the cells is that trainer's
    params = PARAMS
    primary = tuple(x.strip().replace("ours", f"impulse{params['init']['kernel']}")
                    for x in params["contrasts"]["primary"].split(" vs "))
    text = report(evidence, 1.0, sorted(set(evidence.seed)), False, "unused",
                  pipeline_check(evidence, CELLS, 1.0), primary)
    assert text == without_label((REPO / EPOCHS / "epochs.md").read_text())


def test_each_evidence_file_names_what_made_it():
    """A file made by hand before its stage existed (no inputs.json beside it) names the commit
    that made it in its first line; one its stage made is that stage's output as dvc.lock
    records it (the folder's hash), so its provenance is the lock's: checked here against the
    workspace, file by file through the folder's hash."""
    from structinit.records import EVIDENCE, RECORD, workspace_hashes

    lock = yaml.safe_load((REPO / "dvc.lock").read_text())["stages"]
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip() == "true"
    for path in (f"{EPOCHS}/epochs.md", f"{EPOCHS}/cells_check.md", "results/evidence/replication/replication.md",
                 "results/evidence/regime/regime.md"):
        folder = str(Path(path).parent)
        if (REPO / folder / RECORD).exists():
            stage = next(name for name, e in EVIDENCE.items() if e.folder == folder)
            recorded = {o["path"]: o["md5"] for o in lock[stage]["outs"]}
            assert workspace_hashes([folder], REPO)[folder] == recorded[folder], \
                f"{folder} is not what dvc.lock records its stage {stage} wrote"
        elif not shallow:                       # a shallow clone has not the commits the labels name
            commit = made_at(path)
            assert subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO).returncode == 0, commit
