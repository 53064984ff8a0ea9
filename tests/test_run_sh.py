"""run.sh answers `help` (and no argument) at once, before any set-up, and checks its
prerequisites with a clear message before minutes of set-up."""
import os
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_sh(*args, env_extra=None, path=None):
    env = dict(os.environ, **(env_extra or {}))
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["bash", str(REPO / "run.sh"), *args], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.parametrize("args", [(), ("help",), ("--help",), ("-h",)])
def test_help_answers_at_once_and_builds_nothing(tmp_path, args):
    venv = tmp_path / "venv"
    start = time.perf_counter()
    r = run_sh(*args, env_extra={"VENV": str(venv)})
    assert r.returncode == 0, r.stderr
    assert "./run.sh repro" in r.stdout and "./run.sh test" in r.stdout and "Python >= 3.11" in r.stdout
    assert time.perf_counter() - start < 10
    assert not venv.exists()                       # no set-up ran


def fake_bin(tmp_path, python_version: str) -> str:
    """A PATH holding a python3 that reports `python_version`, and the real git/sed/cat."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    major, minor = python_version.split(".")
    (bin_dir / "python3").write_text(
        "#!/bin/sh\n"
        f'case "$1" in --version) echo "Python {python_version}.0";; '
        f"-c) exit {1 if (int(major), int(minor)) < (3, 10) else 0};; esac\n")
    (bin_dir / "python3").chmod(0o755)
    for tool in ("git", "sed", "cat", "dirname", "bash", "env"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def test_an_old_python_is_named_before_any_set_up(tmp_path):
    venv = tmp_path / "venv"
    r = run_sh("repro", env_extra={"VENV": str(venv)}, path=fake_bin(tmp_path, "3.8"))
    assert r.returncode == 2
    assert "Python 3.8.0 found; ./run.sh needs Python >= 3.11" in r.stderr
    assert not venv.exists()


def test_a_missing_git_is_named_before_any_set_up(tmp_path):
    bin_dir = Path(fake_bin(tmp_path, "3.11"))
    (bin_dir / "git").unlink()
    venv = tmp_path / "venv"
    r = run_sh("repro", env_extra={"VENV": str(venv)}, path=str(bin_dir))
    assert r.returncode == 2 and "git not found" in r.stderr
    assert not venv.exists()
