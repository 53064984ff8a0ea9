"""Names a user reads in messages, comments and generated reports point at things that exist:
every file name (.py, .md, .yaml, .txt, .sh, .toml, .csv) the code, params.yaml,
pyproject.toml, run.sh and the generated reports name
(`stream_train.py`, `data.py` once did not), every README section they cite by title (`README
"What is reproducible"` once moved to docs/reproducibility.md), and every docs anchor
(`docs/pipeline.md#speed`). tests/test_readme_commands.py covers the docs pages' own paths."""
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", ".git", ".cache", ".dvc", "data", "models", "logs", "artifacts", "node_modules"}
SOURCES = sorted(p for d in ("structinit", "stages", "scale", "benchmarks", "tools")
                 for p in (REPO / d).rglob("*.py")) + [
    REPO / "params.yaml", REPO / "pyproject.toml", REPO / "run.sh", REPO / "dvc.yaml",
    *sorted((REPO / "reports").rglob("*.md"))]
# a file name: code, docs, config, data tables; not inside ${...} or {...} (shell and f-string
# expressions such as {a.csv} or ${VAR-constraints.txt}, which name no file)
FILE_NAME = re.compile(r"(?<![\w./{}-])((?:[\w-]+/)*[\w.-]*[\w-]\.(?:py|md|yaml|txt|sh|toml|csv))\b")
# README "Title", README 'Title', README, "Title", README: Title (up to a closing bracket or period)
README_SECTION = re.compile(r"README(?:'s)?(?:,? \"([^\"]+)\"| '([^']+)'|: ([A-Z][\w -]+?)(?=[).,;]|$))", re.M)
ANCHOR = re.compile(r"((?:docs/)?[\w-]+\.md)#([\w-]+)")

# Named on purpose though not in this repository, each for its reason.
NOT_OURS = {
    "dvc/stage/run.py": "DVC's own source, cited for its behaviour",
    "shared/method.md": "the method page beside the project (../shared), read-only",
    "a/__init__.py": "an example in the import-closure docstring",
    "init/methods/X.py": "a placeholder for your initializer's file",
    "methods/X.py": "a placeholder for your initializer's file",
    "structinit/init/methods/zero_qk.py": "the example initializer docs/library.md has you write",
    "a.csv": "stages/curves.py's argument a.csv (argparse's --csv), not a file name",
    "runs.csv": "the regime stage's table of runs (results/evidence/regime/), written when the study runs",
    "window.md": "the GPU window's summary, written in its --out when it runs (benchmarks/gpu_session.py)",
    "cuda_tests.txt": "the GPU window's test output, written in its --out when it runs",
    "results/evidence/fashion_mnist_budget/epochs.csv": "Fashion-MNIST's budget rows, written when a GPU runs it",
}


@functools.cache
def _repo_files() -> tuple[set[str], set[str]]:
    rel, names = set(), set()
    for p in REPO.rglob("*"):
        parts = p.relative_to(REPO).parts
        if parts and parts[0] in SKIP_DIRS:
            continue
        rel.add(p.relative_to(REPO).as_posix())
        names.add(p.name)
    return rel, names


def missing_file_names(text: str, rel: set[str], names: set[str]) -> list[str]:
    """File names in `text` that match no file: a bare name matches any file of that name, a
    path the repository path or the tail of one (`training/streamed.py`)."""
    out = []
    for m in FILE_NAME.finditer(text):
        name = m.group(1)
        found = name in rel or any(r.endswith("/" + name) for r in rel) if "/" in name else name in names
        if not found and name not in NOT_OURS:
            out.append(name)
    return out


def headings(page: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in page.read_text().splitlines() if line.startswith("#")]


def anchor(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def stale_references(text: str) -> list[str]:
    """README sections cited by title that the README does not have, and docs anchors that
    their page does not have."""
    out = []
    readme = {h.lower() for h in headings(REPO / "README.md")}
    for m in README_SECTION.finditer(text):
        title = next(g for g in m.groups() if g)
        if title.lower() not in readme:
            out.append(f'README "{title}"')
    for m in ANCHOR.finditer(text):
        page = REPO / m[1] if (REPO / m[1]).exists() else REPO / "docs" / m[1]
        if not page.exists() or m[2] not in {anchor(h) for h in headings(page)}:
            out.append(f"{m[1]}#{m[2]}")
    return out


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_name_a_message_or_comment_gives_exists(source):
    rel, names = _repo_files()
    text = source.read_text()
    assert not missing_file_names(text, rel, names), "names no file in the repository"
    assert not stale_references(text), "cites a section or anchor that does not exist"


def test_docs_pages_cite_existing_readme_sections_and_anchors():
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        assert not stale_references(page.read_text()), page.name


def test_the_names_the_issue_found_stale_are_caught():
    """Each stale name issue 34 listed, as it read before the fix, is caught by the checks above."""
    rel, names = _repo_files()
    assert missing_file_names("the streamed trainer (stream_train.py)", rel, names) == ["stream_train.py"]
    assert missing_file_names("Loading the data is data.py's job", rel, names) == ["data.py"]
    assert missing_file_names("pinned in requirements.lock.txt (run.sh)", rel, names) == ["requirements.lock.txt"]
    assert missing_file_names("see dvc.template.yaml and constraints.txt", rel, names) == ["dvc.template.yaml"]
    assert stale_references('pin (README "What is reproducible").') == ['README "What is reproducible"']
    assert stale_references("see README 'What is reproducible'); comparing") == ['README "What is reproducible"']
    assert stale_references("streamed from local_datasets.imagenet (README: Scaling out)") == [
        'README "Scaling out"']
    assert stale_references("[Speed](docs/pipeline.md#no-such-section)") == ["docs/pipeline.md#no-such-section"]
    # and the fixed spellings pass
    assert missing_file_names("(training/streamed.py, data/tensors.py)", rel, names) == []
    assert stale_references("(docs/reproducibility.md) [Speed](pipeline.md#speed)") == []


def test_the_reports_index_names_where_its_stages_are_described():
    """reports/README.md (generated) once sent readers to stage names 'in the main README', which
    lists none; the generator now points at docs/pipeline.md, which does."""
    from structinit.reporting import index

    source = Path(index.__file__).read_text()
    assert "in the main README" not in source and "docs/pipeline.md" in source
    assert "stage" in (REPO / "docs/pipeline.md").read_text()
