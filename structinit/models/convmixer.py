"""ConvMixer (timm's) with the paper's four spatial-filter modes (method page, section 6).

The depthwise k x k convolutions are the "spatial filters"; channel mixing (1x1 convs) is
always learned. Frozen modes set `requires_grad=False` on the depthwise weights only.
"""
from __future__ import annotations

import torch
from timm.models.convmixer import ConvMixer

from structinit.config import FILTER_MODES



def create_convmixer(dim: int, depth: int, kernel_size: int, patch_size: int, num_classes: int,
                     in_chans: int = 3, filter_mode: str = "learned", seed: int = 0) -> ConvMixer:
    """timm's ConvMixer; every weight is a function of `seed` (the global RNG is forked, not
    consumed), as `initialize` does for the ViTs."""
    if filter_mode not in FILTER_MODES:
        raise ValueError(f"unknown filter_mode {filter_mode!r}; choose one of {FILTER_MODES}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ConvMixer(dim=dim, depth=depth, kernel_size=kernel_size, patch_size=patch_size,
                          in_chans=in_chans, num_classes=num_classes)
    set_spatial_filters(model, filter_mode, seed=seed)
    return model


def spatial_filters(model: torch.nn.Module) -> list[torch.nn.Conv2d]:
    """The depthwise (groups == channels, k > 1) convolutions of a model."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)
            and m.groups == m.in_channels > 1 and m.kernel_size[0] > 1]


@torch.no_grad()
def set_spatial_filters(model: torch.nn.Module, mode: str, seed: int = 0) -> None:
    if mode not in FILTER_MODES:
        raise ValueError(f"unknown filter_mode {mode!r}; choose one of {FILTER_MODES}")
    g = torch.Generator().manual_seed(seed)
    for conv in spatial_filters(model):
        w = conv.weight  # (C, 1, k, k)
        c, _, k, _ = w.shape
        if mode == "random":
            w.copy_((torch.rand(w.shape, generator=g) * 2 - 1) / k)
        elif mode == "impulse":
            # One tap per channel, uniform over the k*k positions; the constant is 1 so the
            # filter is a pure shift of its channel.
            tap = torch.randint(0, k * k, (c,), generator=g)
            w.copy_(torch.nn.functional.one_hot(tap, k * k).float().view(c, 1, k, k))
        elif mode == "box":
            w.fill_(1.0 / (k * k))
        conv.weight.requires_grad_(mode == "learned")
