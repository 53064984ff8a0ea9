"""GPU-hours of the paper's grid: counted FLOPs x images x epochs, at a stated GPU throughput.

    python -m benchmarks.gpu_hours [--seeds 5] [--study-seeds 3] [--tflops 100] [--decode 1000]

FLOPs per training image (forward + backward) are counted on the very models the pipeline
builds (torch's FlopCounterMode, one step, batch 2), per recipe in params.yaml. The GPU's
sustained throughput is an assumption, not a measurement (no GPU was available to measure
it): --tflops is the bf16 rate a ViT-T sustains (H100 peak dense bf16 is ~990 TFLOP/s; width
192 reaches a fraction of it). ImageNet is bounded below by JPEG decoding as well: --decode is
images/s each GPU's CPU workers deliver (the official command: 10 workers per GPU). Prints a
table per block of the grid and the total.
"""
import argparse

import torch
from tabulate import tabulate
from torch.utils.flop_counter import FlopCounterMode

import structinit  # noqa: F401  (pins CPU numerics)
from structinit.datasets import DATASETS, TRAIN_IMAGES
from structinit.models import create_convmixer, create_vit
from structinit.params import load_params

INITS = 5                                   # Kaiming Uniform, Trunc Normal, Mimetic, Imp.-3, Imp.-5


def train_flops_per_image(model, image_size: int, channels: int) -> float:
    x = torch.randn(2, channels, image_size, image_size)
    with FlopCounterMode(display=False) as counter:
        model(x).float().logsumexp(-1).sum().backward()
    return counter.get_total_flops() / 2


def vit(dataset: str, **override) -> float:
    params = load_params()
    spec = DATASETS[dataset]
    shape = {**params["recipes"][dataset]["model"], **override}
    model = create_vit(img_size=spec.image_size, num_classes=spec.num_classes, in_chans=spec.channels, **shape)
    return train_flops_per_image(model, spec.image_size, spec.channels)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="seeds per main-table cell (the pipeline's default)")
    ap.add_argument("--study-seeds", type=int, default=3)
    ap.add_argument("--tflops", type=float, default=100.0,
                    help="sustained bf16 TFLOP/s per GPU (assumed; ~10 %% of an H100's peak)")
    ap.add_argument("--decode", type=float, default=1000.0,
                    help="ImageNet images/s per GPU from its CPU workers (assumed)")
    a = ap.parse_args()
    params = load_params()
    rows = []

    def epochs(dataset):                      # the studies run on the dataset's recipe
        return params["recipes"][dataset]["train"]["epochs"]

    def add(block, runs, flops_per_image, dataset, epochs, decode_bound=False):
        images = TRAIN_IMAGES[dataset] * epochs
        seconds = flops_per_image * images / (a.tflops * 1e12)
        if decode_bound:
            seconds = max(seconds, images / a.decode)
        rows.append([block, dataset, runs, flops_per_image / 1e9, epochs, seconds / 3600, seconds / 3600 * runs])

    for ds in ("cifar10", "cifar100", "svhn"):
        add("main table, ViT-T/2", INITS * a.seeds, vit(ds), ds, params["recipes"][ds]["train"]["epochs"])
    add("main table, ViT-T/16", INITS * a.seeds, vit("imagenet"), "imagenet",
        params["recipes"]["imagenet"]["train"]["epochs"], decode_bound=True)
    shapes = params["model_shapes"]
    for name in ("vit_t_h8", "vit_s_h6", "vit_s_h16"):           # heads/width on CIFAR-100, 3 inits
        add(f"heads/width {name}", 3 * a.study_seeds, vit("cifar100", **shapes[name]), "cifar100", epochs("cifar100"))
    add("pseudo-input 5x5x2", 50 * a.study_seeds, vit("cifar10"), "cifar10", epochs("cifar10"))
    for name in ("cm256d8k3", "cm512d6k3", "cm512d6k5"):          # 4 filter modes each
        size = params["convmixer_sizes"][name]
        flops = train_flops_per_image(create_convmixer(**size, num_classes=10), 32, 3)
        add(f"ConvMixer {name}", 4 * a.study_seeds, flops, "cifar10", epochs("cifar10"))
    total = sum(r[-1] for r in rows)
    print(tabulate(rows + [["total", "", sum(r[2] for r in rows), None, None, None, total]],
                   headers=["block", "dataset", "runs", "GFLOP/img (train)", "epochs", "GPU-h per run", "GPU-hours"],
                   floatfmt=("", "", "", ".2f", "", ".2f", ".0f"), missingval="", tablefmt="github"))
    print(f"\nassumed: {a.tflops:.0f} TFLOP/s sustained per GPU; ImageNet at least {a.decode:.0f} img/s "
          f"per GPU of JPEG decoding. gpu_hours: {total:.0f}")


if __name__ == "__main__":
    main()
