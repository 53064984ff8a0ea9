"""tools/gpu_hours.py prices the paper's grid from a probe file: its FLOP counts against closed forms derived
by hand from the architectures, its figures against the file's rate, and the committed report.

The closed forms count every matrix product and convolution at 2 FLOPs per multiply-add. A backward takes the
forward's multiply-adds once per gradient: input and weight, so 3x the forward; the first layer takes no input
gradient (the image needs none), so 2x; a frozen weight takes no weight gradient. Norms, activations, softmax,
biases, residual adds, pooling and the loss are not counted (nor by torch's counter): hence the 1 % slack.
"""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import structinit as si
from structinit.config import FILTER_MODES
from structinit.pipeline.load import load_params
from tools import gpu_hours
from tools.gpu_hours import PRICED, RATE_ROW, ProbeFileError, conv_backward_flops, count_train_flops, read_probe

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
    return 2 * (2 * patch_embedding + 3 * (depth * (linears + attention) + head))


def convmixer_train_flops(image, channels, patch, dim, depth, kernel, classes, learned_filters=True):
    """One image's training FLOPs of timm's ConvMixer; frozen spatial filters take no weight gradient."""
    tokens = (image // patch) ** 2
    stem = tokens * dim * channels * patch ** 2
    depthwise = tokens * dim * kernel ** 2                   # one k x k filter per channel
    pointwise = tokens * dim * dim
    return 2 * (2 * stem + depth * ((3 if learned_filters else 2) * depthwise + 3 * pointwise) + 3 * dim * classes)


@pytest.mark.parametrize("heads", [1, 4])
def test_vit_count_includes_attention(heads):
    # 64 tokens of width 48: attention is ~20 % of the step, so a count without it fails
    model = si.create_vit(img_size=16, patch_size=2, embed_dim=48, depth=2, num_heads=heads, num_classes=10)
    expected = vit_train_flops(image=16, channels=3, patch=2, dim=48, depth=2, classes=10)
    assert count_train_flops(model, image_size=16, channels=3) == pytest.approx(expected, rel=RELATIVE)


@pytest.mark.parametrize("mode", FILTER_MODES)
def test_convmixer_count_treats_depthwise_convs_as_depthwise(mode):
    model = si.create_convmixer(dim=32, depth=2, kernel_size=3, patch_size=2, num_classes=10, filter_mode=mode)
    expected = convmixer_train_flops(16, 3, patch=2, dim=32, depth=2, kernel=3, classes=10,
                                     learned_filters=mode == "learned")
    assert count_train_flops(model, image_size=16, channels=3) == pytest.approx(expected, rel=RELATIVE)


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
    assert counter.get_total_flops() == 3 * 2 * (2 * 16 * 6 * 6) * (8 // groups) * 3 * 3


def report(probe=None, params=None) -> str:
    """The report from `probe` (the priced file's by default) and `params`; FLOP counts are cached, so only the
    first is slow."""
    return gpu_hours.report(params or load_params(REPO / "params.yaml"), probe or read_probe(PRICED))


def rows(text: str, block: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith(f"| {block}")]


def total(text: str) -> float:
    return float(re.search(r"GPU-hours in all: \*\*(\d+)\*\*", text)[1])


def probe_file(tmp_path, *subs: tuple[str, str]) -> Path:
    """The priced probe file with `subs` (pattern, replacement) applied."""
    text = PRICED.read_text()
    for pattern, replacement in subs:
        text = re.sub(pattern, replacement, text, flags=re.M)
    (tmp_path / "probe.md").write_text(text)
    return tmp_path / "probe.md"


def test_the_committed_report_is_what_the_command_writes_now():
    """After a new priced file or a change of the grid: python -m tools.gpu_hours --write."""
    assert (REPO / "docs/includes/gpu_hours.md").read_text() == report()


def test_the_main_table_is_the_papers_five_and_the_sixth_arm_a_line_of_its_own():
    """The paper's 5 initializers x 5 seeds on its 4 datasets are in the total; params.yaml's sixth arm
    (mimetic_qk) is a line after it at the main table's rates, outside it, and goes with the arm."""
    text = report()
    main = rows(text, "main table, ViT-T/")
    assert [r[1] for r in main] == ["cifar10", "cifar100", "svhn", "imagenet"] and all(r[2] == "25" for r in main)
    assert ("main table: 5 initializers (the paper's: Kaiming Uniform, Trunc Normal, Mimetic, Imp.-3, Imp.-5) "
            "x 5 seeds per dataset, 100 runs") in text
    assert [r[6] for r in rows(text, "main table, ViT-T/2")] == ["measured", "assumed: CIFAR-10's img/s",
                                                               "assumed: CIFAR-10's img/s"]
    assert all(r[6].startswith("assumed") for r in rows(text, "heads/width") + rows(text, "ConvMixer"))
    table = [r for r in rows(text, "") if r[0] not in ("block", "") and not r[0].startswith("-")]
    assert [r[0] for r in table[-2:]] == ["total: the paper's grid", "Mimetic Q/K only, beyond the paper"]
    assert float(table[-2][-1]) == total(text) == pytest.approx(sum(float(r[-1]) for r in table[:-2]), abs=len(table))
    arm = table[-1]
    assert arm[2] == "20" and float(arm[-1]) == pytest.approx(5 * sum(float(r[-2]) for r in main), abs=1)
    assert f"with Mimetic Q/K only: **{total(text) + float(arm[-1]):.0f}**" in text

    params = load_params(REPO / "params.yaml")
    params["grid"]["baselines"].remove("mimetic_qk")
    without = report(params=params)
    assert "beyond the paper" not in without and "Mimetic Q/K" not in without and total(without) == total(text)
    assert rows(without, "main table") == rows(text, "main table")


def test_the_figures_are_the_probe_files(tmp_path):
    """Half the ViT-T/2 rate: twice the GPU-hours of every row but the decode-bound ImageNet one; the card,
    and how the trainer trained a cell's seeds, are the file's."""
    committed = read_probe(PRICED)
    probe = read_probe(probe_file(tmp_path, (rf"^\| {re.escape(RATE_ROW)} \| [^|]+\|",
                                             f"| {RATE_ROW} | {committed['rate'] / 2:,.0f} |"),
                                  (r"^\| card \| [^|]+\|", "| card | Some GPU (40.0 GiB, 100 SMs) |"),
                                  (r"^(\| the project's trainer, stack of 5 \|.*\|) one after another: [^|]*\|$",
                                   r"\1 training 5 model(s) stacked (batched) on cuda |")))
    fast, slow = report(), report(probe)
    assert f"on one {committed['card']}" in fast and "on one Some GPU" in slow
    assert probe["rate"] == round(committed["rate"] / 2) and f"**{probe['rate']:,.0f} img/s**" in slow
    for block in ("main table, ViT-T/2", "pseudo-input", "heads/width", "ConvMixer"):
        for f, s in zip(rows(fast, block), rows(slow, block), strict=True):
            assert float(s[-1]) == pytest.approx(2 * float(f[-1]), abs=1), (f, s)
    assert rows(fast, "main table, ViT-T/16") == rows(slow, "main table, ViT-T/16")   # JPEG decoding binds
    assert "seeds (one after another," in fast and "seeds (stacked," in slow


def test_a_probe_file_without_a_rate_is_a_clear_error(tmp_path):
    path = probe_file(tmp_path, (rf"^\| {re.escape(RATE_ROW)} \| [^|]+\|", f"| {RATE_ROW} | not measured |"))
    r = subprocess.run([sys.executable, "-m", "tools.gpu_hours", "--probe", str(path)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode != 0 and r.stdout == "", r.stdout
    assert f"has no '{RATE_ROW}'" in r.stderr and "run python -m benchmarks.gpu_probe on a GPU" in r.stderr, r.stderr
    with pytest.raises(ProbeFileError, match="no such probe file"):
        read_probe(tmp_path / "missing.md")
