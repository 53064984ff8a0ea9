"""The two framework-default baselines of the main table."""
from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def trunc_normal(model: nn.Module) -> None:
    """timm's ViT default: every Linear weight ~ trunc_normal(std 0.02), biases 0.

    Patch-embedding conv and norms keep their PyTorch defaults, as in timm.
    """
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


@torch.no_grad()
def kaiming_uniform(model: nn.Module) -> None:
    """PyTorch's own module defaults (Linear/Conv: kaiming_uniform a=sqrt(5)), no timm re-init."""
    for m in model.modules():
        if m is not model and hasattr(m, "reset_parameters"):
            m.reset_parameters()
