"""Every `dvc exp run -S ...` the README shows passes params.yaml's checks (check_params would
otherwise refuse it before any stage runs)."""
import re
import shlex
from pathlib import Path

import pytest
import yaml

from structinit.pipeline.params import validate_params

REPO = Path(__file__).resolve().parents[1]


def readme_exp_runs() -> list[str]:
    text = (REPO / "README.md").read_text().replace("\\\n", " ")      # join continued lines
    return [m.group(0) for m in re.finditer(r"dvc exp run[^\n`#]*", text)]


def apply_overrides(params: dict, command: str) -> dict:
    words = shlex.split(command)
    for flag, value in zip(words, words[1:]):
        if flag == "-S":
            key, raw = value.split("=", 1)
            *path, last = key.split(".")
            node = params
            for part in path:
                node = node[part]
            node[last] = yaml.safe_load(raw)
    return params


def test_readme_shows_experiments():
    assert len(readme_exp_runs()) >= 8


@pytest.mark.parametrize("command", readme_exp_runs())
def test_every_readme_experiment_is_a_valid_params_file(command):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    validate_params(apply_overrides(params, command))
