"""A number quoted in the README (or a docs page) is a generated file's text, verbatim:
every include block equals the file it names (structinit/reporting/readme.py), as committed."""
import subprocess
from pathlib import Path

import pytest

from structinit.reporting import readme

REPO = Path(__file__).resolve().parents[1]


def test_every_quoted_block_matches_the_file_it_quotes():
    stale = readme.stale_blocks(REPO)
    assert not stale, f"run: python -m structinit.reporting.readme --write ({stale})"


def test_the_readme_quotes_the_main_result_and_the_epoch_evidence():
    quoted = [path for path, _ in readme.includes((REPO / "README.md").read_text())]
    assert "reports/headline.md" in quoted and "benchmarks/epochs.md" in quoted


def test_a_changed_number_is_caught(tmp_path):
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports/headline.md").write_text("Imp.-3 95.10\n")
    (tmp_path / "README.md").write_text(
        "x\n<!-- include: reports/headline.md -->\nImp.-3 95.10\n<!-- end include -->\n")
    assert readme.stale_blocks(tmp_path) == []
    (tmp_path / "reports/headline.md").write_text("Imp.-3 94.80\n")
    assert readme.stale_blocks(tmp_path) == ["README.md: reports/headline.md"]
    (tmp_path / "reports/headline.md").unlink()
    with pytest.raises(FileNotFoundError, match="reports/headline.md"):
        readme.stale_blocks(tmp_path)


def _git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                   capture_output=True)


def test_the_committed_readme_quotes_the_committed_files_not_a_reruns(tmp_path):
    """After ./run.sh repro on another CPU the workspace's reports hold other numbers; the
    README, unedited, still quotes the committed ones, and the suite passes. An edited README
    is checked against the workspace's files (what --write would put there)."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports/headline.md").write_text("Imp.-3 95.10\n")
    (tmp_path / "README.md").write_text(
        "x\n<!-- include: reports/headline.md -->\nImp.-3 95.10\n<!-- end include -->\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "run")
    (tmp_path / "reports/headline.md").write_text("Imp.-3 94.80\n")          # a re-run elsewhere
    assert readme.stale_blocks(tmp_path) == []
    assert readme.stale_blocks(tmp_path, committed=False) == ["README.md: reports/headline.md"]
    (tmp_path / "README.md").write_text(                                     # an edit of the page
        "y\n<!-- include: reports/headline.md -->\nImp.-3 95.10\n<!-- end include -->\n")
    assert readme.stale_blocks(tmp_path) == ["README.md: reports/headline.md"]
