"""How many epochs the paper's recipe needs on the embedded default (digits).

    python -m benchmarks.epochs [--epochs 20 50 100] [--seeds 0 1] [--inits ...]

Trains the digits recipe of params.yaml (the paper's optimizer, eps, schedule shape,
clipping, label smoothing, weight decay) for each epoch budget, warm-up kept at 5 % of it,
cosine to the end of *that* budget (so each budget is a complete run, not a prefix of a
longer one). Prints final-epoch test accuracy (mean ± std over seeds) per initializer and
budget, and the test accuracy every 10 epochs of the longest budget. The seeds of one
(initializer, budget) train stacked, as the pipeline's cells do.
"""
import argparse
import statistics

import torch
import yaml
from tabulate import tabulate

from structinit import TrainConfig, initialize, prepare_dataset, train_models
from structinit.pipeline.build import build_model
from structinit.pipeline.cells import parse_init


def run(data, rec, init, epochs, seeds):
    """One curve [(epoch, test acc %)] per seed, the seeds trained stacked."""
    models = []
    for seed in seeds:
        models.append(build_model(rec["model"], data.spec))
        method, kernel = parse_init(init)
        initialize(models[-1], method, seed=seed, **({"kernel": kernel} if kernel else {}))
    train = dict(rec["train"], epochs=epochs, warmup_epochs=max(1, round(0.05 * epochs)), eval_every=10)
    hists = train_models(models, data, [TrainConfig(**train, seed=seed) for seed in seeds], progress=False)
    return [[(h["epoch"], 100 * h["test_acc"]) for h in hist if "test_acc" in h] for hist in hists]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, nargs="+", default=[20, 50, 100])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--inits", nargs="+", default=["kaiming_uniform", "trunc_normal", "mimetic", "impulse3"])
    a = ap.parse_args()
    with open("params.yaml") as f:
        rec = yaml.safe_load(f)["recipes"]["digits"]
    torch.set_num_threads(torch.get_num_threads())
    data = prepare_dataset("digits")
    final, curves = {}, {}
    for e in a.epochs:
        for init in a.inits:
            for seed, curve in zip(a.seeds, run(data, rec, init, e, a.seeds)):
                final.setdefault((init, e), []).append(curve[-1][1])
                if e == max(a.epochs):
                    curves.setdefault(init, []).append(curve)
                print(f"{init} {e} epochs seed {seed}: {curve[-1][1]:.2f}", flush=True)
    fmt = lambda v: f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}"  # noqa: E731
    print(f"\nfinal-epoch test accuracy %, seeds {a.seeds}")
    print(tabulate([[init] + [fmt(final[(init, e)]) for e in a.epochs] for init in a.inits],
                   headers=["init"] + [f"{e} epochs" for e in a.epochs], tablefmt="github"))
    longest = max(a.epochs)
    epochs = [ep for ep, _ in curves[a.inits[0]][0]]
    print(f"\ntest accuracy % during the {longest}-epoch runs (mean over seeds)")
    print(tabulate([[init] + [f"{statistics.mean(c[i][1] for c in curves[init]):.1f}" for i in range(len(epochs))]
                    for init in a.inits], headers=["init"] + [str(ep) for ep in epochs], tablefmt="github"))


if __name__ == "__main__":
    main()
