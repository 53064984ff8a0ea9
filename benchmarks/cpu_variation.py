"""The CPU as a source of variation, in numbers: the same cell and seed trained on another CPU
against the committed run's, beside `./run.sh verify`'s tolerance and the fragile band.

    python -m benchmarks.cpu_variation [--out benchmarks/cpu_variation.md]

Reads an Intel Xeon's runs at the recipe's budget (benchmarks/epochs_intel.csv, from the epoch
benchmark) and the committed main-grid runs of the same initializer and seed, and writes per
cell each seed's move in points and test images and the cell mean's move against verify's
tolerance; then the moves' spread against the seed-to-seed spread, and the primary contrast on
the shared seeds on each CPU, its p against the fragile band. Confounded, and said so: the
Intel runs stacked 18 models where the pipeline stacks 5, with that day's trainer.
"""
import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from tabulate import tabulate

from structinit.pipeline.cells import planned_contrast
from structinit.pipeline.load import load_params
from structinit.pipeline.verify import TOLERANCE_SDS, seed_sd, test_image_count, tolerance_images
from structinit.reporting import stats

REPO = Path(__file__).resolve().parents[1]


def paired_runs(repo: Path, epochs_csv: Path, dataset: str, epochs: int) -> pd.DataFrame:
    """One row per (init, seed) run on both CPUs at `epochs`: other (the epoch benchmark's
    final test accuracy, %, on a CPU other than the committed run's), here (the committed
    run's, %), their CPUs. ValueError when the file holds one (init, seed) twice on other CPUs."""
    d = pd.read_csv(epochs_csv)
    d = d[(d.dataset == dataset) & (d.budget == epochs) & (d.epoch == epochs)]
    rows = []
    for r in d.itertuples():
        run = repo / "results/train" / f"{dataset}-{r.init}" / f"seed{r.seed}"
        if not (run / "metrics.json").exists():
            continue
        logged = yaml.safe_load((run / "params.yaml").read_text())
        if str(r.cpu).split(",")[0] == str(logged.get("cpu", "?")):
            continue                                       # the same CPU: not a move between CPUs
        here = 100 * json.loads((run / "metrics.json").read_text())["final_test_acc"]
        rows.append({"init": r.init, "seed": int(r.seed), "other": float(r.test_acc), "here": here,
                     "other_cpu": r.cpu,
                     "here_cpu": f"{logged.get('cpu', '?')}, {logged.get('cpu_threads', '?')} threads",
                     "here_dtype": logged.get("compute_dtype", "?")})
    out = pd.DataFrame(rows)
    if not out.empty and (twice := out[out.duplicated(["init", "seed"], keep=False)]).size:
        raise ValueError(f"{epochs_csv}: {sorted(set(zip(twice.init, twice.seed)))} ran twice at {epochs} epochs on "
                         f"other CPUs ({sorted(set(twice.other_cpu))}); keep one run per initializer and seed")
    if not out.empty and out.other_cpu.nunique() > 1:
        raise ValueError(f"{epochs_csv}: runs at {epochs} epochs on several other CPUs {sorted(set(out.other_cpu))}; "
                         "this table compares one other CPU with the committed run's")
    return out


def cpu_variation(repo: Path, epochs_csv: Path, dataset: str = "digits") -> str:
    params = load_params(repo / "params.yaml")
    epochs = params["recipes"][dataset]["train"]["epochs"]
    runs = paired_runs(repo, epochs_csv, dataset, epochs)
    if runs.empty:
        return f"No run of {dataset} at {epochs} epochs on another CPU in {epochs_csv.name}.\n"
    n_test = test_image_count(repo, dataset)
    runs["move"] = runs.here - runs.other                        # points
    runs["images"] = (runs.move / 100 * n_test).round().astype(int)
    # verify's tolerance for these cells: from their kind's seed SD in the committed runs, every seed
    sd = seed_sd([[json.loads(m.read_text())["final_test_acc"] * n_test for m in cell.glob("seed*/metrics.json")]
                  for cell in (repo / "results/train").glob(f"{dataset}-*")])
    n = runs.groupby("init").size().max()
    cells = []
    for init, g in runs.groupby("init", sort=False):
        mean_images = g.move.mean() / 100 * n_test
        cells.append([init, " ".join(f"{round(m, 2) + 0.0:+.2f}" for m in g.move),
                      " ".join(f"{i:+d}" for i in g.images),
                      f"{mean_images:+.1f}", "yes" if abs(mean_images) > tolerance_images(sd, len(g)) else "no"])
    # the spread a CPU adds, against the spread between two seeds of one arm on one CPU
    sd_cpu = float(runs.move.std(ddof=1))
    # pooled within-arm SD over seeds (each arm's own mean removed), times sqrt 2: the SD of the
    # difference between two seeds of one arm
    within = [g.here.var(ddof=1) for _, g in runs.groupby("init") if len(g) > 1]
    sd_seed = float(np.sqrt(np.mean(within) * 2)) if within else float("nan")
    seed_pairs = sum(len(g) * (len(g) - 1) // 2 for _, g in runs.groupby("init"))
    # the primary contrast on the shared seeds, on each CPU
    a, b = planned_contrast(params, params["contrasts"]["primary"])
    lines, diffs = [], []
    for side in ("other", "here"):
        ga = dict(zip(runs[runs.init == a].seed, runs[runs.init == a][side]))
        gb = dict(zip(runs[runs.init == b].seed, runs[runs.init == b][side]))
        d = stats.paired_difference(ga, gb)
        cpu = runs[f"{side}_cpu"].iloc[0]
        diffs.append(d.diff)
        fragile = " (in the fragile band)" if stats.is_fragile(d.p) else ""
        lines.append(f"- {cpu}: {a} − {b} = {d.diff:+.2f} points, 95 % CI [{d.ci_low:+.2f}, {d.ci_high:+.2f}], "
                     f"n = {d.n} paired, p = {d.p:.2g}{fragile}")
    beyond = sum(c[-1] == "yes" for c in cells)
    return (f"Per cell, {dataset} at {epochs} epochs, seeds {sorted(set(runs.seed))}: this workspace's runs "
            f"({runs.here_cpu.iloc[0]}, {runs.here_dtype.iloc[0]}) minus the epoch benchmark's on "
            f"{runs.other_cpu.iloc[0]} (benchmarks/{epochs_csv.name}), in points and in test images (of {n_test}); "
            f"a cell beyond verify's tolerance moves its mean over n seeds by more than {TOLERANCE_SDS} × {sd:.2f} × "
            f"√(2 / n) images ({tolerance_images(sd, n):.1f} at n = {n}; {sd:.2f}: the across-seed SD of the committed "
            f"results/train/{dataset}-* cells). Written by `python -m benchmarks.cpu_variation`.\n\n"
            + tabulate(cells, headers=["init", "move per seed (points)", "test images", "mean (images)",
                                       "beyond tolerance"], tablefmt="github")
            + f"\n\n{len(runs)} runs: the SD of a run's move between CPUs is {sd_cpu:.2f} points "
            f"({sd_cpu / 2 ** 0.5:.2f} per CPU, if each adds its own noise alike); two seeds of one arm on one "
            "CPU differ with an SD of "
            f"{sd_seed:.2f} points ({sd_seed / 2 ** 0.5:.2f} per seed, the SD pooled over arms; {seed_pairs} "
            f"pairs). {beyond} of "
            f"{len(cells)} cells moved beyond verify's tolerance. The primary contrast on these seeds, on each CPU:\n\n"
            + "\n".join(lines)
            + ("\n\nThe primary contrast changed sign between the two CPUs." if diffs[0] * diffs[1] < 0 else "")
            + (f"\n\nA CPU moves a run {'about as much as' if 0.67 < sd_cpu / sd_seed < 1.5 else 'unlike'} another "
               "seed does." if sd_seed > 0 else "")
            + f"\n\n{stats.FRAGILE_RULE[0].upper() + stats.FRAGILE_RULE[1:]}. Confounded: the other CPU's runs "
            "stacked every initializer's seeds into one run (18 models; the pipeline stacks a cell's 5) with the "
            "trainer of their day, so a move here is CPU, stacking and code together; its dtype was not recorded.\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs-csv", type=Path, default=REPO / "benchmarks/epochs_intel.csv")
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--out", type=Path, help="also write the text there (benchmarks/cpu_variation.md)")
    a = ap.parse_args()
    text = cpu_variation(REPO, a.epochs_csv, a.dataset)
    if a.out:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
