"""The wall-clock figures of the last pipeline run, from its timing logs.

    python -m benchmarks.timings [--logs logs/timings]

Stages keep timings out of their outputs (a DVC output must be the same bytes on every run):
each writes logs/timings/<output>.json beside it (stages/common.log_timings). This prints one
table per kind: training (median images/s per model over epochs, total training seconds, the
init's solve seconds), solves (preoptimize, reference_solve), and each training stage's phases
(seconds since its process started when its imports, data, models, training and saving were
done: where a stage's fixed cost goes).
"""
import argparse
import json
from pathlib import Path

from tabulate import tabulate

PHASES = ("imported", "data", "built", "training", "trained", "saved")   # stages/train.py's marks, in order


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", default="logs/timings")
    a = ap.parse_args()
    root = Path(a.logs)
    logs = sorted(root.rglob("*.json"))
    if not logs:
        raise SystemExit(f"no timing logs under {root}: run the pipeline first (./run.sh repro)")
    train, solves, phases = [], [], []
    for path in logs:
        run = str(path.relative_to(root).with_suffix(""))
        t = json.loads(path.read_text())
        if "seconds_since_start" in t:
            marks = t["seconds_since_start"]
            phases.append([run, *("" if marks.get(k) is None else f"{marks[k]:.1f}" for k in PHASES)])
        elif "epochs" in t:
            train.append([run, len(t["epochs"]), f"{t['median_images_per_s']:.0f}",
                          f"{sum(e['train_seconds'] for e in t['epochs']):.1f}",
                          "" if t.get("solve_seconds") is None else f"{t['solve_seconds']:.3f}"])
        else:
            solves.append([run, f"{t['solve_seconds']:.3f}"])
    if train:
        print(tabulate(train, headers=["training run", "epochs", "median images/s (per model)",
                                       "training s", "init solve s"], tablefmt="github"))
    if solves:
        print()
        print(tabulate(solves, headers=["solve", "seconds"], tablefmt="github"))
    if phases:
        print()
        print(tabulate(phases, headers=["stage process (s since its start)", *PHASES], tablefmt="github",
                       disable_numparse=True))


if __name__ == "__main__":
    main()
