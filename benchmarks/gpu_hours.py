"""GPU-hours of the paper's grid: counted FLOPs x images x epochs, at a stated GPU throughput.

    python -m benchmarks.gpu_hours [--seeds 5] [--study-seeds 3] [--tflops 100] [--decode 1000] [--paper-arms]

FLOPs per training image (forward + backward) are counted on the very models the pipeline
builds (torch's FlopCounterMode, one step, batch 2), per recipe in params.yaml. The counter
counts the matrix products and convolutions (2 FLOPs per multiply-add), which are all but a
fraction of a percent of the work; norms, activations, softmax and the optimizer step are not
counted. Two of its gaps are closed here (see `count_train_flops`): attention runs as explicit
matmuls, and grouped convolutions' gradients are counted per group. The GPU's
sustained throughput is an assumption, not a measurement (no GPU was available to measure
it): --tflops is the bf16 rate a ViT-T sustains (H100 peak dense bf16 is ~990 TFLOP/s; width
192 reaches a fraction of it). ImageNet is bounded below by JPEG decoding as well: --decode is
images/s each GPU's CPU workers deliver (the official command: 10 workers per GPU). Prints a
table per block of the grid and the total.
"""
import argparse
from math import prod

import torch
from tabulate import tabulate
from torch.utils.flop_counter import FlopCounterMode

from structinit.config import FILTER_MODES, PSEUDO_INPUTS
from structinit.data.specs import DATASETS, TRAIN_IMAGES
from structinit.models import create_convmixer, create_vit
from structinit.pipeline.cells import main_inits
from structinit.pipeline.params import load_params
from structinit.reporting.paper import HEADS_WIDTH_INITS as PAPER_HEADS_WIDTH_INITS, MAIN as PAPER_MAIN

# The main table is priced at the arms params.yaml's grid runs (what the documented GPU command,
# -S 'grid.datasets=[digits,cifar10,cifar100,svhn]', trains: the default's six, the paper's five
# and mimetic_qk); --paper-arms prices the paper's five. The studies are priced at the paper's
# sizes, whatever params.yaml trims them to on digits, so their counts come from its tables.
PAPER_MAIN_INITS = len(PAPER_MAIN)                  # Kaiming Uniform, Trunc Normal, Mimetic, Imp.-3, Imp.-5
HEADS_WIDTH_INITS = len(PAPER_HEADS_WIDTH_INITS)    # Trunc Normal, Mimetic, Imp.-3
# every (first-block pseudo-input, later blocks' pseudo-input, shared or per-layer solve)
PSEUDO_INPUT_VARIANTS = len(PSEUDO_INPUTS) ** 2 * 2


def conv_macs(x_shape, w_shape, out_shape, transposed: bool) -> int:
    """Multiply-adds of one convolution, grouped or not. The weight is (C_out, C_in/groups, *k)
    (transposed: (C_in, C_out/groups, *k)), so prod(w_shape[1:]) is the multiply-adds behind
    one output element, or, transposed, the ones fed by one input element."""
    return prod(x_shape if transposed else out_shape) * prod(w_shape[1:])


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, **_) -> int:
    """FLOPs of aten.convolution_backward. The input gradient and the weight gradient each take
    the forward's multiply-adds (the same input x weight products, summed over other indices).
    torch's own formula drops `groups` for the weight gradient, so it counts a depthwise
    convolution's as a dense one's, C times too many; the bias gradient is a sum, not counted."""
    forward_flops = 2 * conv_macs(x_shape, w_shape, grad_out_shape, transposed)
    return forward_flops * (int(output_mask[0]) + int(output_mask[1]))


def unfuse_attention(model: torch.nn.Module) -> int:
    """Make timm's attention run as explicit q @ k.T -> softmax -> @ v, and return how many
    modules it switched. The fused kernel (F.scaled_dot_product_attention; on CPU
    _scaled_dot_product_flash_attention_for_cpu) has no formula in FlopCounterMode, which
    would silently count no attention at all; the explicit matmuls are counted by its
    well-tested matmul formulas and are the same products (structinit/training/stacked.py runs the
    same path on CPU). A fused kernel's recomputation in the backward is an implementation
    detail and is not counted."""
    switched = 0
    for module in model.modules():
        if getattr(module, "fused_attn", False):
            module.fused_attn = False
            switched += 1
    return switched


def count_train_flops(model, image_size: int, channels: int, batch: int = 2) -> float:
    """FLOPs per image of one training step (forward + backward) of `model`."""
    unfuse_attention(model)
    x = torch.randn(batch, channels, image_size, image_size)
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops})
    with counter:
        model(x).float().logsumexp(-1).sum().backward()
    return counter.get_total_flops() / batch


def vit(dataset: str, **override) -> float:
    params = load_params()
    spec = DATASETS[dataset]
    shape = {**params["recipes"][dataset]["model"], **override}
    model = create_vit(img_size=spec.image_size, num_classes=spec.num_classes, in_chans=spec.channels, **shape)
    return count_train_flops(model, spec.image_size, spec.channels)


def convmixer(size: dict) -> float:
    """Counted with learned spatial filters: the three frozen modes skip the depthwise weight
    gradient, at most ~1.6 % of a step for the paper's sizes, so the row is an upper bound."""
    return count_train_flops(create_convmixer(**size, num_classes=10), 32, 3)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5, help="seeds per main-table cell (the pipeline's default)")
    ap.add_argument("--study-seeds", type=int, default=3)
    ap.add_argument("--tflops", type=float, default=100.0,
                    help="sustained bf16 TFLOP/s per GPU (assumed; ~10 %% of an H100's peak)")
    ap.add_argument("--decode", type=float, default=1000.0,
                    help="ImageNet images/s per GPU from its CPU workers (assumed)")
    ap.add_argument("--paper-arms", action="store_true",
                    help=f"price the paper's {PAPER_MAIN_INITS} main-table initializers, not params.yaml's grid")
    a = ap.parse_args()
    params = load_params()
    arms = PAPER_MAIN_INITS if a.paper_arms else len(main_inits(params))
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
        add("main table, ViT-T/2", arms * a.seeds, vit(ds), ds, params["recipes"][ds]["train"]["epochs"])
    add("main table, ViT-T/16", arms * a.seeds, vit("imagenet"), "imagenet",
        params["recipes"]["imagenet"]["train"]["epochs"], decode_bound=True)
    shapes = params["model_shapes"]
    for name in ("vit_t_h8", "vit_s_h6", "vit_s_h16"):           # heads/width on CIFAR-100
        add(f"heads/width {name}", HEADS_WIDTH_INITS * a.study_seeds, vit("cifar100", **shapes[name]),
            "cifar100", epochs("cifar100"))
    add("pseudo-input 5x5x2", PSEUDO_INPUT_VARIANTS * a.study_seeds, vit("cifar10"), "cifar10", epochs("cifar10"))
    for name in ("cm256d8k3", "cm512d6k3", "cm512d6k5"):          # every filter mode each
        add(f"ConvMixer {name}", len(FILTER_MODES) * a.study_seeds, convmixer(params["convmixer_sizes"][name]),
            "cifar10", epochs("cifar10"))
    total = sum(r[-1] for r in rows)
    print(tabulate(rows + [["total", "", sum(r[2] for r in rows), None, None, None, total]],
                   headers=["block", "dataset", "runs", "GFLOP/img (train)", "epochs", "GPU-h per run", "GPU-hours"],
                   floatfmt=("", "", "", ".2f", "", ".2f", ".0f"), missingval="", tablefmt="github"))
    whose = "the paper's" if a.paper_arms else "params.yaml's grid"
    print(f"\nmain table: {arms} initializers ({whose}) x {a.seeds} seeds per dataset")
    print(f"assumed: {a.tflops:.0f} TFLOP/s sustained per GPU; ImageNet at least {a.decode:.0f} img/s "
          f"per GPU of JPEG decoding. gpu_hours: {total:.0f}")


if __name__ == "__main__":
    main()
