"""GPU-hours of the paper's grid: FLOPs per training image, counted on the pipeline's own models, x images x
epochs, at the ViT-T/2 rate a GPU probe file measured (PRICED, or --probe; a --tiny run's file is refused).
--write writes docs/includes/gpu_hours.md, which docs/scaling-out.md quotes. The probe files are
benchmarks/gpu_probe-<card>-<commit>.md (probe_name), one per GPU run of benchmarks/gpu_probe.py; to price
from a newer one, name it in PRICED and run --write.

    python -m tools.gpu_hours [--probe benchmarks/gpu_probe-<card>-<commit>.md] [--write]
"""
import argparse
import copy
import functools
import re
import sys
from math import prod
from pathlib import Path

import torch
from tabulate import tabulate
from torch.utils.flop_counter import FlopCounterMode

from structinit.config import FILTER_MODES, PSEUDO_INPUTS
from structinit.data.specs import DATASETS, TRAIN_IMAGES
from structinit.models import create_convmixer, create_vit
from structinit.pipeline.cells import main_inits
from structinit.pipeline.load import load_params
from structinit.reporting.paper import HEADS_WIDTH_INITS, MAIN as PAPER_MAIN
from structinit.reporting.presentation import init_label

REPO = Path(__file__).resolve().parents[1]
PROBES = REPO / "benchmarks"                           # where the committed GPU files live
PRICED = PROBES / "gpu_probe-h200-02d9857.md"          # the measurement the grid is priced from
SEEDS, STUDY_SEEDS = 5, 3      # per main-table cell (the pipeline's default) and per study cell
DECODE = 1000                  # assumed: ImageNet's JPEG-decoded img/s per GPU (the official command's 10 workers)
OUT = "docs/includes/gpu_hours.md"
# The probe file's rows, by the labels benchmarks/gpu_probe.py writes them with
TINY_LABEL = "tiny (CPU): not a measurement"
RATE_ROW = "ViT-T/2 images/s, epoch 2"
FLOPS_ROW = "FLOPs per training image, GFLOP"
PEAK_ROW = "peak memory (torch.cuda.max_memory_allocated), GiB"
ESTIMATE_ROW = "memory estimate the trainer printed, GiB"
STACK_ROW = "the project's trainer, stack of"   # ... N


def card_slug(card: str) -> str:
    """A card's name (as torch gives it) in a file name: lower case, dashed, without "NVIDIA"."""
    return re.sub(r"[^a-z0-9]+", "-", card.lower()).strip("-").removeprefix("nvidia-")


def probe_name(card: str, commit: str) -> str:
    """"NVIDIA H200", "02d9857" -> gpu_probe-h200-02d9857.md."""
    return f"gpu_probe-{card_slug(card)}-{commit}.md"


def probe_files(folder: Path = PROBES) -> list[Path]:
    return sorted(folder.glob("gpu_probe-*.md"))


class ProbeFileError(ValueError):
    """A probe file that cannot price the grid: missing, a --tiny run, or without a row the report states."""


def number(cell: str | None) -> float | None:
    """The first number in a cell ("5,032", "13.22 / 13.30"); None where there is none."""
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", cell or "")
    return float(m[0].replace(",", "")) if m else None


def table_rows(text: str) -> list[dict]:
    """Every row of every markdown table in `text`, as {header: cell}."""
    rows, headers = [], None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else None
        if cells is None or headers is None:
            headers = cells
        elif not set("".join(cells)) <= set("-: "):          # not the |---| line under the headers
            rows.append(dict(zip(headers, cells)))
    return rows


def read_probe(path: str | Path = PRICED) -> dict:
    """A full GPU run's card, commit, torch, ViT-T/2 rate, memory figures and stack-of-N row."""
    path, rerun = Path(path).resolve(), "run python -m benchmarks.gpu_probe on a GPU and price from its file"
    if not path.exists():
        raise ProbeFileError(f"{path}: no such probe file; {rerun}")
    rows = {next(iter(r.values()), ""): r for r in table_rows(path.read_text())}     # by their first cell
    value = {k: r.get("value") for k, r in rows.items()}
    if value.get("mode") != "full":                          # a --tiny run: toy sizes on a CPU
        raise ProbeFileError(f"{path} is a {value.get('mode') or 'file without a mode row'}: {rerun}")
    probe = {"file": path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path),
             "card": (value.get("card") or "").split(" (")[0], "commit": (value.get("commit") or "").split(" (")[0],
             "torch": value.get("torch"), "stack": next((r for k, r in rows.items() if k.startswith(STACK_ROW)), None)}
    numbers = {"rate": RATE_ROW, "gflop": FLOPS_ROW, "peak_gib": PEAK_ROW, "estimate_gib": ESTIMATE_ROW}
    probe |= {k: number(value.get(row)) for k, row in numbers.items()}
    if missing := [repr(numbers.get(k, k)) for k, v in probe.items() if not v or isinstance(v, float) and v <= 0]:
        raise ProbeFileError(f"{path} has no {', '.join(missing)}: {rerun}")
    return probe


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, **_) -> int:
    """aten.convolution_backward: the input and the weight gradient each take the forward's multiply-adds
    (torch's own formula drops `groups` for the weight gradient, counting a depthwise convolution as a dense
    one). The weight is (C_out, C_in/groups, *k), transposed (C_in, C_out/groups, *k); biases are not counted."""
    forward_macs = prod(x_shape if transposed else grad_out_shape) * prod(w_shape[1:])
    return 2 * forward_macs * (int(output_mask[0]) + int(output_mask[1]))


def count_train_flops(model, image_size: int, channels: int, batch: int = 2) -> float:
    """FLOPs per image of one training step (forward + backward) of a copy of `model` on the meta device."""
    model = copy.deepcopy(model).to("meta")
    for module in model.modules():     # explicit matmuls: FlopCounterMode has no formula for the fused kernel
        if getattr(module, "fused_attn", False):
            module.fused_attn = False
    x = torch.randn(batch, channels, image_size, image_size, device="meta")
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops})
    with counter:
        model(x).float().logsumexp(-1).sum().backward()
    return counter.get_total_flops() / batch


@functools.cache                 # each count is a training step, and a report asks for ViT-T/2's more than once
def flops(dataset: str, convmixer: str | None = None, **override) -> float:
    """A training image's FLOPs of the dataset's ViT (with `override`), or of a ConvMixer size with learned
    filters (the frozen modes skip the depthwise weight gradient, at most ~1.6 % of a step: an upper bound)."""
    params, spec = load_params(), DATASETS[dataset]
    with torch.device("meta"):            # built without weights: only their shapes are counted
        model = (create_convmixer(**params["convmixer_sizes"][convmixer], num_classes=spec.num_classes) if convmixer
                 else create_vit(img_size=spec.image_size, num_classes=spec.num_classes, in_chans=spec.channels,
                                 **{**params["recipes"][dataset]["model"], **override}))
    return count_train_flops(model, spec.image_size, spec.channels)


def grid(params, rate: float) -> tuple[list[list], float]:
    """[block, dataset, runs, GFLOP/img, epochs, img/s per GPU, basis, GPU-h per run, GPU-hours] per block of the
    paper's grid (the studies at the paper's sizes), and the TFLOP/s the measured ViT-T/2 reached."""
    tflops, main, study = rate * flops("cifar10") / 1e12, len(PAPER_MAIN) * SEEDS, STUDY_SEEDS
    blocks = [      # block, dataset, runs, FLOPs per image, basis (None: not measured, see below)
        ("main table, ViT-T/2", "cifar10", main, flops("cifar10"), "measured"),
        # the same model up to its head: at CIFAR-10's img/s
        *[("main table, ViT-T/2", ds, main, flops(ds), "assumed: CIFAR-10's img/s") for ds in ("cifar100", "svhn")],
        ("main table, ViT-T/16", "imagenet", main, flops("imagenet"), None),
        *[(f"heads/width {n}", "cifar100", len(HEADS_WIDTH_INITS) * study,
           flops("cifar100", **params["model_shapes"][n]), None) for n in ("vit_t_h8", "vit_s_h6", "vit_s_h16")],
        # every (first block's pseudo-input, later blocks', shared or per-layer solve): ViT-T/2 on CIFAR-10
        ("pseudo-input 5x5x2", "cifar10", len(PSEUDO_INPUTS) ** 2 * 2 * study, flops("cifar10"), "measured"),
        *[(f"ConvMixer {n}", "cifar10", len(FILTER_MODES) * study, flops("cifar10", n), None)
          for n in ("cm256d8k3", "cm512d6k3", "cm512d6k5")]]
    rows = []
    for block, ds, runs, per_image, basis in blocks:
        img_s = rate
        if not basis:                   # at the TFLOP/s ViT-T/2 reached; ImageNet at most the CPU's JPEG decoding
            img_s, basis = tflops * 1e12 / per_image, f"assumed: {tflops:.1f} TFLOP/s as ViT-T/2"
            if ds == "imagenet" and DECODE < img_s:
                img_s, basis = DECODE, f"assumed: JPEG decoding, {DECODE:,} img/s"
        epochs = params["recipes"][ds]["train"]["epochs"]
        hours = TRAIN_IMAGES[ds] * epochs / img_s / 3600
        rows.append([block, ds, runs, per_image / 1e9, epochs, img_s, basis, hours, hours * runs])
    return rows, tflops


def report(params, probe: dict) -> str:
    """The markdown gpu_hours prints and --write writes: what docs/scaling-out.md explains, in figures."""
    rows, tflops = grid(params, probe["rate"])
    total, card, stack = sum(r[-1] for r in rows), probe["card"], probe["stack"]
    main = {r[1]: r for r in rows if r[0].startswith("main table")}
    # params.yaml's grid trains arms beyond the paper's five (mimetic_qk): each its own line, outside the total
    extra = {i: [f"{init_label(i)}, beyond the paper", f"the main table's {len(main)}", SEEDS * len(main), *[None] * 3,
                 "as the main table's rows", None, SEEDS * sum(r[-2] for r in main.values())]
             for i in main_inits(params) if i not in PAPER_MAIN}
    table = tabulate([*rows, ["total: the paper's grid", "", sum(r[2] for r in rows), *[None] * 3, "", None, total],
                      *extra.values()], missingval="", tablefmt="github",
                     headers=["block", "dataset", "runs", "GFLOP/img (train)", "epochs", "img/s per GPU", "rate",
                              "GPU-h per run", "GPU-hours"], floatfmt=("", "", "", ".2f", "", ",.0f", "", ".2f", ".0f"))
    imagenet = main["imagenet"]
    compute = TRAIN_IMAGES["imagenet"] * imagenet[4] * imagenet[3] * 1e9 / (tflops * 1e12) / 3600
    how = "one after another" if "one after another" in stack.get("how", "") else "stacked"
    return (
        f"GPU-hours of the paper's grid on one {card}, priced from `{probe['file']}` (project at {probe['commit']}, "
        f"torch {probe['torch']}; measured by `python -m benchmarks.gpu_probe`): the project's trainer trains ViT-T/2 "
        f"end to end with the paper's recipe (RandAugment, flips, batch 512, bf16) at **{probe['rate']:,.0f} img/s** "
        f"on that card, {tflops:.1f} TFLOP/s at its {flops('cifar10') / 1e9:.2f} counted GFLOP per image. Written by "
        f"`python -m tools.gpu_hours --write`.\n\n{table}\n\n"
        f"- main table: {len(PAPER_MAIN)} initializers (the paper's: {', '.join(map(init_label, PAPER_MAIN))}) x "
        f"{SEEDS} seeds per dataset, {sum(r[2] for r in main.values())} runs: **{sum(r[-1] for r in main.values()):.0f}"
        f"** GPU-hours. One ImageNet run's arithmetic at {tflops:.1f} TFLOP/s is {compute:.0f} of its "
        f"{imagenet[-2]:.0f} GPU-hours: JPEG decoding, not the GPU, sets its pace.\n"
        f"- memory of a CIFAR cell (ViT-T/2, batch 512, bf16): one model peaks at {probe['peak_gib']:g} GiB "
        f"(torch.cuda.max_memory_allocated), the trainer estimated {probe['estimate_gib']:g} GiB; a cell's "
        f"{number(stack['models']):.0f} seeds ({how}, RandAugment off) peak at {number(stack['peak GiB']):g} GiB.\n\n"
        f"GPU-hours in all: **{total:.0f}** on {card}s (the paper's grid)"
        + "".join(f"; with {init_label(i)}: **{total + r[-1]:.0f}**" for i, r in extra.items()) + ".\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", default=PRICED, help="the probe file to price from (default: PRICED)")
    ap.add_argument("--write", action="store_true", help=f"also write {OUT}")
    a = ap.parse_args()
    try:
        text = report(load_params(), read_probe(a.probe))
    except ProbeFileError as e:
        sys.exit(f"gpu_hours: {e}")
    print(text, end="")
    if a.write:
        (REPO / OUT).write_text(text)


if __name__ == "__main__":
    main()
