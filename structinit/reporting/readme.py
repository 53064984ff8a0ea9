"""Numbers in the docs come from generated files: a marked block in a markdown page holds a
generated file's text, verbatim.

    <!-- include: reports/headline.md -->
    ...the file's text...
    <!-- end include -->

    python -m structinit.reporting.readme            # which blocks are stale (exit 1 if any)
    python -m structinit.reporting.readme --write    # refresh them from their files

tests/test_readme_numbers.py fails when a block differs from the file it quotes, so a number
in the README cannot outlive the report it came from.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

BLOCK = re.compile(r"(<!-- include: (?P<path>[^ ]+) -->\n)(?P<body>.*?)(<!-- end include -->)", re.S)
PAGES = ("README.md", "docs/pipeline.md", "docs/reports.md", "docs/studies.md")


def includes(text: str) -> list[tuple[str, str]]:
    """[(included path, the block's body)] in the page's order."""
    return [(m["path"], m["body"]) for m in BLOCK.finditer(text)]


def refreshed(text: str, root: Path) -> str:
    """The page with every block's body replaced by its file's current text."""
    def fill(m):
        source = root / m["path"]
        if not source.exists():
            raise FileNotFoundError(f"an include block quotes {m['path']}, which does not exist")
        body = source.read_text()
        return m.group(1) + body + ("" if body.endswith("\n") else "\n") + m.group(4)
    return BLOCK.sub(fill, text)


def stale_blocks(root: Path) -> list[str]:
    """'page: path' for every block whose text differs from its file."""
    out = []
    for page in PAGES:
        path = root / page
        if path.exists():
            text = path.read_text()
            fresh = includes(refreshed(text, root))
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
    stale = stale_blocks(root)
    for s in stale:
        print(f"stale: {s}")
    return stale


if __name__ == "__main__":
    main()
