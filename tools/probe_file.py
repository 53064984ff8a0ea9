"""The GPU probe's files: their names, their layout (section titles and row labels) and how one is read.

benchmarks/gpu_probe.py measures a GPU and writes this layout; tools/gpu_hours.py prices the
paper's grid from a committed file through read_probe. Both take the layout from here, so the
reader parses what the writer writes (tests/test_gpu_probe.py holds both to it), and the
measurement and the tool do not import each other.

Which file is priced. Each run on a GPU is committed as its own file, side by side:
benchmarks/gpu_probe-<card>-<commit>.md (probe_name: the card's name lower case and dashed,
without "NVIDIA", and the short commit the probe ran at; the file names both inside too). The
grid is priced from one of them, PRICED, named here and nowhere else: a newer run prices the
grid once this line names its file (then `python -m tools.gpu_hours --write` and `python -m
tools.readme_answer --write`, which the README and docs quote); `--probe` prices from another
file without changing it. The other files beside it are measurements, not prices.

The default's `dvc repro` on a GPU. benchmarks/fresh_repro.py, run on a GPU machine with
`--out-dir benchmarks` (benchmarks/gpu_session.py runs it after the probe), writes its own file
per card and commit beside the probe's: benchmarks/fresh_repro-<card>-<commit>.md
(fresh_repro_name); the CPU's run stays benchmarks/fresh_repro.md. The README's GPU minutes for
the default are readme_gpu_default(): the newest complete such file's, or a sentence that says
they were not measured (tests/test_first_screen.py holds the README to it).
"""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROBES = REPO / "benchmarks"                           # where the committed probe files live
PRICED = PROBES / "gpu_probe-h200-02d9857.md"          # the measurement tools/gpu_hours.py prices from
TINY_LABEL = "tiny (CPU): not a measurement"

# Section titles and row labels: the writer (benchmarks/gpu_probe.py) and read_probe share them.
SECTIONS = {
    "machine": "## Machine",
    "a": "## (a) The suite's GPU-relevant tests",
    "b": "## (b) One training step alone",
    "c": "## (c) The trainer end to end, CIFAR-shaped data, the paper's recipe",
    "d": "## (d) One digits cell: 5 seeds x 160 epochs, Imp.-3",
    "e": "## (e) One process under torchrun",
    "f": "## (f) One cell trained twice: the same bytes?",
    "g": "## (g) Where the time goes: one training step profiled",
    "h": "## (h) Fashion-MNIST's recipe: a stacked cell's rate, and its main grid's time",
}
# what every committed probe file has; (g) and (h) came later: a file written before them lacks them
REQUIRED_SECTIONS = ("machine", "a", "b", "c", "d", "e", "f")
# (g)'s two profiles, each under its own heading, and the rows and columns the tests read
PROFILE_HEADINGS = {"vit": "### ViT-T/2, the paper's CIFAR recipe", "digits": "### digits, the default cell's stack"}
PROFILE_TOP = 15                                       # kernels (or, on the CPU, ops) listed per profile
LAUNCHES_ROW = "kernel launches per step"
SHARE_COLUMN = "share of the step's device time"
MODE_ROW, CARD_ROW, COMMIT_ROW = "mode", "card", "commit"
MATMUL_ROW = "bf16 matmul rate, TFLOP/s (max / median)"
FLOPS_ROW = "FLOPs per training image, GFLOP"
EAGER_ROW, COMPILED_ROW = "plain timm module, eager", "plain timm module, torch.compile"
TRAINER_ROW, STACK_ROW = "the project's trainer, 1 model", "the project's trainer, stack of"   # ... N
RATE_ROW = "ViT-T/2 images/s, epoch 2"
RATES_ROW = "images/s, epochs 2 and later: min / median"
FIRST_ROW = "epoch 1 (warm-up), s"
PEAK_ROW = "peak memory (torch.cuda.max_memory_allocated), GiB"
ESTIMATE_ROW = "memory estimate the trainer printed, GiB"
RATIO_ROW = "estimate / peak"
NOT_MEASURED = "not measured"
FM_RATE_ROW = "cell images/s (every seed stacked), epochs 2 and later: median"
FM_ALONE_ROW = "model-images/s, one model of the recipe alone (as a cell trains one after another): median"
FM_GRID_ROW = "the main grid's cells, min (training and evaluation; stage start-ups not included)"
FM_DEPTHS_HEADING = "### The recipe at other depths: the main grid's time as DVC runs it"   # (h), --fm-depths
FM_DEEPEST_ROW = "the deepest of these whose grid fits the target"


def probe_name(card: str, commit: str) -> str:
    """The file name of a probe run on `card` (its name, as torch gives it) at `commit`:
    "NVIDIA H200", "02d9857" -> gpu_probe-h200-02d9857.md."""
    return f"gpu_probe-{card_slug(card)}-{commit}.md"


def card_slug(card: str) -> str:
    """A card's name (as torch gives it) in a file name: lower case, dashed, without "NVIDIA"."""
    return re.sub(r"[^a-z0-9]+", "-", card.lower()).strip("-").removeprefix("nvidia-")


def probe_files(folder: Path = PROBES) -> list[Path]:
    """The committed probe files, one per card and commit (PRICED among them)."""
    return sorted(folder.glob("gpu_probe-*.md"))


class ProbeFileError(ValueError):
    """A probe file that cannot price the grid: missing, a tiny run, or without the rate."""


def number(cell: str) -> float | None:
    """The first number in a cell ("5,032", "13.22 / 13.30"); None where there is none."""
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", cell or "")
    return float(m[0].replace(",", "")) if m else None


def parse_tables(text: str) -> dict[str, list[dict]]:
    """{section title: [row as {header: cell}]} for every table of the file."""
    sections: dict[str, list[dict]] = {}
    title, headers = "", None
    for line in text.splitlines():
        if line.startswith("## "):
            title, headers = line.strip(), None
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if headers is None:
                headers = cells
            elif not set(line.replace("|", "").strip()) <= set("-: "):
                sections.setdefault(title, []).append(dict(zip(headers, cells)))
        else:
            headers = None
    return sections


def read_probe(path: str | Path = PRICED) -> dict:
    """What gpu_hours needs from a probe file: the card, the commit, torch, the ViT-T/2 rate
    end to end (img/s of epoch 2), the TFLOP/s it is (counted FLOPs), and the memory figures
    (None where not measured). ProbeFileError where the file cannot give a rate."""
    path = Path(path)
    if not path.exists():
        raise ProbeFileError(f"{path}: no such probe file; run python -m benchmarks.gpu_probe on a GPU")
    tables = parse_tables(path.read_text())

    def value(section: str, what: str, column: str = "value") -> str | None:
        return next((r.get(column) for r in tables.get(SECTIONS[section], []) if r.get("what") == what), None)

    mode = value("machine", MODE_ROW) or ""
    if mode.startswith("tiny"):
        raise ProbeFileError(f"{path} is a {TINY_LABEL}: run python -m benchmarks.gpu_probe on a GPU")
    rate = number(value("c", RATE_ROW))
    if rate is None or rate <= 0:
        raise ProbeFileError(f"{path} has no ViT-T/2 rate (the row '{RATE_ROW}' of '{SECTIONS['c']}'): "
                             "run python -m benchmarks.gpu_probe on a GPU and price from its file")
    stack = next((r for r in tables.get(SECTIONS["b"], []) if r.get("step", "").startswith(STACK_ROW)), {})
    return {"card": (value("machine", CARD_ROW) or "an unnamed card").split(" (")[0],
            "commit": (value("machine", COMMIT_ROW) or "unknown").split(" (")[0],
            "torch": value("machine", "torch") or "unknown", "mode": mode, "rate": rate,
            "gflop": number(value("b", FLOPS_ROW)), "peak_gib": number(value("c", PEAK_ROW)),
            "estimate_gib": number(value("c", ESTIMATE_ROW)),
            "stack_models": number(stack.get("models")), "stack_peak_gib": number(stack.get("peak GiB")),
            "stack_one_by_one": "one after another" in stack.get("how", "")}


# ---- the default's fresh-clone run on a GPU: benchmarks/fresh_repro.py --out-dir ---------------

FRESH_MINUTES = re.compile(r"\*\*([\d.]+) min\*\*")           # a whole run's headline: "**4.8 min**"
FRESH_CARD = re.compile(r"^Machine: one (.+?) \(", re.M)          # "Machine: one NVIDIA H200 (139.8 GiB), ..."
FRESH_DATE = re.compile(r"\bon (\d{4}-\d\d-\d\d \d\d:\d\d) UTC\b")
FRESH_COMMIT = re.compile(r"in a fresh clone of `([0-9a-f]{4,40})`")
GPU_SESSION = "python -m benchmarks.gpu_session"                  # the one command that writes both files


def fresh_repro_name(card: str, commit: str) -> str:
    """The file of the default's fresh-clone run on `card` at `commit`, named as the probe's
    (probe_name): "NVIDIA H200", "02d9857" -> "fresh_repro-h200-02d9857" and the suffix .md."""
    return f"fresh_repro-{card_slug(card)}-{commit}.md"


def fresh_repro_files(folder: Path = PROBES) -> list[Path]:
    """The GPU fresh-clone files, one per card and commit (the CPU's fresh_repro.md is not one)."""
    return sorted(folder.glob("fresh_repro-*.md"))


def read_fresh_repro(path: str | Path) -> dict:
    """A GPU fresh-clone file's card, commit, date (UTC) and minutes: None where the run was cut
    short (its headline then has no "**N min**")."""
    text = Path(path).read_text()
    card, date, commit = FRESH_CARD.search(text), FRESH_DATE.search(text), FRESH_COMMIT.search(text)
    minutes = FRESH_MINUTES.search(text.split("\n", 1)[0])
    return {"card": card[1] if card else None, "date": date[1] if date else "", "commit": commit[1] if commit else None,
            "minutes": float(minutes[1]) if minutes else None}


def gpu_default_run(folder: Path = PROBES) -> tuple[Path, dict] | None:
    """The newest (by its date) complete GPU fresh-clone file with its figures; None where there is none."""
    runs = [(path, read_fresh_repro(path)) for path in fresh_repro_files(folder)]
    runs = [(path, run) for path, run in runs if run["minutes"] is not None and run["card"]]
    return max(runs, key=lambda r: (r[1]["date"], r[0].name)) if runs else None


def readme_gpu_default(folder: Path = PROBES) -> str:
    """The README's sentence on the default's `dvc repro` on a GPU (without its closing period,
    which follows a link in the README): its minutes, card and file from gpu_default_run, or that
    no GPU has timed it."""
    found = gpu_default_run(folder)
    if found is None:
        return f"The default's `dvc repro` on a GPU has not been timed yet by `{GPU_SESSION}`"
    path, run = found
    where = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    return (f"The default's `dvc repro` from a fresh clone took {run['minutes']:.1f} minutes on one "
            f"{run['card']} (`{where}`)")
