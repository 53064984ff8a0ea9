"""The GPU runs' files in benchmarks/, one per card and commit, and which of them the docs quote.

- benchmarks/gpu_probe-<card>-<commit>.md: a run of benchmarks/gpu_probe.py (probe_name: the
  card's name lower case and dashed, without "NVIDIA", and the short commit). PRICED is the one
  tools/gpu_hours.py prices the grid from; to price from a newer one, name it here and run
  `python -m tools.gpu_hours --write`.
- benchmarks/fresh_repro-<card>-<commit>.md: the default's fresh-clone `dvc repro` on a GPU
  (benchmarks/fresh_repro.py --out-dir benchmarks). The README's GPU minutes are
  readme_gpu_default(): the newest complete one's, or a sentence saying none was timed
  (tests/test_first_screen.py holds the README to it).
"""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBES = REPO / "benchmarks"                           # where the committed GPU files live
PRICED = PROBES / "gpu_probe-h200-02d9857.md"          # the measurement tools/gpu_hours.py prices from
FRESH_GPU = "python -m benchmarks.fresh_repro --target '' --out-dir benchmarks"   # the command that times it


def card_slug(card: str) -> str:
    """A card's name (as torch gives it) in a file name: lower case, dashed, without "NVIDIA"."""
    return re.sub(r"[^a-z0-9]+", "-", card.lower()).strip("-").removeprefix("nvidia-")


def probe_name(card: str, commit: str) -> str:
    """"NVIDIA H200", "02d9857" -> gpu_probe-h200-02d9857.md."""
    return f"gpu_probe-{card_slug(card)}-{commit}.md"


def fresh_repro_name(card: str, commit: str) -> str:
    """Named as the probe's files: "NVIDIA H200", "02d9857" -> fresh_repro-h200-02d9857 and .md."""
    return f"fresh_repro-{card_slug(card)}-{commit}.md"


def probe_files(folder: Path = PROBES) -> list[Path]:
    return sorted(folder.glob("gpu_probe-*.md"))


def fresh_repro_files(folder: Path = PROBES) -> list[Path]:
    """The GPU fresh-clone files (the CPU's fresh_repro.md is not one)."""
    return sorted(folder.glob("fresh_repro-*.md"))


def read_fresh_repro(path: str | Path) -> dict:
    """A GPU fresh-clone file's card, commit, date (UTC) and minutes (None: the run was cut short,
    its headline has no "**N min**")."""
    text = Path(path).read_text()
    card = re.search(r"^Machine: one (.+?) \(", text, re.M)
    date = re.search(r"\bon (\d{4}-\d\d-\d\d \d\d:\d\d) UTC\b", text)
    commit = re.search(r"in a fresh clone of `([0-9a-f]{4,40})`", text)
    minutes = re.search(r"\*\*([\d.]+) min\*\*", text.split("\n", 1)[0])
    return {"card": card[1] if card else None, "date": date[1] if date else "", "commit": commit[1] if commit else None,
            "minutes": float(minutes[1]) if minutes else None}


def gpu_default_run(folder: Path = PROBES) -> tuple[Path, dict] | None:
    """The newest (by its date) complete GPU fresh-clone file with its figures; None where there is none."""
    runs = [(path, read_fresh_repro(path)) for path in fresh_repro_files(folder)]
    runs = [(path, run) for path, run in runs if run["minutes"] is not None and run["card"]]
    return max(runs, key=lambda r: (r[1]["date"], r[0].name)) if runs else None


def readme_gpu_default(folder: Path = PROBES) -> str:
    """The README's sentence on the default's `dvc repro` on a GPU (without its closing period)."""
    found = gpu_default_run(folder)
    if found is None:
        return f"The default's `dvc repro` on a GPU has not been timed yet by `{FRESH_GPU}`"
    path, run = found
    where = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    return (f"The default's `dvc repro` from a fresh clone took {run['minutes']:.1f} minutes on one "
            f"{run['card']} (`{where}`)")
