"""Stacked training: models x images per second for N models trained as one, vs one at a time.

    python -m benchmarks.stacked_throughput [--dataset digits] [--stacks 1 2 4 5 8] [--epochs 3] [--repeats 3]
                                            [--chunk-rows 2 4 8]

The baseline is the straightforward one-model loop: one eager timm module (fused attention),
the same on-device batches, loss, per-model clipping and fused AdamW as the trainer, one model
after another. "stacked N" is `structinit.training.trainer.train_models` on N models of the dataset's
recipe (seeds 0..N-1), every op running all N at once (structinit/training/stacked.py). Both count
training time only (no evaluation); figures are models x images / s, min and median over
repeats, the runs of one repeat interleaved so machine load hits all alike. The last line is
`ratio: X`, stacked / baseline (medians) for --ratio-models models (default 5: the default
grid's seeds, one cell's stack). On CPU the trainer splits each batch into one single-threaded
chunk per core (cpu_chunks, "auto"); the row "stacked R, cpu_chunks=1" is the same stack with
PyTorch's intra-op threads instead, so the two rows show what the chunks still buy;
--chunk-rows adds rows with other chunk counts (auto picks one: structinit/training/step.py). Runs
unchanged on a GPU, where stacking packs several small models onto one device.
"""
import argparse
import dataclasses
import statistics

import torch
from tabulate import tabulate

import structinit as si
from structinit.pipeline.build import build_model
from structinit.pipeline.load import load_params
from structinit.training.reference import train_plain
from structinit.training.trainer import train_models


def one_model_loop(model, data, cfg, device) -> float:
    """Train one model the straightforward way (the reference trainer); returns training images/s."""
    hist = train_plain(model, data, cfg, device=device)
    return sum(h["images_per_s"] * h["train_seconds"] for h in hist) / sum(h["train_seconds"] for h in hist)


def stacked(n, rec, data, cfg, device) -> float:
    """Train n models stacked; returns models x training images / s."""
    models = []
    for seed in range(n):
        models.append(build_model(rec["model"], data.spec))
        si.initialize(models[-1], "trunc_normal", seed=seed)
    cfgs = [dataclasses.replace(cfg, seed=seed) for seed in range(n)]
    hist = train_models(models, data, cfgs, device=device, progress=False)[0]
    return n * sum(h["images_per_s"] * h["train_seconds"] for h in hist) / sum(h["train_seconds"] for h in hist)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--data", help="prepared dataset file (default: prepare it here)")
    ap.add_argument("--stacks", type=int, nargs="+", default=[1, 2, 4, 5, 8])
    ap.add_argument("--ratio-models", type=int, default=5, help="the stack size of the final ratio")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--chunk-rows", type=int, nargs="*", default=[], help="CPU: more cpu_chunks rows")
    a = ap.parse_args()
    if a.ratio_models not in a.stacks:
        ap.error(f"--ratio-models {a.ratio_models} must be one of --stacks {a.stacks}")
    rec = load_params()["recipes"][a.dataset]
    data = si.ImageData.load(a.data) if a.data else si.prepare_dataset(a.dataset)
    device = si.default_device()
    # eval_every past the end: the one evaluation after the last epoch is not timed.
    cfg = si.TrainConfig(**{**rec["train"], "epochs": a.epochs, "eval_every": a.epochs,
                            "warmup_epochs": min(rec["train"]["warmup_epochs"], 1)})
    print(f"{a.dataset}: {len(data.train_labels)} train images, batch {cfg.batch_size}, {a.epochs} "
          f"epochs, model {rec['model']}, device {device}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}")
    names = ["one-model loop"] + [f"stacked {n}" for n in a.stacks]
    if device.type == "cpu":
        names += [f"stacked {a.ratio_models}, cpu_chunks={k}" for k in [1] + a.chunk_rows]
    results = {name: [] for name in names}
    for r in range(a.repeats):
        for name in names:
            if name == "one-model loop":
                model = build_model(rec["model"], data.spec)
                si.initialize(model, "trunc_normal", seed=r)
                rate = one_model_loop(model, data, dataclasses.replace(cfg, seed=r), device)
            else:
                chunks = int(name.split("=")[1]) if "cpu_chunks=" in name else cfg.cpu_chunks
                rate = stacked(int(name.split()[1].rstrip(",")), rec, data,
                               dataclasses.replace(cfg, cpu_chunks=chunks), device)
            results[name].append(rate)
            print(f"  repeat {r + 1}: {name:26s} {rate:8.0f} models x img/s", flush=True)
    base = statistics.median(results["one-model loop"])
    rows = [[name, f"{min(v):.0f}", f"{statistics.median(v):.0f}", f"{statistics.median(v) / base:.2f}"]
            for name, v in results.items()]
    print(tabulate(rows, headers=["trainer", "min models x img/s", "median models x img/s",
                                  "median / one-model loop"], tablefmt="github"))
    print(f"ratio: {statistics.median(results[f'stacked {a.ratio_models}']) / base:.2f}")


if __name__ == "__main__":
    main()
