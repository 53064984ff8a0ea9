"""A copy made while an evidence stage runs (the documented `dvc unfreeze <stage> && dvc repro -f
-s <stage>`) must not run that stage again inside the copy: the replication stage's copy once ran
its own `dvc repro aggregate`, which, finding `replication` unfrozen in the copied dvc.yaml and
its outputs gone, ran it nested and failed an hour in."""
import shutil
import subprocess

import yaml

from structinit.pipeline import scratch

REPO = scratch.REPO
TARGET = "dvc.yaml"


def committed_files(path: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", path], capture_output=True, text=True, check=True)
    return sorted(out.stdout.split())


def test_a_copy_made_while_an_evidence_stage_runs_has_it_frozen_with_its_committed_outputs(tmp_path):
    copy = scratch.copy_working_tree(tmp_path / "repo", with_outputs=("dvc.lock",))
    # as `dvc unfreeze replication` and the start of `dvc repro -f -s replication` leave the workspace
    stages = yaml.safe_load((copy / TARGET).read_text())
    stages["stages"]["replication"].pop("frozen")
    (copy / TARGET).write_text(yaml.safe_dump(stages, sort_keys=False))
    shutil.rmtree(copy / "results/evidence/replication")

    scratch.evidence_frozen(copy)
    assert (copy / TARGET).read_bytes() == subprocess.run(["git", "-C", str(REPO), "show", "HEAD:dvc.yaml"],
                                                          capture_output=True, check=True).stdout
    assert yaml.safe_load((copy / TARGET).read_text())["stages"]["replication"]["frozen"] is True
    files = committed_files("results/evidence/replication")
    assert files and all((copy / f).read_bytes() == subprocess.run(
        ["git", "-C", str(REPO), "show", f"HEAD:{f}"], capture_output=True, check=True).stdout for f in files)
    # and DVC reads it so: a frozen stage is one `dvc repro` never runs
    scratch.commit(copy)
    from dvc.repo import Repo
    with Repo(str(copy)) as repo:
        assert all(stage.frozen for stage in repo.stage.collect("replication"))
