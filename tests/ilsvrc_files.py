"""A tiny ImageNet-layout folder of real JPEG files, for the tests of the streamed path."""
from pathlib import Path

import numpy as np
from PIL import Image


def write_ilsvrc(root, classes: int = 4, per_class=(6, 2), size=(20, 16)) -> list[str]:
    """root/{train,val}/<wnid>/<wnid>_<j>.JPEG; class c is a noisy image dominated by colour
    channel c % 3 (learnable); returns the wnids."""
    rng = np.random.default_rng(0)
    wnids = [f"n{10_000_000 + i:08d}" for i in range(classes)]
    for split, n in zip(("train", "val"), per_class):
        for c, wnid in enumerate(wnids):
            folder = Path(root) / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for j in range(n):
                image = np.zeros((size[1], size[0], 3), np.uint8)
                image[..., c % 3] = 160 + 40 * (c // 3 % 3)
                image = np.clip(image + rng.integers(0, 60, image.shape), 0, 255).astype(np.uint8)
                Image.fromarray(image).save(folder / f"{wnid}_{j}.JPEG", quality=90)
    return wnids
