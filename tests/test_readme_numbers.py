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
    tests/test_first_screen.py); the pipeline's own headline, the epoch evidence and the
    timings are quoted in the docs pages readme.py checks, the GPU-hours table in
    docs/scaling-out.md (checked by tests/test_first_screen.py)."""
    assert "docs/includes/readme_answer.md" in quoted("README.md")
    assert "reports/headline.md" in quoted("docs/reports.md")
    assert "benchmarks/fresh_repro.md" in quoted("docs/pipeline.md")
    # the epoch evidence is quoted there while it is fresh, and only then (tests/test_evidence.py)
    from tests.test_evidence import committed_freshness
    assert (("results/evidence/epoch_budget/epochs.md" in quoted("docs/pipeline.md"))
            == committed_freshness()["epoch_budget"].fresh)
    assert "docs/includes/gpu_hours.md" in quoted("docs/scaling-out.md")
    assert {"docs/pipeline.md", "docs/reports.md"} <= set(readme.PAGES)


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


def test_the_start_up_figures_in_the_docs_are_the_benchmark_files():
    """docs/pipeline.md's start-up paragraph quotes benchmarks/stage_startup.out.txt (the
    benchmark's own output, committed with its command): each "min / median" pair there is a row
    of that table, after (this checkout) or before (the baseline)."""
    text = (REPO / "docs/pipeline.md").read_text()
    paragraph = text[text.index("**Start-up.**"):text.index("measures all of it")]
    table = (REPO / "benchmarks/stage_startup.out.txt").read_text()
    pairs = set()
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for cell in cells[1:]:
            m = re.fullmatch(r"(\d+\.\d+) / +(\d+\.\d+)", cell)
            if m:
                pairs.add((m[1], m[2]))
    quoted_pairs = re.findall(r"(\d+\.\d+) / (\d+\.\d+)", paragraph)
    assert len(quoted_pairs) >= 6
    assert not [p for p in quoted_pairs if p not in pairs], f"not in benchmarks/stage_startup.out.txt: {quoted_pairs}"
    # after first, then before, for the rows quoted both ways
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip().strip("|").split("|")]
                                              for line in table.splitlines() if line.startswith("| "))}
    for row in ("check_params (whole stage)", "import stages.preoptimize", "import stages.attention_report",
                "train digits cell: start to first step"):
        after, before = (re.sub(r" +", " ", c) for c in rows[row])
        assert after in paragraph and before in paragraph and paragraph.index(after) < paragraph.index(before), row


def test_the_reference_solve_figures_in_the_docs_are_the_benchmark_files():
    text = (REPO / "docs/pipeline.md").read_text()
    said = text[text.index("benchmarks.reference_solve_speed` measures it"):][:400]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in (REPO / "benchmarks/reference_solve_speed.out.txt").read_text().splitlines()
            if line.startswith("| ") and "way" not in line]
    stacked = min(float(r[3]) for r in rows if r[0].startswith("stacked"))
    alone = sorted(float(r[3]) for r in rows if r[0].startswith("one by one"))
    assert f"**{stacked:.2f} s** per kernel stacked against {alone[0]:.2f}-{alone[-1]:.2f} s" in said
    assert "same bits: yes" in (REPO / "benchmarks/reference_solve_speed.out.txt").read_text()
