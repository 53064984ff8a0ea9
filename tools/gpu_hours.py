"""GPU-hours of the paper's grid, priced from a GPU probe file: counted FLOPs x images x epochs
at the rate the probe measured.

    python -m tools.gpu_hours [--probe benchmarks/gpu_probe-<card>-<commit>.md] [--seeds 5] [--study-seeds 3]
                              [--tflops T] [--decode 1000] [--write [docs/includes/gpu_hours.md]]

read_probe takes the card, torch, the commit and the ViT-T/2 rate (the trainer end to end, the
paper's CIFAR recipe) from the file (default: tools/probe_file.py's PRICED); a file without the
rate (a --tiny run) is refused. That rate prices the rows of that model and recipe; the others
are "assumed": CIFAR-100 and SVHN at CIFAR-10's images/s, other models at the TFLOP/s the
measured ViT-T/2 reached (or --tflops), ImageNet at most --decode JPEG-decoded images/s per GPU.
FLOPs per training image are counted on the pipeline's own models (count_train_flops). An arm
beyond the paper's five (mimetic_qk) is its own line, outside the total. --write writes
docs/includes/gpu_hours.md, which docs/scaling-out.md quotes.
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
from structinit.reporting.paper import HEADS_WIDTH_INITS as PAPER_HEADS_WIDTH_INITS, MAIN as PAPER_MAIN
from structinit.reporting.presentation import init_label
from tools.probe_file import PRICED, REPO

# The paper's grid: the main table's five initializers on its four datasets, the studies at the
# paper's sizes (whatever params.yaml trims them to on digits).
PAPER_MAIN_INITS = len(PAPER_MAIN)                  # Kaiming Uniform, Trunc Normal, Mimetic, Imp.-3, Imp.-5
MAIN_DATASETS = ("cifar10", "cifar100", "svhn", "imagenet")    # the paper's main-table columns
HEADS_WIDTH_INITS = len(PAPER_HEADS_WIDTH_INITS)    # Trunc Normal, Mimetic, Imp.-3
# every (first-block pseudo-input, later blocks' pseudo-input, shared or per-layer solve)
PSEUDO_INPUT_VARIANTS = len(PSEUDO_INPUTS) ** 2 * 2

# The probe file's rows this reads, by their labels (benchmarks/gpu_probe.py writes them)
TINY_LABEL = "tiny (CPU): not a measurement"
FLOPS_ROW = "FLOPs per training image, GFLOP"
STACK_ROW = "the project's trainer, stack of"   # ... N
RATE_ROW = "ViT-T/2 images/s, epoch 2"
PEAK_ROW = "peak memory (torch.cuda.max_memory_allocated), GiB"
ESTIMATE_ROW = "memory estimate the trainer printed, GiB"


class ProbeFileError(ValueError):
    """A probe file that cannot price the grid: missing, a tiny run, or without the rate."""


def number(cell: str | None) -> float | None:
    """The first number in a cell ("5,032", "13.22 / 13.30"); None where there is none."""
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", cell or "")
    return float(m[0].replace(",", "")) if m else None


def table_rows(text: str) -> list[dict]:
    """Every row of every markdown table in `text`, as {header: cell}."""
    rows, headers = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            headers = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if headers is None:
            headers = cells
        elif not set(line.replace("|", "").strip()) <= set("-: "):
            rows.append(dict(zip(headers, cells)))
    return rows


def read_probe(path: str | Path = PRICED) -> dict:
    """What the pricing needs from a probe file: card, commit, torch, mode, the ViT-T/2 rate,
    FLOPs per image, and the memory figures (None where not measured)."""
    path = Path(path)
    if not path.exists():
        raise ProbeFileError(f"{path}: no such probe file; run python -m benchmarks.gpu_probe on a GPU")
    rows = table_rows(path.read_text())
    value = {r["what"]: r.get("value") for r in rows if "what" in r}
    mode = value.get("mode") or ""
    if mode.startswith("tiny"):
        raise ProbeFileError(f"{path} is a {TINY_LABEL}: run python -m benchmarks.gpu_probe on a GPU")
    rate = number(value.get(RATE_ROW))
    if rate is None or rate <= 0:
        raise ProbeFileError(f"{path} has no ViT-T/2 rate (the row '{RATE_ROW}'): "
                             "run python -m benchmarks.gpu_probe on a GPU and price from its file")
    stack = next((r for r in rows if r.get("step", "").startswith(STACK_ROW)), {})
    return {"card": (value.get("card") or "an unnamed card").split(" (")[0],
            "commit": (value.get("commit") or "unknown").split(" (")[0], "torch": value.get("torch") or "unknown",
            "mode": mode, "rate": rate, "gflop": number(value.get(FLOPS_ROW)),
            "peak_gib": number(value.get(PEAK_ROW)), "estimate_gib": number(value.get(ESTIMATE_ROW)),
            "stack_models": number(stack.get("models")), "stack_peak_gib": number(stack.get("peak GiB")),
            "stack_one_by_one": "one after another" in stack.get("how", "")}


def conv_backward_flops(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                        _output_padding, _groups, output_mask, **_) -> int:
    """FLOPs of aten.convolution_backward: the input and the weight gradient each take the
    forward's multiply-adds. torch's own formula drops `groups` for the weight gradient (a
    depthwise convolution's counted as a dense one's); the bias gradient is a sum, not counted.
    The weight is (C_out, C_in/groups, *k), transposed (C_in, C_out/groups, *k)."""
    forward_macs = prod(x_shape if transposed else grad_out_shape) * prod(w_shape[1:])
    return 2 * forward_macs * (int(output_mask[0]) + int(output_mask[1]))


def count_train_flops(model, image_size: int, channels: int, batch: int = 2) -> float:
    """FLOPs per image of one training step (forward + backward) of `model` (left as it is), on a
    copy on the meta device (shapes only). Attention runs as explicit matmuls: the fused kernel
    has no formula in FlopCounterMode, which would count no attention at all."""
    model = copy.deepcopy(model).to("meta")
    for module in model.modules():
        if getattr(module, "fused_attn", False):
            module.fused_attn = False
    x = torch.randn(batch, channels, image_size, image_size, device="meta")
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops})
    with counter:
        model(x).float().logsumexp(-1).sum().backward()
    return counter.get_total_flops() / batch


@functools.cache                 # a report asks for ViT-T/2's count more than once; each is a training step
def vit(dataset: str, **override) -> float:
    params = load_params()
    spec = DATASETS[dataset]
    shape = {**params["recipes"][dataset]["model"], **override}
    with torch.device("meta"):            # built without weights: only their shapes are counted
        model = create_vit(img_size=spec.image_size, num_classes=spec.num_classes, in_chans=spec.channels, **shape)
    return count_train_flops(model, spec.image_size, spec.channels)


def convmixer(size: dict) -> float:
    """Counted with learned spatial filters: the three frozen modes skip the depthwise weight
    gradient, at most ~1.6 % of a step for the paper's sizes, so the row is an upper bound."""
    with torch.device("meta"):
        model = create_convmixer(**size, num_classes=10)
    return count_train_flops(model, 32, 3)


def extra_arms(params) -> list[str]:
    """The main grid's initializers beyond the paper's five (params.yaml's grid: mimetic_qk)."""
    return [init for init in main_inits(params) if init not in PAPER_MAIN]


def basis_rows(a, params, probe: dict) -> tuple[list[list], float]:
    """[block, dataset, runs, GFLOP/img, epochs, img/s per GPU, basis, GPU-h per run, GPU-hours] per
    block of the paper's grid, and the TFLOP/s the measured ViT-T/2 reached."""
    arms = PAPER_MAIN_INITS
    measured_flops = vit("cifar10")
    reached = probe["rate"] * measured_flops / 1e12          # TFLOP/s of the measured run, counted
    tflops = a.tflops or reached
    at_tflops = f"assumed: {tflops:.1f} TFLOP/s" + ("" if a.tflops else " as ViT-T/2")
    rows = []

    def epochs(dataset):                      # the studies run on the dataset's recipe
        return params["recipes"][dataset]["train"]["epochs"]

    def add(block, runs, flops_per_image, dataset, rate=None, basis=None, decode_bound=False):
        """rate: images/s per GPU (a measured row, or one scaled by images); else from FLOPs."""
        if rate is None:
            rate, basis = tflops * 1e12 / flops_per_image, at_tflops
            if decode_bound and a.decode < rate:
                rate, basis = a.decode, f"assumed: JPEG decoding, {a.decode:,.0f} img/s"
        seconds = TRAIN_IMAGES[dataset] * epochs(dataset) / rate
        rows.append([block, dataset, runs, flops_per_image / 1e9, epochs(dataset), rate, basis,
                     seconds / 3600, seconds / 3600 * runs])

    add("main table, ViT-T/2", arms * a.seeds, measured_flops, "cifar10", probe["rate"], "measured")
    for ds in ("cifar100", "svhn"):
        add("main table, ViT-T/2", arms * a.seeds, vit(ds), ds, probe["rate"], "assumed: CIFAR-10's img/s")
    add("main table, ViT-T/16", arms * a.seeds, vit("imagenet"), "imagenet", decode_bound=True)
    shapes = params["model_shapes"]
    for name in ("vit_t_h8", "vit_s_h6", "vit_s_h16"):           # heads/width on CIFAR-100
        add(f"heads/width {name}", HEADS_WIDTH_INITS * a.study_seeds, vit("cifar100", **shapes[name]), "cifar100")
    add("pseudo-input 5x5x2", PSEUDO_INPUT_VARIANTS * a.study_seeds, measured_flops, "cifar10", probe["rate"],
        "measured")
    for name in ("cm256d8k3", "cm512d6k3", "cm512d6k5"):          # every filter mode each
        add(f"ConvMixer {name}", len(FILTER_MODES) * a.study_seeds, convmixer(params["convmixer_sizes"][name]),
            "cifar10")
    return rows, reached


def arm_row(init: str, rows: list[list], seeds: int) -> list:
    """One initializer beyond the paper's, `seeds` runs on each of the main table's datasets at
    those rows' rates: one line of the table, outside the paper's total."""
    per_run = {r[1]: r[-2] for r in rows if r[0].startswith("main table")}
    return [f"{init_label(init)}, beyond the paper", f"the main table's {len(MAIN_DATASETS)}",
            seeds * len(MAIN_DATASETS), None, None, None, "as the main table's rows", None,
            seeds * sum(per_run[d] for d in MAIN_DATASETS)]


def report(a, params, probe: dict) -> str:
    """The markdown gpu_hours prints and --write writes."""
    rows, reached = basis_rows(a, params, probe)
    arms = PAPER_MAIN_INITS
    total = sum(r[-1] for r in rows)
    main_total = sum(r[-1] for r in rows if r[0].startswith("main table"))
    main_runs = sum(r[2] for r in rows if r[0].startswith("main table"))
    extra = {init: arm_row(init, rows, a.seeds) for init in extra_arms(params)}
    card = probe["card"]
    grid = tabulate(rows + [["total: the paper's grid", "", sum(r[2] for r in rows), None, None, None, "", None, total]]
                    + list(extra.values()),
                    headers=["block", "dataset", "runs", "GFLOP/img (train)", "epochs", "img/s per GPU", "rate",
                             "GPU-h per run", "GPU-hours"],
                    floatfmt=("", "", "", ".2f", "", ",.0f", "", ".2f", ".0f"), missingval="", tablefmt="github")
    paper_inits = ", ".join(init_label(i) for i in PAPER_MAIN)
    imagenet = next(r for r in rows if r[1] == "imagenet")         # [.., GFLOP/img, epochs, .., h per run, ..]
    tflops = a.tflops or reached
    imagenet_compute = TRAIN_IMAGES["imagenet"] * imagenet[4] * imagenet[3] * 1e9 / (tflops * 1e12) / 3600
    extra_lines = "".join(
        f"- beyond the paper: {init_label(init)} (`{init}`, params.yaml's grid trains it beside the paper's "
        f"five) is its own line, {a.seeds} seeds on each of the {len(MAIN_DATASETS)} datasets at the main table's "
        f"rates: **{r[-1]:.0f}** GPU-hours more, outside the paper's total.\n"
        for init, r in extra.items())
    others = (f"at --tflops {a.tflops:g}" if a.tflops else
              f"at the {reached:.1f} TFLOP/s the measured ViT-T/2 reached ({probe['rate']:,.0f} img/s x its "
              f"{vit('cifar10') / 1e9:.2f} counted GFLOP per image)")
    memory = (f"one model peaks at {probe['peak_gib']:g} GiB (torch.cuda.max_memory_allocated, the trainer end "
              f"to end)" if probe["peak_gib"] else "one model's peak: not measured")
    if probe["estimate_gib"]:
        memory += f"; the trainer estimated {probe['estimate_gib']:g} GiB"
    if not probe["stack_peak_gib"]:
        stack = "a cell's 5 seeds together: not measured"
    elif probe["stack_one_by_one"]:
        stack = (f"the trainer trains a cell's {probe['stack_models']:.0f} seeds one after another on this card "
                 f"(peak {probe['stack_peak_gib']:g} GiB, RandAugment off)")
    else:
        stack = (f"a stack of {probe['stack_models']:.0f} models (a cell's seeds, RandAugment off) peaks at "
                 f"{probe['stack_peak_gib']:g} GiB")
    with_extra = "".join(f"; with {init_label(init)}: **{total + r[-1]:.0f}**" for init, r in extra.items())
    how = "measured by `python -m benchmarks.gpu_probe`" if probe["mode"] == "full" else probe["mode"]
    return (f"GPU-hours of the paper's grid on one {card}, priced from `{a.probe}` (project at {probe['commit']}, "
            f"torch {probe['torch']}; {how}): the project's trainer trains ViT-T/2 end to end with "
            f"the paper's recipe (RandAugment, flips, batch 512, bf16) at **{probe['rate']:,.0f} img/s** on that "
            f"card. Written by `python -m tools.gpu_hours --write`.\n\n"
            f"{grid}\n\n"
            f"- measured: ViT-T/2 with CIFAR-10's recipe at that rate, one model at a time per GPU (stacking a "
            f"cell's seeds buys nothing once one model fills the card); the pseudo-input study trains the same.\n"
            f"- assumed: CIFAR-100 and SVHN at CIFAR-10's img/s (the same model up to its head: time scales by "
            f"images); every other model {others}; ImageNet at most {a.decode:,.0f} JPEG-decoded img/s per GPU "
            f"(the official command's 10 workers). The small ConvMixers' rows are the least certain: at their "
            f"FLOPs the data path, not the model, may set the pace.\n"
            f"- not counted: evaluation (every epoch in the CIFAR recipes), the Imp. solves, data preparation.\n"
            f"- main table: {arms} initializers (the paper's: {paper_inits}) x {a.seeds} seeds per dataset, "
            f"{main_runs} runs: **{main_total:.0f}** GPU-hours. One ImageNet run's arithmetic at {tflops:.1f} "
            f"TFLOP/s is {imagenet_compute:.0f} of its {imagenet[-2]:.0f} GPU-hours: JPEG decoding, not the GPU, "
            f"sets its pace.\n"
            f"{extra_lines}"
            f"- memory of a CIFAR cell (ViT-T/2, batch 512, bf16, on the {card}): {memory}; {stack}.\n\n"
            f"GPU-hours in all: **{total:.0f}** on {card}s (the paper's grid){with_extra}.\n")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", default=PRICED.relative_to(REPO).as_posix(),
                    help="the probe file whose ViT-T/2 rate prices the grid (default: tools/probe_file.py's PRICED)")
    ap.add_argument("--seeds", type=int, default=5, help="seeds per main-table cell (the pipeline's default)")
    ap.add_argument("--study-seeds", type=int, default=3)
    ap.add_argument("--tflops", type=float,
                    help="sustained bf16 TFLOP/s of the models the probe did not measure "
                         "(default: what the measured ViT-T/2 reached)")
    ap.add_argument("--decode", type=float, default=1000.0,
                    help="ImageNet images/s per GPU from its CPU workers (assumed)")
    ap.add_argument("--write", nargs="?", const="docs/includes/gpu_hours.md", metavar="PATH",
                    help="also write the report (default docs/includes/gpu_hours.md, quoted by docs/scaling-out.md)")
    return ap


def main():
    a = parser().parse_args()
    try:
        probe = read_probe(a.probe)
    except ProbeFileError as e:
        sys.exit(f"gpu_hours: {e}")
    text = report(a, load_params(), probe)
    print(text, end="")
    if a.write:
        Path(a.write).write_text(text)


if __name__ == "__main__":
    main()
