import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from structinit.augment import OPS, RandAugmentPolicy, _equalize, _autocontrast, rand_augment, random_hflip


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
    eq, ac = _equalize(x), _autocontrast(x)
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


def test_all_ops_present():
    assert len(OPS) == 15
