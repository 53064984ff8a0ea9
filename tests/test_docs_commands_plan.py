"""Every `dvc exp run -S ...` the README and docs/ show, run as far as DVC's own planning: in a
copy of the project whose every stage is up to date, with the command's -S values applied by
DVC's own writer, `dvc status` must list at least one stage that the changed keys feed (one that reads them, or
one they add). A command that changes nothing DVC would run (a study switched off, a dataset
that nothing downloads) fails here.

Nothing trains: each stage's outputs are stand-ins (an empty file or folder) recorded with
`dvc commit -f`, so that the default is clean, which is all DVC's planning looks at.
"""
import json
import shlex
import shutil

import pytest
import yaml

from test_pipeline import REPO, sh, tiny_repo_copy
from dvc.utils.hydra import apply_overrides as dvc_apply_overrides
from test_readme_commands import all_exp_runs

FILE_SUFFIXES = (".pt", ".json", ".md", ".csv", ".checked", ".png", ".yaml", ".txt")


@pytest.fixture(scope="module")
def clean_default(tmp_path_factory):
    """The project at the default params.yaml, every stage recorded as up to date."""
    repo = tiny_repo_copy(tmp_path_factory.mktemp("plan"))
    shutil.copy2(REPO / "params.yaml", repo / "params.yaml")          # the default, not the tiny grid
    from dvc.repo import Repo

    with Repo(str(repo)) as dvc:
        outs = [out for stage in dvc.index.stages for out in stage.outs]
        for out in outs:
            path = repo / out.def_path
            if path.suffix in FILE_SUFFIXES:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("stand-in\n")
            else:
                path.mkdir(parents=True, exist_ok=True)
                (path / "stand-in").write_text("stand-in\n")
    sh(repo, "dvc", "commit", "-f", "-q")
    assert json.loads(sh(repo, "dvc", "status", "--json").stdout or "{}") == {}
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "every stage recorded")
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    return repo, lock


def _overrides(command: str) -> list[str]:
    words = shlex.split(command)
    return [value for flag, value in zip(words, words[1:]) if flag == "-S"]


def _changed_keys(command: str) -> list[str]:
    return [value.split("=", 1)[0] for value in _overrides(command)]


def _target(command: str) -> list[str]:
    """The stage a command names after its options, if any."""
    words = shlex.split(command)
    return [words[-1]] if words[-2] != "-S" and not words[-1].startswith("-") else []


def _feeds(stage_params: dict, key: str) -> bool:
    """Does a stage that declares these params read `key` (the key, or a section holding it)?"""
    declared = [name for entry in stage_params.values() for name in entry]
    return any(key == d or key.startswith(d + ".") or d.startswith(key + ".") for d in declared)


def stages_fed(repo, lock: dict, command: str) -> tuple[list[str], dict]:
    """(the stages `dvc status` lists that the command's keys feed, the whole status), with the
    command's params applied to the clean default; params.yaml is restored after."""
    default = (repo / "params.yaml").read_text()
    try:
        # the -S values through DVC's own parser and writer (hydra's override grammar, what
        # `dvc exp run -S` applies): a value DVC would reject fails here. (`dvc exp run --dry`
        # itself cannot plan here: it works in a copy of the git-tracked files, without outputs.)
        dvc_apply_overrides(repo / "params.yaml", _overrides(command))
        target = _target(command)
        status = json.loads(sh(repo, "dvc", "status", "--json", *(target and [*target, "--with-deps"])).stdout or "{}")
    finally:
        (repo / "params.yaml").write_text(default)
    keys = _changed_keys(command)
    # check_params reads the whole file (its output never changes): it feeds nothing
    return [name for name in status if name != "check_params"       # a stage the keys add, or one that reads them
            and (name not in lock or any(_feeds(lock[name].get("params", {}), k) for k in keys))], status


@pytest.mark.parametrize("command", all_exp_runs())
def test_every_shown_experiment_would_run_a_stage_its_keys_feed(command, clean_default):
    fed, status = stages_fed(*clean_default, command)
    assert fed, f"{command}: no stage reading {_changed_keys(command)} would run (dvc status: {sorted(status)})"


def test_a_command_that_feeds_no_stage_is_caught(clean_default):
    """ImageNet's completeness switch with no ImageNet column: only check_params would run."""
    fed, status = stages_fed(*clean_default, "dvc exp run -S local_datasets.imagenet_require_full=false")
    assert fed == [] and list(status) == ["check_params"]
