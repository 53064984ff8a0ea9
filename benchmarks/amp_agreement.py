"""Does bf16 autocast change what the digits recipe concludes? fp32 vs bf16, paired by seed.

    python -m benchmarks.amp_agreement [--epochs 80] [--seeds 0 1 2] [--inits trunc_normal impulse3 mimetic]

Each (initializer, seed) trains twice from the same initial weights and the same data order:
once in fp32 (amp: off) and once under bf16 autocast (amp: bf16), everything else the digits
recipe of params.yaml (warm-up kept at 5 % of the epochs, as structinit/evidence/epoch_budget.py does). The
seeds of one initializer train stacked, as the pipeline's cells do.

Prints, per initializer and seed, the final test accuracy under both, the paired difference
fp32 - bf16 in points, and how many of the test images got a different prediction; then per
initializer and over all runs the mean paired difference with its 95 % t-interval. The
largest per-run count of changed predictions is the spread that `./run.sh verify` tolerates
(docs/reproducibility.md): fp32 vs bf16 is a setting that should not matter.
"""
import argparse
import json
import statistics

import torch
import yaml
from scipy import stats
from tabulate import tabulate

from structinit import TrainConfig, initialize, prepare_dataset, train_models
from structinit.pipeline.build import build_model
from structinit.pipeline.cells import parse_init
from structinit.training.batches import BatchAugmentation


def train_arm(data, rec, init, epochs, seeds, amp):
    """Trains `init` for every seed (stacked) under `amp`; returns each seed's test predictions."""
    models = []
    method, kernel = parse_init(init)
    for seed in seeds:
        models.append(build_model(rec["model"], data.spec))
        initialize(models[-1], method, seed=seed, **({"kernel": kernel} if kernel else {}))
    train = dict(rec["train"], epochs=epochs, warmup_epochs=max(1, round(0.05 * epochs)),
                 eval_every=epochs, amp=amp)
    cfgs = [TrainConfig(**train, seed=seed) for seed in seeds]
    train_models(models, data, cfgs, progress=False)
    norm = BatchAugmentation(data, cfgs[0], torch.device("cpu")).normalize
    with torch.no_grad():
        return [m.eval()(norm(data.test_images)).argmax(-1) for m in models]   # fp32 evaluation


def t_interval(diffs):
    m = statistics.mean(diffs)
    if len(diffs) < 2:
        return m, float("nan"), float("nan")
    half = stats.t.ppf(0.975, len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return m, m - half, m + half


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=80)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--inits", nargs="+", default=["trunc_normal", "impulse3", "mimetic"])
    ap.add_argument("--json", help="also write the per-run figures here")
    a = ap.parse_args()
    with open("params.yaml") as f:
        rec = yaml.safe_load(f)["recipes"]["digits"]
    data = prepare_dataset("digits")
    y = data.test_labels
    n_test = len(y)
    rows, runs, by_init = [], [], {}
    for init in a.inits:
        preds = {amp: train_arm(data, rec, init, a.epochs, a.seeds, amp) for amp in ("off", "bf16")}
        for seed, p32, p16 in zip(a.seeds, preds["off"], preds["bf16"]):
            acc32, acc16 = 100 * (p32 == y).float().mean().item(), 100 * (p16 == y).float().mean().item()
            changed = int((p32 != p16).sum())
            runs.append({"init": init, "seed": seed, "fp32": acc32, "bf16": acc16, "changed_predictions": changed,
                         "net_correct_fp32_minus_bf16": int((p32 == y).sum() - (p16 == y).sum())})
            by_init.setdefault(init, []).append(acc32 - acc16)
            rows.append([init, seed, f"{acc32:.2f}", f"{acc16:.2f}", f"{acc32 - acc16:+.2f}", changed])
            print(f"{init} seed {seed}: fp32 {acc32:.2f}  bf16 {acc16:.2f}  changed {changed}/{n_test}", flush=True)
    print(f"\n{a.epochs} epochs, {n_test} test images")
    print(tabulate(rows, headers=["init", "seed", "fp32 %", "bf16 %", "fp32 - bf16", "predictions changed"],
                   tablefmt="github"))
    summary = [[init, *(f"{v:+.2f}" for v in t_interval(d))] for init, d in by_init.items()]
    every = [r["fp32"] - r["bf16"] for r in runs]
    summary.append(["all runs", *(f"{v:+.2f}" for v in t_interval(every))])
    print("\npaired fp32 - bf16, points (mean, 95 % t-interval)")
    print(tabulate(summary, headers=["", "mean", "low", "high"], tablefmt="github"))
    worst = max(r["changed_predictions"] for r in runs)
    worst_net = max(abs(r["net_correct_fp32_minus_bf16"]) for r in runs)
    print(f"\nmost predictions changed in one run: {worst} of {n_test}; largest net change in correct "
          f"test images: {worst_net}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"epochs": a.epochs, "n_test": n_test, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
