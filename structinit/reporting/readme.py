"""Numbers in the docs come from generated files: a marked block in a markdown page holds a
generated file's text, verbatim.

    <!-- include: reports/headline.md -->
    ...the file's text...
    <!-- end include -->

    python -m structinit.reporting.readme            # which blocks are stale (exit 1 if any)
    python -m structinit.reporting.readme --write    # refresh them from their files

tests/test_readme_numbers.py fails when a block differs from the file it quotes, so a number
in the README cannot outlive the report it came from. A page as committed quotes the files as
committed: after a run on another CPU (other bytes in reports/), an unedited README is
checked against the committed reports, not the workspace's. The price: reports regenerated
and not yet committed, with the README left as it is, pass locally; `python -m
structinit.reporting.readme` (workspace against workspace) says so before the commit, and a
clean clone's suite after it.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

BLOCK = re.compile(r"(<!-- include: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- end include -->)", re.S)
# the README and every docs page: a page added to docs/ is refreshed and checked without a list to edit
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (Path(__file__).resolve().parents[2] / "docs").glob("*.md")))


def includes(text: str) -> list[tuple[str, str]]:
    """[(included path, the block's body)] in the page's order."""
    return [(m["path"], m["body"]) for m in BLOCK.finditer(text)]


def refreshed(text: str, root: Path, read=None) -> str:
    """The page with every block's body replaced by its file's text: read(path), the workspace
    file by default."""
    read = read or _workspace_reader(root)

    def fill(m):
        body = read(m["path"])
        return m.group(1) + body + ("" if body.endswith("\n") else "\n") + m.group(4)
    return BLOCK.sub(fill, text)


def _workspace_reader(root: Path):
    def read(path: str) -> str:
        source = root / path
        if not source.exists():
            raise FileNotFoundError(f"an include block quotes {path}, which does not exist")
        return source.read_text()
    return read


def committed_text(root: Path, path: str) -> str | None:
    """`path` as HEAD has it (None outside git, or where HEAD lacks it)."""
    r = subprocess.run(["git", "show", f"HEAD:{path}"], cwd=root, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def stale_blocks(root: Path, committed: bool = True) -> list[str]:
    """'page: path' for every block whose text differs from its file. committed: a page whose
    text is HEAD's quotes the files as HEAD has them (a re-run's other bytes in the workspace
    do not make the committed README stale); an edited page quotes the workspace's."""
    workspace = _workspace_reader(root)

    def as_committed(path: str) -> str:
        head = committed_text(root, path)
        return head if head is not None else workspace(path)

    out = []
    for page in PAGES:
        path = root / page
        if path.exists():
            text = path.read_text()
            read = as_committed if committed and committed_text(root, page) == text else workspace
            fresh = includes(refreshed(text, root, read))
            out += [f"{page}: {p}" for (p, body), (_, new) in zip(includes(text), fresh) if body != new]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="refresh the blocks from their files")
    ap.add_argument("--root", default=".")
    a = ap.parse_args()
    root = Path(a.root)
    try:
        stale = _run(root, a.write)
    except FileNotFoundError as e:
        sys.exit(f"{e}: run dvc repro first")
    sys.exit(1 if stale else 0)


def _run(root: Path, write: bool) -> list[str]:
    """Refresh the blocks (write) or not; print and return the stale ones."""
    if write:
        for page in PAGES:
            path = root / page
            if path.exists():
                path.write_text(refreshed(path.read_text(), root))
    stale = stale_blocks(root, committed=False)
    for s in stale:
        print(f"stale: {s}")
    return stale


if __name__ == "__main__":
    main()
