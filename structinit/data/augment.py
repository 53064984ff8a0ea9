"""Batched, on-device data augmentation: RandAugment ("rand-m9-mstd0.5-inc1") + flips.

Every image in a batch draws its own ops and magnitudes, as timm's per-image PIL policy
does, but the whole batch is transformed at once on the training device with no host
sync: each op is computed for the whole batch and kept where it was drawn (`torch.where`),
which on small images is far cheaper than a per-image Python loop.

Images are float tensors in [0, 255], (B, C, H, W). The op set and magnitude mapping follow
timm's "increasing" RandAugment (inc1): magnitude m in [0, 10] drawn as N(m, mstd) per op.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from structinit.config import RandAugmentPolicy

OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize", "SolarizeAdd",
       "Color", "Contrast", "Brightness", "Sharpness", "ShearX", "ShearY", "TranslateX",
       "TranslateY")
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")


def _blend(img, other, factor):
    return (other + (img - other) * factor).clamp(0, 255)


def _gray(img):
    if img.shape[1] == 1:
        return img
    # ITU-R 601 luma, as PIL's convert("L"). Weights as Python numbers, not a tensor built
    # from a list: torch.tensor([...], device=cuda) is a host-to-device copy, a stream sync in
    # every step.
    r, g, b = img.unbind(1)
    return (r * 0.299 + g * 0.587 + b * 0.114).unsqueeze(1)


def _sharpen_source(img):
    """PIL's SMOOTH filter, borders left untouched."""
    c = img.shape[1]
    # made on the device: a tensor from a list, or k[1, 1] = 5, would copy from the host
    k = torch.ones(3, 3, device=img.device, dtype=img.dtype)
    k[1, 1].fill_(5)
    k = k / 13
    smooth = F.conv2d(img, k.expand(c, 1, 3, 3), padding=1, groups=c)
    out = img.clone()
    out[..., 1:-1, 1:-1] = smooth[..., 1:-1, 1:-1]
    return out


def autocontrast(img: torch.Tensor) -> torch.Tensor:
    """PIL's ImageOps.autocontrast (no cutoff) for a whole batch: each channel of each image
    stretched linearly so that its darkest pixel becomes 0 and its brightest 255; a flat
    channel is left as it is. img (B, C, H, W) float in [0, 255]; PIL's result to within 1
    (PIL truncates through a lookup table)."""
    lo = img.amin(dim=(2, 3), keepdim=True)
    hi = img.amax(dim=(2, 3), keepdim=True)
    scale = torch.where(hi > lo, 255 / (hi - lo).clamp(min=1e-3), torch.ones_like(hi))
    return torch.where(hi > lo, (img - lo) * scale, img).clamp(0, 255)


def equalize(img: torch.Tensor) -> torch.Tensor:
    """PIL's ImageOps.equalize for a whole batch at once: each channel of each image
    histogram-equalized, exactly as PIL does it. img (B, C, H, W) float in [0, 255] (rounded to
    integer levels first); returns integer levels as floats."""
    b, c, h, w = img.shape
    flat = img.round().clamp(0, 255).long().view(b * c, h * w)
    hist = torch.zeros(b * c, 256, device=img.device).scatter_add_(1, flat, torch.ones_like(flat, dtype=torch.float))
    # PIL: step = (pixels - count of the last non-empty bin) // 255
    idx = torch.arange(256, device=img.device).expand_as(hist)
    last = torch.where(hist > 0, idx, torch.zeros_like(idx)).amax(1, keepdim=True)
    step = ((h * w - hist.gather(1, last)) // 255)
    cum = torch.cumsum(hist, 1) - hist                      # pixels strictly below each bin
    lut = ((cum + step // 2) // step.clamp(min=1)).clamp(0, 255)
    lut = torch.where(step > 0, lut, idx.float())
    return lut.gather(1, flat).view(b, c, h, w)


def _affine(img, op, mag, sign, fill):
    """One grid_sample for every geometric op of the batch (identity elsewhere)."""
    b = img.shape[0]
    theta = torch.zeros(b, 2, 3, device=img.device, dtype=img.dtype)
    theta[:, 0, 0] = theta[:, 1, 1] = 1
    ang = sign * mag / 10 * math.radians(30)
    shear = sign * mag / 10 * 0.3
    shift = sign * mag / 10 * 0.45 * 2                       # fraction of size, in [-1, 1] units
    is_ = lambda name: op == OPS.index(name)  # noqa: E731
    rot = is_("Rotate")
    theta[:, 0, 0] = torch.where(rot, torch.cos(ang), theta[:, 0, 0])
    theta[:, 0, 1] = torch.where(rot, -torch.sin(ang), torch.where(is_("ShearX"), shear, theta[:, 0, 1]))
    theta[:, 1, 0] = torch.where(rot, torch.sin(ang), torch.where(is_("ShearY"), shear, theta[:, 1, 0]))
    theta[:, 1, 1] = torch.where(rot, torch.cos(ang), theta[:, 1, 1])
    theta[:, 0, 2] = torch.where(is_("TranslateX"), shift, theta[:, 0, 2])
    theta[:, 1, 2] = torch.where(is_("TranslateY"), shift, theta[:, 1, 2])
    grid = F.affine_grid(theta, list(img.shape), align_corners=False)
    # Sample (img - fill) with zero padding, so out-of-image pixels come back as `fill`.
    return F.grid_sample(img - fill, grid, mode="bilinear", padding_mode="zeros",
                         align_corners=False) + fill


def draw_rand_augment(b: int, policy: RandAugmentPolicy, generator: torch.Generator,
                      device: torch.device) -> list[dict[str, torch.Tensor]]:
    """The random numbers of RandAugment for b images, one dict per layer (op: -1 where the
    layer leaves the image, mag, sign; each (b,)), drawn from `generator` in the order
    rand_augment always drew them. Drawing is apart from transforming so that several models'
    batches, each drawn from its own generator, are transformed in one call."""
    layers = []
    for _ in range(policy.num_layers):
        op = torch.randint(0, len(OPS), (b,), device=device, generator=generator)
        apply = torch.rand(b, device=device, generator=generator) < policy.prob
        mag = (policy.magnitude + policy.magnitude_std *
               torch.randn(b, device=device, generator=generator)).clamp(0, 10)
        sign = torch.where(torch.rand(b, device=device, generator=generator) < 0.5, -1.0, 1.0)
        layers.append({"op": torch.where(apply, op, torch.full_like(op, -1)), "mag": mag, "sign": sign})
    return layers


def apply_rand_augment(img: torch.Tensor, draws: list[dict[str, torch.Tensor]], fill: torch.Tensor) -> torch.Tensor:
    """img (B, C, H, W) float in [0, 255], transformed by draws (draw_rand_augment's, one
    entry per image); fill (1, C, 1, 1) for pixels moved in from outside."""
    b = img.shape[0]
    col = lambda t: t.view(b, 1, 1, 1)  # noqa: E731
    for layer in draws:
        op, mag, sign = layer["op"], layer["mag"], layer["sign"]
        factor = col(1 + sign * mag / 10 * 0.9)
        bits = col(4 - (mag / 10 * 4).floor())
        candidates = {
            "AutoContrast": lambda: autocontrast(img),
            "Equalize": lambda: equalize(img),
            "Invert": lambda: 255 - img,
            "Posterize": lambda: (img / 2 ** (8 - bits)).floor() * 2 ** (8 - bits),
            "Solarize": lambda: torch.where(img >= col(256 - (mag / 10 * 256).floor()), 255 - img, img),
            "SolarizeAdd": lambda: torch.where(img < 128, (img + col((mag / 10 * 110).floor())).clamp(max=255), img),
            "Color": lambda: _blend(img, _gray(img), factor),
            "Contrast": lambda: _blend(img, _gray(img).mean(dim=(1, 2, 3), keepdim=True), factor),
            "Brightness": lambda: _blend(img, torch.zeros_like(img), factor),
            "Sharpness": lambda: _blend(img, _sharpen_source(img), factor),
        }
        out = img
        for name, fn in candidates.items():
            out = torch.where(col(op == OPS.index(name)), fn(), out)
        geometric = sum(op == OPS.index(n) for n in GEOMETRIC).bool()
        out = torch.where(col(geometric), _affine(img, op, mag, sign, fill), out)
        img = out
    return img


def rand_augment(img: torch.Tensor, policy: RandAugmentPolicy, generator: torch.Generator,
                 fill: torch.Tensor) -> torch.Tensor:
    """img (B, C, H, W) float in [0, 255]; fill (1, C, 1, 1) for pixels moved in from outside."""
    return apply_rand_augment(img, draw_rand_augment(img.shape[0], policy, generator, img.device), fill)


def draw_hflip(b: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """(b,) bool: which of b images random_hflip flips."""
    return torch.rand(b, device=device, generator=generator) < 0.5


def apply_hflip(img: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    return torch.where(flip.view(-1, 1, 1, 1), img.flip(-1), img)


def random_hflip(img: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return apply_hflip(img, draw_hflip(img.shape[0], generator, img.device))
