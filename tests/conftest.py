import pytest
import torch

import structinit as si


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)


@pytest.fixture(scope="session")
def digits():
    return si.prepare_dataset("digits")


def small_vit(**kw):
    """The embedded default's shape: 8x8 digits, 1-pixel patches (8x8 grid), 3 heads."""
    cfg = dict(img_size=8, patch_size=1, embed_dim=48, depth=3, num_heads=3, num_classes=10,
               in_chans=1)
    cfg.update(kw)
    return si.create_vit(**cfg)
