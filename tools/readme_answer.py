"""The README's answer, generated from the pipeline's outputs after `dvc repro` (a refresher, not a stage).

    python -m tools.readme_answer            # print it; exit 1 if the file or a page is stale
    python -m tools.readme_answer --write    # write docs/includes/readme_answer.md, refresh every page's blocks

What the primary contrast detected and could detect, the structured init's rank, the speed endpoint from the
seeds that test it, the pooled (post hoc) estimate, the budget's verdict and the main table, with no number typed
(a re-run that concludes otherwise says so). Looks at double the budget stay in reports/headline.md, with their caveats.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys
import tempfile
from pathlib import Path

import pandas as pd
import yaml

from structinit.pipeline.cells import main_cell
from structinit.pipeline.load import load_params
from structinit.reporting import readme
from structinit.reporting.presentation import init_label

REPO = Path(__file__).resolve().parents[1]
OUT = "docs/includes/readme_answer.md"
SOURCES = ("reports/conclusions/main_table.json", "reports/summary.json", "reports/cells.csv", "reports/headline.md",
           "results/evidence/replication/replication.json", "benchmarks/cpu_variation.md", "params.yaml",
           "results/train/<the structured init's cell>/seed<first>/params.yaml (its CPU)")
DATASET_NAMES = {"digits": "8×8 digits", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "svhn": "SVHN",
                 "imagenet": "ImageNet-1K"}
REFERENCE = "trunc_normal"


def arm_name(init: str, headline: str) -> str:
    return f"the structured init ({init_label(init)})" if init == headline else init_label(init)


def _points(x: float) -> str:
    return f"{x:+.1f}" if abs(x) >= 10 else f"{x:+.2f}"


def _interval(c: dict) -> str:
    return f"95 % CI {_points(c['ci_low'])} to {_points(c['ci_high'])}"


def _seed_span(seeds) -> str:
    s = sorted(int(x) for x in seeds)
    return f"{s[0]}–{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 2 else ", ".join(map(str, s))


def _acc(x: float) -> str:
    return f"{x:.1f} %" if x < 90 else f"{x:.2f} %"


def primary_sentence(dataset: str, final: dict, epochs: int, headline: str, detectable: str | None) -> str:
    """The primary contrast at the budget; a null reads "no difference detected", with what the design detects."""
    a, b = arm_name(final["a"], headline), arm_name(final["b"], headline)
    numbers = (f"{_acc(final['mean_a'])} against {_acc(final['mean_b'])} at epoch {epochs}, "
               f"{_points(final['diff'])} points, {_interval(final)}, p = {final['p']:.2g}")
    opening = f"On {DATASET_NAMES.get(dataset, dataset)} ({final['n']} seeds, paired; {epochs} epochs)"
    found = (f"no difference in final test accuracy was detected between {a} and {b}" if final["verdict"] == "~"
             else f"{a} ends {'higher' if final['verdict'] == '>' else 'lower'} than {b}")
    text = f"{opening}, {found}: {numbers}."
    if detectable:
        text += (f" The design detects {detectable} points (80 % power, reports/headline.md); a smaller true "
                 "difference would likely go unseen.")
    return text


def band(rank: int, arms: int) -> str:
    """A rank in words coarse enough to hold where another CPU moves an arm by a place or so."""
    if rank <= arms // 3:
        return "among the highest"
    if rank > arms - arms // 3:
        return "among the lowest"
    return "in the middle"


def rank_sentence(runs: pd.DataFrame, headline: str, epochs: int, early: int | None, cpu_note: str) -> str:
    parts = []
    for column, at in (("acc", f"at epoch {epochs}"), ("speed_acc", f"at epoch {early}, the speed endpoint")):
        if column not in runs or runs[column].isna().all() or (column == "speed_acc" and early is None):
            continue
        means = runs.groupby("init")[column].mean().sort_values(ascending=False)
        rank = list(means.index).index(headline) + 1
        place = {1: "1st", 2: "2nd", 3: "3rd"}.get(rank, f"{rank}th")
        parts.append(f"{band(rank, len(means))} {at} ({place} of {len(means)} here: {_acc(means[headline])}; "
                     f"{init_label(means.index[0])} first, {_acc(means.iloc[0])})")
    return f"Among every arm, {arm_name(headline, headline)} ranks {' and '.join(parts)}. {cpu_note}" if parts else ""


def speed_sentence(speed: dict | None, replication: dict | None, headline: str) -> str:
    """The speed endpoint: tested on the replication's new seeds, described on those that fixed it (main_table.md)."""
    if speed is None:
        return ""
    early = int(speed["family"].rsplit("epoch", 1)[1])
    opening = f"Early learning (test accuracy at epoch {early}, params.yaml contrasts.speed) is"
    a, b = arm_name(speed["a"], headline), arm_name(speed["b"], headline)
    for r in (replication or {}).get("primary", []):
        if ((r["dataset"], r["a"], r["b"]) == (speed["family"], speed["a"], speed["b"])
                and math.isclose(r["stated"]["diff"], speed["diff"], abs_tol=1e-9)):
            new = r["replication"]
            found = {">": f"{a} is ahead of {b}", "<": f"{a} is behind {b}",
                     "~": f"no difference between {a} and {b} was detected"}[new["verdict"]]
            return (f"{opening} tested on new seeds only: on seeds {_seed_span(new['seeds'])}, {found}, "
                    f"{_points(new['diff'])} points, {_interval(new)}, p = {new['p']:.2g} "
                    "(results/evidence/replication/replication.md; trained on "
                    f"{replication['computed_on'].removeprefix('bf16 on ')}).")
    return (f"{opening} not yet tested on new seeds (stage replication); on the seeds that fixed it, it describes: "
            f"{a} − {b} {_points(speed['diff'])} points, {_interval(speed)}.")


def pooled_sentence(final: dict, replication: dict | None, cpus: str) -> str:
    """Both halves of the primary pooled: a look decided after both were seen, labelled so."""
    for r in (replication or {}).get("primary", []):
        pooled = r.get("pooled_post_hoc")
        if (r["dataset"], r["a"], r["b"]) == (final["family"], final["a"], final["b"]) and pooled:
            return (f"Post hoc, over all {pooled['n']} seeds ({cpus} and seeds "
                    f"{_seed_span(r['replication']['seeds'])} from the replication on "
                    f"{replication['computed_on'].removeprefix('bf16 on ')}, pooled after both were seen): "
                    f"{_points(pooled['diff'])} points, {_interval(pooled)}.")
    return ""


def cpu_variation_note(text: str | None) -> str:
    """How far the hardware alone moves a run, from benchmarks/cpu_variation.md."""
    m = re.search(r"SD of a run's move between CPUs is ([\d.]+) points.*?differ with an SD of ([\d.]+) points",
                  text or "", re.S)
    return (f"Another CPU moves a run about as much as another seed (SD {m[1]} against {m[2]} points, "
            "benchmarks/cpu_variation.md), so read the rank by its words: the exact place can differ on another "
            "CPU.") if m else ""


def table(summary: dict, datasets: list[str], runs: pd.DataFrame, headline: str) -> str:
    """Each arm's mean ± std over its seeds (reports/cells.csv, rounded once) and its interval."""
    inits = [k for k in summary[datasets[0]] if k not in ("ours", "primary")]
    head = ["Method", *[f"{d}: this rebuild" for d in datasets], *(["95 % CI", "n"] if len(datasets) == 1 else [])]
    rows = []
    for init in inits:
        cells = []
        for d in datasets:
            seeds = runs[(runs.dataset == d) & (runs.init == init)].acc
            if seeds.empty:
                cells.append("")
                continue
            ref = runs[(runs.dataset == d) & (runs.init == REFERENCE)].acc
            delta = f" ({seeds.mean() - ref.mean():+.2f})" if len(ref) and init != REFERENCE else ""
            cells.append(f"{seeds.mean():.2f} ± {seeds.std():.2f}{delta}")
        if len(datasets) == 1:
            arm = summary[datasets[0]][init]
            cells += [f"[{arm['ci95_low']:.2f}, {arm['ci95_high']:.2f}]", str(arm["n"])]
        rows.append([f"{init_label(init)} (the structured init)" if init == headline else init_label(init), *cells])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(r):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def _optional(read, path: str) -> str | None:
    try:
        return read(path)
    except FileNotFoundError:
        return None


def generate(read) -> str:
    """docs/includes/readme_answer.md from the files `read(path)` returns."""
    conclusions = json.loads(read("reports/conclusions/main_table.json"))["conclusions"]
    summary = json.loads(read("reports/summary.json"))
    runs = pd.read_csv(io.StringIO(read("reports/cells.csv")))
    with tempfile.TemporaryDirectory() as tmp:      # read as every reader reads it: load_params
        (Path(tmp) / "params.yaml").write_text(read("params.yaml"))
        params = load_params(Path(tmp) / "params.yaml")
    headline_md = read("reports/headline.md")
    record = _optional(read, "results/evidence/replication/replication.json")
    replication = json.loads(record) if record else None
    cpu_note = cpu_variation_note(_optional(read, "benchmarks/cpu_variation.md"))
    datasets = [d for d in summary if isinstance(summary[d], dict) and "primary" in summary[d]]
    headline = summary[datasets[0]]["ours"]["init"]
    detectable = dict(re.findall(r"^- (.+?): .*\n  Detectable with this design: ([\d.]+) points", headline_md, re.M))
    paragraphs = []
    for d in datasets:
        primaries = [c for c in conclusions if c["role"] == "primary" and c["family"].split(",")[0] == d]
        final = next((c for c in primaries if c["family"] == d), None)
        if final is None or any(isinstance(final[k], float) and math.isnan(final[k]) for k in ("diff", "ci_low")):
            continue
        speed = next((c for c in primaries if c["family"].startswith(f"{d}, epoch")), None)
        epochs = params["recipes"][d]["train"]["epochs"]
        early = int(speed["family"].rsplit("epoch", 1)[1]) if speed else None
        here = runs[runs.dataset == d]
        seeds = sorted(here.seed.unique())
        cpu = yaml.safe_load(read(f"results/train/{main_cell(d, headline)}/seed{seeds[0]}/params.yaml")).get("cpu")
        cpus = f"seeds {_seed_span(seeds)} from the committed run on {cpu or 'an unrecorded CPU'}"
        paragraphs += [primary_sentence(d, final, epochs, headline, detectable.get(d)),
                       rank_sentence(here, headline, epochs, early, cpu_note),
                       speed_sentence(speed, replication, headline),
                       pooled_sentence(final, replication, cpus)]
    budget = [line for line in headline_md.splitlines() if ": Epoch budget " in line]
    n = {summary[d][headline]["n"] for d in datasets}
    note = (f"Final-epoch test accuracy (%), mean ± std over {'/'.join(map(str, sorted(n)))} seeds, in brackets the "
            f"difference to {init_label(REFERENCE)}; 95 % interval of the mean. Imp.-k: the structured init "
            f"(the paper's method) with k×k filters; {init_label(headline)}, params.yaml's init.kernel, is the row "
            "the first sentence tests. Post hoc looks (the primary at double the budget) are in reports/headline.md.")
    # the primary first, then the table (the README's first screen holds both), then the rest
    parts = [f"<!-- written by `python -m tools.readme_answer --write` from {', '.join(SOURCES)} -->",
             *paragraphs[:1], table(summary, datasets, runs, headline), note,
             *[p for p in paragraphs[1:] if p], *budget]
    return "\n\n".join(parts) + "\n"


def _reader(root: Path, committed: bool):
    def read(path: str) -> str:
        if committed and (text := readme.committed_text(root, path)) is not None:
            return text
        return (root / path).read_text()
    return read


def stale(root: Path = REPO) -> list[str]:
    """[OUT] if the answer file is not what its sources make it. As in readme.stale_blocks, a committed file is
    checked against committed sources (a re-run elsewhere leaves it valid), an edited one against the workspace."""
    path = root / OUT
    text = path.read_text() if path.exists() else ""
    committed = readme.committed_text(root, OUT) == text
    return [] if text == generate(_reader(root, committed)) else [OUT]


def write(root: Path = REPO) -> None:
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
