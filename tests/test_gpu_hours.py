"""tools/gpu_hours.py counts the FLOPs of one training step and prices the paper's grid at the
rate the priced probe file (tools/probe_file.py's PRICED, a GPU's own run of benchmarks/gpu_probe.py)
measured; these check its counts against closed forms derived by hand from the architectures,
that the rate is the file's, and that the main table is the paper's five initializers with the
project's sixth arm on a line of its own.

What the closed forms include: every matrix product and convolution, forward and backward,
at 2 FLOPs per multiply-add. Their backward costs the forward's multiply-adds once per
gradient taken: the input gradient and the weight gradient, so 3x the forward; the first
layer takes no input gradient (the image needs none), so 2x; a frozen weight takes no weight
gradient. Not included (nor counted by torch's counter): norms, activations, softmax, biases,
residual adds, pooling and the loss, a fraction of a percent of a step; hence the 1 % slack.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import structinit as si
from tools import gpu_hours
from tools.gpu_hours import RATE_ROW, conv_backward_flops, count_train_flops, read_probe
from tools.probe_file import PRICED
from structinit.config import FILTER_MODES
from structinit.pipeline.load import load_params

REPO = Path(__file__).resolve().parents[1]

RELATIVE = 1e-2


def vit_train_flops(image, channels, patch, dim, depth, classes, mlp_ratio=4):
    """One image's training FLOPs of the paper's ViT (no class token, average pooling)."""
    tokens = (image // patch) ** 2
    patch_embedding = tokens * dim * channels * patch ** 2
    linears = tokens * dim * dim * (3 + 1 + 2 * mlp_ratio)    # qkv, output projection, MLP in and out
    # q @ k.T and attention @ v: per head tokens^2 x head_dim each, so tokens^2 x dim over the heads
    attention = 2 * tokens ** 2 * dim
    head = dim * classes                                     # on the pooled token
    multiply_adds = 2 * patch_embedding + 3 * (depth * (linears + attention) + head)
    return 2 * multiply_adds


def convmixer_train_flops(image, channels, patch, dim, depth, kernel, classes, learned_filters=True):
    """One image's training FLOPs of timm's ConvMixer; frozen spatial filters take no weight gradient."""
    tokens = (image // patch) ** 2
    stem = tokens * dim * channels * patch ** 2
    depthwise = tokens * dim * kernel ** 2                   # one k x k filter per channel
    pointwise = tokens * dim * dim
    head = dim * classes
    depthwise_passes = 3 if learned_filters else 2
    multiply_adds = 2 * stem + depth * (depthwise_passes * depthwise + 3 * pointwise) + 3 * head
    return 2 * multiply_adds


@pytest.mark.parametrize("heads", [1, 4])
def test_vit_count_includes_attention(heads):
    # 64 tokens of width 48: attention is ~20 % of the step, so a count without it fails
    shape = dict(image=16, channels=3, patch=2, dim=48, depth=2, classes=10)
    model = si.create_vit(img_size=16, patch_size=2, embed_dim=48, depth=2, num_heads=heads, num_classes=10)
    counted = count_train_flops(model, image_size=16, channels=3)
    assert counted == pytest.approx(vit_train_flops(**shape), rel=RELATIVE)


@pytest.mark.parametrize("mode", FILTER_MODES)
def test_convmixer_count_treats_depthwise_convs_as_depthwise(mode):
    shape = dict(image=16, channels=3, patch=2, dim=32, depth=2, kernel=3, classes=10)
    model = si.create_convmixer(dim=32, depth=2, kernel_size=3, patch_size=2, num_classes=10, filter_mode=mode)
    counted = count_train_flops(model, image_size=16, channels=3)
    expected = convmixer_train_flops(**shape, learned_filters=mode == "learned")
    assert counted == pytest.approx(expected, rel=RELATIVE)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("groups", [1, 2, 8])
def test_grouped_conv_step_is_three_forwards(groups, transposed):
    # a lone conv whose input takes a gradient: forward, input gradient, weight gradient
    layer = (torch.nn.ConvTranspose2d if transposed else torch.nn.Conv2d)(8, 16, 3, padding=1, groups=groups)
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    counter = FlopCounterMode(display=False, custom_mapping={torch.ops.aten.convolution_backward: conv_backward_flops})
    with counter:
        layer(x).sum().backward()
    # every one of the 2 x 16 x 6 x 6 outputs sums 8 / groups channels x 3 x 3 taps (transposed:
    # every input feeds 16 / groups channels x 3 x 3 taps; with 8 in and 16 out that is the same)
    forward = 2 * (2 * 16 * 6 * 6) * (8 // groups) * 3 * 3
    assert counter.get_total_flops() == 3 * forward


def report(*flags, probe=None, params=None):
    """gpu_hours' text for these flags, priced from `probe` (a read_probe dict; the priced file's
    by default) and `params` (params.yaml's by default), in this process: the FLOP counts are
    cached, so each report after the first is quick."""
    a = gpu_hours.parser().parse_args(list(flags))
    return gpu_hours.report(a, params or load_params(REPO / "params.yaml"), probe or read_probe(REPO / a.probe))


def rows(text: str, block: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(f"| {block}")]


def total(text: str) -> float:
    return float(re.search(r"GPU-hours in all: \*\*(\d+)\*\*", text)[1])


SIXTH_ARM = "Mimetic Q/K only, beyond the paper"


def test_the_main_table_is_the_papers_five_and_the_sixth_arm_a_line_of_its_own():
    """The paper's grid: its 5 initializers x 5 seeds = 25 runs on each of its 4 datasets, in the
    total. params.yaml's grid also trains mimetic_qk (Mimetic Q/K only): its 5 seeds on the 4
    datasets are one line after the total, at the main table's rates, and outside the total;
    without that arm in params.yaml the line goes and the paper's grid stays as it was."""
    text = report()
    main = rows(text, "main table, ViT-T/")
    assert [r[1] for r in main] == ["cifar10", "cifar100", "svhn", "imagenet"] and all(r[2] == "25" for r in main), main
    assert ("main table: 5 initializers (the paper's: Kaiming Uniform, Trunc Normal, Mimetic, Imp.-3, Imp.-5) "
            "x 5 seeds per dataset, 100 runs") in text
    table = [r for r in rows(text, "") if r[0] not in ("block", "") and not r[0].startswith("-")]
    names = [r[0] for r in table]
    assert names.index("total: the paper's grid") == len(names) - 2 and names[-1] == SIXTH_ARM, names
    paper_rows, [grid_total], [arm] = table[:-2], rows(text, "total: the paper's grid"), rows(text, SIXTH_ARM)
    assert float(grid_total[-1]) == total(text) == pytest.approx(sum(float(r[-1]) for r in paper_rows), abs=len(table))
    per_run = sum(float(r[-2]) for r in main)
    assert arm[2] == "20" and float(arm[-1]) == pytest.approx(5 * per_run, abs=1), (arm, per_run)
    assert f"with Mimetic Q/K only: **{total(text) + float(arm[-1]):.0f}**" in text
    assert "`mimetic_qk`" in text and f"**{arm[-1]}** GPU-hours more, outside the paper's total" in text

    params = load_params(REPO / "params.yaml")
    params["grid"]["baselines"] = [b for b in params["grid"]["baselines"] if b != "mimetic_qk"]
    without = report(params=params)
    assert SIXTH_ARM not in without and "beyond the paper" not in without and total(without) == total(text)
    assert rows(without, "main table") == rows(text, "main table")


def test_the_default_probe_is_the_priced_file():
    assert REPO / gpu_hours.parser().parse_args([]).probe == PRICED and PRICED.exists()


def with_rate(text: str, rate: str) -> str:
    """A probe file's text with another ViT-T/2 rate."""
    return re.sub(rf"\| {re.escape(RATE_ROW)} \| [^|]+\|", f"| {RATE_ROW} | {rate} |", text)


def test_the_rate_comes_from_the_probe_file_and_names_its_card_and_commit(tmp_path):
    """Half the measured ViT-T/2 rate: twice the GPU-hours of every row it prices, and of the rows
    assumed at its TFLOP/s; the decode-bound ImageNet row stays. Card and commit are the file's."""
    committed = read_probe(PRICED)
    path = tmp_path / "gpu_probe_other.md"
    text = with_rate(PRICED.read_text(), f"{committed['rate'] / 2:,.0f}")
    path.write_text(re.sub(r"\| card \| [^|]+\|", "| card | Some GPU (40.0 GiB, 100 SMs) |", text))
    probe = read_probe(path)
    assert probe["rate"] == round(committed["rate"] / 2) and probe["card"] == "Some GPU"
    fast, slow = report(), report(probe=probe)
    assert f"on one {committed['card']}" in fast and f"project at {committed['commit']}" in fast
    assert f"**{committed['rate']:,.0f} img/s**" in fast
    assert "on one Some GPU" in slow and f"**{probe['rate']:,.0f} img/s**" in slow
    for block in ("main table, ViT-T/2", "pseudo-input", "heads/width", "ConvMixer"):
        for f, s in zip(rows(fast, block), rows(slow, block)):
            assert float(s[-1]) == pytest.approx(2 * float(f[-1]), abs=1), (f, s)
    assert [r[6] for r in rows(fast, "main table, ViT-T/2")] == ["measured", "assumed: CIFAR-10's img/s",
                                                               "assumed: CIFAR-10's img/s"]
    assert all(r[6].startswith("assumed") for r in rows(fast, "heads/width") + rows(fast, "ConvMixer"))
    assert rows(fast, "main table, ViT-T/16") == rows(slow, "main table, ViT-T/16")   # JPEG decoding binds


def test_a_probe_file_without_a_rate_is_a_clear_error(tmp_path):
    path = tmp_path / "probe.md"
    path.write_text(with_rate(PRICED.read_text(), "-"))
    r = subprocess.run([sys.executable, "-m", "tools.gpu_hours", "--probe", str(path)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode != 0 and "has no ViT-T/2 rate" in r.stderr and "gpu_probe" in r.stderr, r.stderr
    assert r.stdout == ""


def test_the_committed_report_is_what_the_command_writes_now():
    """docs/includes/gpu_hours.md (quoted by docs/scaling-out.md; the README states its figures) from
    the priced probe file and params.yaml; after a new priced file or a change of the grid:
    python -m tools.gpu_hours --write."""
    assert (REPO / "docs/includes/gpu_hours.md").read_text() == report()


def test_the_memory_of_a_cell_says_how_the_trainer_trained_its_seeds(tmp_path):
    """A probe run on a GPU fills the stack-of-5 row of its part (b); on a card where one ViT-T/2
    fills the GPU the trainer trains the seeds one after another, and the report says so."""
    text = PRICED.read_text()
    row = re.compile(r"^\| the project's trainer, stack of 5 \|.*$", re.M)
    for how, said in (("one after another: training 1 model(s) timm's own module on cuda", "one after another"),
                      ("training 5 model(s) stacked (batched) on cuda", "a stack of 5 models")):
        path = tmp_path / "probe.md"
        path.write_text(row.sub(f"| the project's trainer, stack of 5 | 5 | 512 | 450.0 | 451.0 | 56.7 | 0.071 | "
                                f"13.5 | {how} |", text))
        probe = read_probe(path)
        assert probe["stack_peak_gib"] == 13.5 and probe["stack_models"] == 5
        assert said in report(probe=probe)
