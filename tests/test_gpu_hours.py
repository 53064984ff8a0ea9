"""benchmarks/gpu_hours.py counts the FLOPs of one training step; these check its counts against
closed forms derived by hand from the architectures.

What the closed forms include: every matrix product and convolution, forward and backward,
at 2 FLOPs per multiply-add. Their backward costs the forward's multiply-adds once per
gradient taken: the input gradient and the weight gradient, so 3x the forward; the first
layer takes no input gradient (the image needs none), so 2x; a frozen weight takes no weight
gradient. Not included (nor counted by torch's counter): norms, activations, softmax, biases,
residual adds, pooling and the loss, a fraction of a percent of a step; hence the 1 % slack.
"""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import structinit as si
from benchmarks.gpu_hours import conv_backward_flops, count_train_flops
from structinit.config import FILTER_MODES

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


def test_the_benchmark_prices_the_grid_params_yaml_runs():
    """The documented GPU command trains params.yaml's grid: 6 initializers x 5 seeds = 30 runs
    per dataset (90 for CIFAR-10/100 and SVHN), not the paper's 5 (--paper-arms)."""
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    ours, paper = (subprocess.run([sys.executable, "-m", "benchmarks.gpu_hours", *flags], cwd=repo,
                                  capture_output=True, text=True, check=True).stdout
                   for flags in ([], ["--paper-arms"]))
    rows = [line for line in ours.splitlines() if line.startswith("| main table, ViT-T/2")]
    assert len(rows) == 3 and all("|     30 |" in r for r in rows), rows
    assert "main table: 6 initializers (params.yaml's grid) x 5 seeds per dataset" in ours
    assert "main table: 5 initializers (the paper's) x 5 seeds per dataset" in paper
    total = [float(line.split("gpu_hours:")[1]) for line in (ours, paper) for line in line.splitlines()
             if "gpu_hours:" in line]
    assert total[0] > total[1]
