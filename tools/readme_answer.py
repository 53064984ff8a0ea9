"""The README's answer in words: one plain sentence per dataset, the main table, and the
headline's own convergence line, generated from the files the pipeline wrote. Not a pipeline
stage: a refresher for the README, run after `dvc repro`.

    python -m tools.readme_answer            # print it; exit 1 if the file or a page is stale
    python -m tools.readme_answer --write    # write docs/includes/readme_answer.md, refresh every page's blocks

Reads reports/conclusions/main_table.json (the primary contrast at the final epoch and the
speed endpoint, each with its paired interval and verdict), reports/summary.json (each arm's
mean, std, interval and n), reports/headline.md (its "Epoch budget" line and the
primary contrast at double that budget, quoted verbatim) and
params.yaml (the epoch budget), and writes docs/includes/readme_answer.md, which the README quotes
in an include block (structinit/reporting/readme.py). The sentence is built from the verdicts,
not typed: a re-run whose conclusions differ says so in other words.

In the table, the column is this rebuild's own numbers ("<dataset>: this rebuild") and the
headline row is "Imp.-3 (the structured init)": the paper's method, at params.yaml's
init.kernel. (The generated reports/headline.md labels the same row "Imp.-3 (ours)" and the
column "digits: ours".)

`--write` also refreshes every page's include blocks (structinit/reporting/readme.py's PAGES: the
README and every docs page); tests/test_first_screen.py checks the answer, tests/test_readme_numbers.py
the blocks.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml

from structinit.reporting import readme
from structinit.reporting.presentation import init_label

REPO = Path(__file__).resolve().parents[1]
OUT = "docs/includes/readme_answer.md"
SOURCES = ("reports/conclusions/main_table.json", "reports/summary.json", "reports/headline.md", "params.yaml")
DATASET_NAMES = {"digits": "8×8 digits", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "svhn": "SVHN",
                 "imagenet": "ImageNet-1K"}
REFERENCE = "trunc_normal"


def arm_name(init: str, headline: str) -> str:
    """The headline arm by what it is, every other arm by its table label."""
    if init == headline:
        return f"the structured init ({init_label(init)})"
    return init_label(init)


def row_label(init: str, headline: str) -> str:
    return f"{init_label(init)} (the structured init)" if init == headline else init_label(init)


def _points(x: float) -> str:
    return f"{x:+.1f}" if abs(x) >= 10 else f"{x:+.2f}"


def _interval(c: dict) -> str:
    return f"95 % CI {_points(c['ci_low'])} to {_points(c['ci_high'])}"


def _acc(x: float) -> str:
    return f"{x:.1f} %" if x < 90 else f"{x:.2f} %"


def sentence(dataset: str, final: dict, speed: dict | None, epochs: int, headline: str) -> str:
    """One plain sentence: what the headline arm changes against its reference early (the speed
    endpoint) and at the end (the primary), each with its paired 95 % interval, from the verdicts."""
    a, b = arm_name(final["a"], headline), arm_name(final["b"], headline)
    where = DATASET_NAMES.get(dataset, dataset)
    n = final["n"]

    def clause(c: dict, at: str, moved: dict[str, str]) -> str:
        return (f"{moved[c['verdict']]} ({_acc(c['mean_a'])} against {_acc(c['mean_b'])} test accuracy {at}, "
                f"{_points(c['diff'])} points, {_interval(c)})")

    final_words = {">": "ends higher", "<": "ends lower", "~": "does not change the final accuracy"}
    final_text = clause(final, f"at epoch {epochs}", final_words)
    if final["verdict"] == "~":
        final_text = final_text[:-1] + ", not distinguishable from 0)"
    opening = f"On {where} ({n} seeds, paired; {epochs} epochs), {a}"
    if speed is None:
        return f"{opening}, against {b}, {final_text}."
    early = int(speed["family"].rsplit("epoch", 1)[1])
    speed_words = {">": f"learns faster than {b} early on", "<": f"learns more slowly than {b} early on",
                   "~": f"learns about as fast as {b} early on"}
    speed_text = clause(speed, f"at epoch {early}", speed_words)
    if speed["verdict"] == "~":
        speed_text = speed_text[:-1] + ", not distinguishable from 0)"
    join = ", and " if speed["verdict"] == final["verdict"] else ", but "
    return f"{opening} {speed_text}{join}{final_text}."


def table(summary: dict, headline: str) -> str:
    datasets = [d for d in summary if isinstance(summary[d], dict) and "primary" in summary[d]]
    inits = [k for k in summary[datasets[0]] if k not in ("ours", "primary")]
    head = ["Method", *[f"{d}: this rebuild" for d in datasets], *(["95 % CI", "n"] if len(datasets) == 1 else [])]
    rows = []
    for init in inits:
        cells = []
        for d in datasets:
            arm = summary[d].get(init)
            if arm is None:
                cells.append("")
                continue
            ref = summary[d].get(REFERENCE)
            delta = f" ({arm['acc'] - ref['acc']:+.2f})" if ref and init != REFERENCE else ""
            cells.append(f"{arm['acc']:.2f} ± {arm['std']:.2f}{delta}")
        if len(datasets) == 1:
            arm = summary[datasets[0]][init]
            cells += [f"[{arm['ci95_low']:.2f}, {arm['ci95_high']:.2f}]", str(arm["n"])]
        rows.append([row_label(init, headline), *cells])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def generate(read) -> str:
    """docs/includes/readme_answer.md from the files `read(path)` returns."""
    conclusions = json.loads(read("reports/conclusions/main_table.json"))["conclusions"]
    summary = json.loads(read("reports/summary.json"))
    params = yaml.safe_load(read("params.yaml"))
    headline_md = read("reports/headline.md")
    datasets = [d for d in summary if isinstance(summary[d], dict) and "primary" in summary[d]]
    headline = summary[datasets[0]]["ours"]["init"]
    sentences = []
    for d in datasets:
        primaries = [c for c in conclusions if c["role"] == "primary" and c["family"].split(",")[0] == d]
        final = next((c for c in primaries if c["family"] == d), None)
        if final is None or any(isinstance(final[k], float) and math.isnan(final[k]) for k in ("diff", "ci_low")):
            continue
        speed = next((c for c in primaries if c["family"].startswith(f"{d}, epoch")), None)
        sentences.append(sentence(d, final, speed, params["recipes"][d]["train"]["epochs"], headline))
    lines = headline_md.splitlines()
    budget = ([line for line in lines if ": Epoch budget " in line]         # then the primary at double that budget
              + [line.strip() for line in lines if line.startswith("  At double the budget (")])
    n = {summary[d][headline]["n"] for d in datasets}
    note = (f"Final-epoch test accuracy (%), mean ± std over {'/'.join(map(str, sorted(n)))} seeds, in brackets the "
            f"difference to {init_label(REFERENCE)}; 95 % interval of the mean. Imp.-k: the structured init "
            f"(the paper's method) with k×k filters; {init_label(headline)}, params.yaml's init.kernel, is the row "
            f"the sentence tests.")
    parts = [f"<!-- written by `python -m tools.readme_answer --write` from {', '.join(SOURCES)} -->",
             "\n\n".join(sentences), table(summary, headline), note, *budget]
    return "\n\n".join(parts) + "\n"


def _reader(root: Path, committed: bool):
    """Read a source as HEAD has it when `committed` (and HEAD has it), else the workspace's."""
    def read(path: str) -> str:
        if committed and (text := readme.committed_text(root, path)) is not None:
            return text
        return (root / path).read_text()
    return read


def stale(root: Path = REPO) -> list[str]:
    """The answer file when it is not what its sources make it (the pages' include blocks are
    readme.stale_blocks's). As there, a file as committed is checked against the sources as
    committed (a re-run elsewhere leaves the committed README valid); an edited one against the
    workspace's."""
    path = root / OUT
    text = path.read_text() if path.exists() else ""
    committed = readme.committed_text(root, OUT) == text
    return [] if text == generate(_reader(root, committed)) else [OUT]


def write(root: Path = REPO) -> None:
    """The answer file, then every page's include blocks (readme.PAGES) refreshed."""
    (root / OUT).parent.mkdir(parents=True, exist_ok=True)
    (root / OUT).write_text(generate(_reader(root, committed=False)))
    for page in readme.PAGES:
        (root / page).write_text(readme.refreshed((root / page).read_text(), root))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help=f"write {OUT} and refresh every page's include blocks")
    ap.add_argument("--root", type=Path, default=REPO)
    a = ap.parse_args()
    if a.write:
        write(a.root)
    print(generate(_reader(a.root, committed=False)), end="")
    problems = stale(a.root) + readme.stale_blocks(a.root, committed=False)
    for s in problems:
        print(f"stale: {s}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
