"""A number quoted in the README (or a docs page) is a generated file's text, verbatim:
every include block equals the file it names (structinit/reporting/readme.py), as committed."""
import re
import subprocess
from pathlib import Path

import pytest

from structinit.reporting import readme

REPO = Path(__file__).resolve().parents[1]


def test_every_quoted_block_matches_the_file_it_quotes():
    stale = readme.stale_blocks(REPO)
    assert not stale, f"run: python -m structinit.reporting.readme --write ({stale})"


def quoted(page: str) -> list[str]:
    return [path for path, _ in readme.includes((REPO / page).read_text())]


def test_the_readme_quotes_the_answer_and_the_docs_quote_the_evidence():
    """The README quotes the generated answer (sentence and table: docs/includes/readme_answer.md,
    tests/test_first_screen.py); docs/reports.md quotes the pipeline's own headline, and
    docs/scaling-out.md the GPU-hours table (checked by tests/test_first_screen.py)."""
    assert "docs/includes/readme_answer.md" in quoted("README.md")
    assert "reports/headline.md" in quoted("docs/reports.md")
    assert "docs/includes/gpu_hours.md" in quoted("docs/scaling-out.md")
    assert {"docs/reports.md", "docs/scaling-out.md"} <= set(readme.PAGES)


def test_the_readme_cpu_time_is_the_fresh_repro_files():
    """The README's "90 minutes" (not in an include block) is benchmarks/fresh_repro.md's time,
    rounded to the minute; tests/test_first_screen.py checks every other number it states."""
    minutes = float(re.search(r"\*\*([\d.]+) min\*\*", (REPO / "benchmarks/fresh_repro.md").read_text())[1])
    text = (REPO / "README.md").read_text()
    assert f"{round(minutes)} minutes on 2 CPU cores" in text
    assert "2 CPU cores" in (REPO / "benchmarks/fresh_repro.md").read_text()


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
