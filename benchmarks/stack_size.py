"""Does a run's bytes depend on how many models it was stacked with? One seed, trained in stacks
of different sizes, compared weight by weight.

    python -m benchmarks.stack_size [--stacks 3 5] [--epochs 2] [--train-size N] [--data PATH]

Trains the default digits cell's recipe (params.yaml, Trunc Normal) for --epochs with seeds
0..k-1 stacked, for each k in --stacks, on this CPU (amp as the recipe says), and compares every
seed the stacks share: bitwise equal final weights, or the largest absolute weight difference.
Why: the pipeline stacks a cell's 5 seeds, the epoch benchmark (`--stacking cell`) each arm's
3, and docs/reproducibility.md compares runs stacked 18 and 5 across CPUs; whether stacking
alone moves the bytes decides what those comparisons can attribute to the CPU. Prints one row
per shared seed and last `bitwise equal: <k> of <m> shared seeds`.
"""
import argparse
from pathlib import Path

import torch

from structinit.pipeline.load import load_params

REPO = Path(__file__).resolve().parents[1]


def train_stack(seeds: list[int], epochs: int, data, train_indices) -> list[torch.nn.Module]:
    import structinit as si
    from structinit.pipeline.build import build_model
    from structinit.training.trainer import train_models

    rec = load_params(REPO / "params.yaml")["recipes"]["digits"]
    models = []
    for seed in seeds:
        models.append(build_model(rec["model"], data.spec))
        si.initialize(models[-1], "trunc_normal", seed=seed)
    cfgs = [si.TrainConfig(**dict(rec["train"], epochs=epochs, eval_every=epochs), seed=s) for s in seeds]
    train_models(models, data, cfgs, train_indices=train_indices, progress=False)
    return models


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stacks", type=int, nargs="+", default=[3, 5], help="stack sizes (seeds 0..k-1 each)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--train-size", type=int, default=None, help="the first N training images (default: all)")
    ap.add_argument("--data", default=str(REPO / "data/prepared/digits.pt"),
                    help="prepared digits (dvc repro download@digits writes it)")
    a = ap.parse_args(argv)
    if len(a.stacks) < 2 or min(a.stacks) < 1:
        ap.error(f"--stacks {a.stacks}: give two or more sizes >= 1")
    import structinit as si
    from structinit.training.stacked import cpu_has_native_bf16

    data = si.ImageData.load(a.data)
    subset = torch.arange(a.train_size) if a.train_size else None
    runs = {k: train_stack(list(range(k)), a.epochs, data, subset) for k in a.stacks}
    shared = range(min(a.stacks))
    rows, equal = [], 0
    for seed in shared:
        per_stack = [runs[k][seed].state_dict() for k in a.stacks]
        first = per_stack[0]
        same = all(torch.equal(first[n], other[n]) for other in per_stack[1:] for n in first)
        worst = max(float((first[n].float() - other[n].float()).abs().max()) for other in per_stack[1:] for n in first)
        equal += same
        rows.append(f"seed {seed}: {'bitwise equal' if same else f'differs, largest weight difference {worst:.3g}'}"
                    f" in stacks of {', '.join(map(str, a.stacks))}")
    print(f"digits recipe, Trunc Normal, {a.epochs} epochs, {a.train_size or len(data.train_labels)} training "
          f"images, native bf16: {cpu_has_native_bf16()}, {torch.get_num_threads()} threads")
    print("\n".join(rows))
    print(f"bitwise equal: {equal} of {len(shared)} shared seeds")
    return {"equal": equal, "shared": len(shared)}


if __name__ == "__main__":
    main()
