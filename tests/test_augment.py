import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from structinit.data.augment import OPS, RandAugmentPolicy, autocontrast, equalize, rand_augment, random_hflip


def _batch(n=16, c=3, s=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, c, s, s), generator=g).float()


def test_policy_parse():
    p = RandAugmentPolicy.parse("rand-m9-mstd0.5-inc1")
    assert (p.magnitude, p.magnitude_std, p.num_layers, p.increasing) == (9, 0.5, 2, True)
    assert RandAugmentPolicy.parse("rand-m5-n3-mstd0-inc1").num_layers == 3
    with pytest.raises(ValueError, match="unknown part 'q7'"):
        RandAugmentPolicy.parse("rand-m9-q7-inc1")
    with pytest.raises(ValueError, match="must start with 'rand'"):
        RandAugmentPolicy.parse("augmix-m9")


def test_equalize_and_autocontrast_match_pil():
    x = _batch(4, 3, 16)
    x[1] = x[1] // 4 + 100                                    # narrow histogram
    eq, ac = equalize(x), autocontrast(x)
    for i in range(4):
        pil = Image.fromarray(x[i].permute(1, 2, 0).numpy().astype(np.uint8))
        want_eq = torch.from_numpy(np.array(ImageOps.equalize(pil))).permute(2, 0, 1).float()
        want_ac = torch.from_numpy(np.array(ImageOps.autocontrast(pil))).permute(2, 0, 1).float()
        assert torch.equal(eq[i], want_eq)
        assert (ac[i] - want_ac).abs().max() < 1.01              # PIL truncates through a LUT


def test_rand_augment_is_per_image_in_range_and_reproducible():
    x = _batch(64)
    policy = RandAugmentPolicy.parse("rand-m9-mstd0.5-inc1")
    fill = torch.full((1, 3, 1, 1), 128.0)
    a = rand_augment(x, policy, torch.Generator().manual_seed(1), fill)
    b = rand_augment(x, policy, torch.Generator().manual_seed(1), fill)
    c = rand_augment(x, policy, torch.Generator().manual_seed(2), fill)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= 0 and a.max() <= 255
    changed = (a != x).flatten(1).any(1)
    # P(image untouched) = P(neither layer applies) = 0.25: some, not all, are untouched
    assert 0.5 < changed.float().mean() < 0.95


def test_hflip_flips_about_half():
    x = _batch(200, 1, 4)
    y = random_hflip(x, torch.Generator().manual_seed(0))
    flipped = (y == x.flip(-1)).flatten(1).all(1) & ~(y == x).flatten(1).all(1)
    assert 0.35 < flipped.float().mean() < 0.65
    assert ((y == x).flatten(1).all(1) | flipped).all()


def _pil_ops(img: Image.Image, fill: int) -> dict[str, list[Image.Image]]:
    """timm's increasing RandAugment ops at magnitude 9 as PIL computes them, each with both
    signs where the op has one: posterize to 1 bit, solarize from 26, add 99 below 128,
    enhance by 1 +- 0.81, rotate 27 degrees, shear 0.27, translate 0.405 of the size."""
    size = img.width
    bilinear, affine = Image.Resampling.BILINEAR, Image.Transform.AFFINE
    factors, shear, degrees, shift = (1.81, 0.19), 0.27, 27.0, 0.405 * size
    transform = lambda *coeffs: img.transform(img.size, affine, coeffs, bilinear, fillcolor=(fill,) * 3)  # noqa: E731
    add_lut = [min(255, i + 99) if i < 128 else i for i in range(256)] * 3
    c = size / 2
    return {
        "AutoContrast": [ImageOps.autocontrast(img)],
        "Equalize": [ImageOps.equalize(img)],
        "Invert": [ImageOps.invert(img)],
        "Posterize": [ImageOps.posterize(img, 1)],
        "Solarize": [ImageOps.solarize(img, 26)],
        "SolarizeAdd": [img.point(add_lut)],
        "Color": [ImageEnhance.Color(img).enhance(f) for f in factors],
        "Contrast": [ImageEnhance.Contrast(img).enhance(f) for f in factors],
        "Brightness": [ImageEnhance.Brightness(img).enhance(f) for f in factors],
        "Sharpness": [ImageEnhance.Sharpness(img).enhance(f) for f in factors],
        "Rotate": [img.rotate(d, resample=bilinear, fillcolor=(fill,) * 3) for d in (degrees, -degrees)],
        # the batched shears are about the image's centre (timm's PIL ones: its top-left corner)
        "ShearX": [transform(1, s, -s * c, 0, 1, 0) for s in (shear, -shear)],
        "ShearY": [transform(1, 0, 0, s, 1, -s * c) for s in (shear, -shear)],
        "TranslateX": [transform(1, 0, t, 0, 1, 0) for t in (shift, -shift)],
        "TranslateY": [transform(1, 0, 0, 0, 1, t) for t in (shift, -shift)],
    }


def test_every_op_is_drawn_and_does_what_it_names():
    """One layer, always applied, magnitude 9 without noise: every image comes out as exactly
    one of the 15 ops would make it (PIL's result, to its rounding and edge pixels), and over
    600 images the policy draws every op about equally often."""
    n, size, fill = 600, 20, 128
    g = torch.Generator().manual_seed(0)
    lo = torch.randint(0, 10, (n, 1, 1, 1), generator=g)     # dark pixels: Solarize != Invert
    hi = torch.randint(150, 230, (n, 1, 1, 1), generator=g)  # no white: AutoContrast does something
    # skewed histograms: Equalize is not a linear stretch (Brightness, AutoContrast)
    x = (lo + torch.rand(n, 3, size, size, generator=g) ** 2 * (hi - lo)).floor()
    policy = RandAugmentPolicy(magnitude=9, magnitude_std=0, num_layers=1, prob=1.0)
    out = rand_augment(x, policy, torch.Generator().manual_seed(1), torch.full((1, 3, 1, 1), float(fill)))
    drawn = dict.fromkeys(OPS, 0)
    for i in range(n):
        img = Image.fromarray(x[i].permute(1, 2, 0).numpy().astype(np.uint8))
        ours = out[i].permute(1, 2, 0).numpy()
        error = {op: min(np.abs(np.asarray(r, dtype=np.float32) - ours).mean() for r in refs)
                 for op, refs in _pil_ops(img, fill).items()}
        best, second = sorted(error, key=error.get)[:2]
        assert error[best] < 3 and error[second] > 6, (i, best, error[best], second, error[second])
        drawn[best] += 1
    assert all(count > 15 for count in drawn.values()), drawn   # ~40 each
