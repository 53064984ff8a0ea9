"""ImageNet-1K from a local directory in the usual ILSVRC layout, streamed (no download).

    <root>/train/<wnid>/*.JPEG      1,281,167 images in 1,000 class folders (n01440764, ...)
    <root>/val/<wnid>/*.JPEG        50,000 images, sorted into the same class folders

    manifest = scan_imagenet(root)                     # the download stage's output: what is there
    train, val = imagenet_datasets(root, manifest, cfg, seed)
    loader = train_loader(train, cfg.batch_size, ctx, epoch, seed, workers)

It does not fit on a device as one tensor, so images are decoded and augmented by DataLoader
workers with timm's transforms (the official run is timm's train.py): RandomResizedCrop,
flip, RandAugment, random erasing; eval resizes to 224 / 0.9 and centre-crops (timm's ViT data
config). Mixup/CutMix act on the batch (training/streamed.py).

Every image's augmentation is seeded by (seed, epoch, index), never by which worker or process
decodes it, so a run on 8 processes sees the very images a run on 1 process does (Mixup and
CutMix then mix within each process's share of the batch: training/streamed.py).
"""
from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from structinit.data.specs import get_spec
from structinit.distributed import DistributedContext
from structinit.errors import StructinitError

SPLITS = ("train", "val")
WNID = re.compile(r"n\d{8}")                     # ImageNet class folders: WordNet ids
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")       # ILSVRC is .JPEG; matched case-insensitively
MANIFEST_FORMAT = 1
ILSVRC_2012_IMAGES = {"train": 1_281_167, "val": 50_000}     # ImageNet-1K, as the paper trained on it
EVAL_CROP_PCT = 0.9                              # timm's ViT data config (vit_tiny_patch16_224)
EVAL_INTERPOLATION = "bicubic"


class ImageNetLayoutError(StructinitError):
    """The ImageNet directory is missing or incomplete; the message says what was expected."""


def scan_imagenet(root: str | Path | None, num_classes: int = 1000, expected_images: dict | None = None,
                  require_full: bool = True) -> dict:
    """Check `root` holds ILSVRC's layout and list it: {"classes": [wnid, ...], "train": [(path
    relative to root, label, bytes), ...], "val": [...]}. Sizes, not contents, identify the
    images: hashing ~150 GB on every run would cost more than the check is worth.

    expected_images: {split: count} the copy must hold (default: ILSVRC-2012's for 1,000
    classes); another count is an error (a half-extracted tar), or, with require_full=False
    (local_datasets.imagenet_require_full), a warning (a deliberate subset, a test folder)."""
    if root is None:
        raise ImageNetLayoutError(
            "no ImageNet directory: set local_datasets.imagenet in params.yaml to a folder with "
            "train/<wnid>/*.JPEG and val/<wnid>/*.JPEG (ILSVRC layout; nothing is downloaded)")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise ImageNetLayoutError(f"ImageNet directory {root} does not exist; expected a folder with "
                                  "train/<wnid>/*.JPEG and val/<wnid>/*.JPEG")
    missing = [s for s in SPLITS if not (root / s).is_dir()]
    if missing:
        raise ImageNetLayoutError(f"{root} has no {' or '.join(s + '/' for s in missing)} folder; expected "
                                  "train/<wnid>/*.JPEG and val/<wnid>/*.JPEG")
    manifest = {"format": MANIFEST_FORMAT, "classes": None}
    for split in SPLITS:
        folder = root / split
        classes = sorted(d.name for d in os.scandir(folder) if d.is_dir() and WNID.fullmatch(d.name))
        loose = sum(1 for d in os.scandir(folder) if d.is_file() and d.name.lower().endswith(IMAGE_SUFFIXES))
        if loose and not classes:
            raise ImageNetLayoutError(
                f"{folder} holds {loose} images but no class folders: sort them into {split}/<wnid>/ "
                "(for val, e.g. with the ILSVRC devkit's ground truth; any valprep script does it)")
        if len(classes) != num_classes:
            raise ImageNetLayoutError(f"{folder} has {len(classes)} class folders named like n01440764; "
                                      f"ImageNet-1K has {num_classes}")
        if manifest["classes"] is None:
            manifest["classes"] = classes
        elif classes != manifest["classes"]:
            odd = sorted(set(classes) ^ set(manifest["classes"]))[:5]
            raise ImageNetLayoutError(f"{folder}'s class folders differ from train/'s (e.g. {odd}); "
                                      "both splits must have the same 1,000 wnids")
        samples, empty = [], []
        for label, wnid in enumerate(classes):
            files = sorted((e.name, e.stat().st_size) for e in os.scandir(folder / wnid)
                           if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES))
            if not files:
                empty.append(wnid)
            samples += [(f"{split}/{wnid}/{name}", label, size) for name, size in files]
        if empty:
            raise ImageNetLayoutError(f"{len(empty)} class folders of {folder} hold no images "
                                      f"(e.g. {empty[:5]}); the copy looks incomplete")
        manifest[split] = samples
    expected = expected_images or (ILSVRC_2012_IMAGES if num_classes == 1000 else None)
    if expected and any(len(manifest[s]) != n for s, n in expected.items()):
        found = (f"{root} holds {len(manifest['train']):,} train / {len(manifest['val']):,} val images; "
                 f"expected {expected['train']:,} / {expected['val']:,} (ILSVRC-2012)")
        if require_full:
            raise ImageNetLayoutError(
                f"{found}: the copy looks incomplete (e.g. a half-extracted archive). Complete it, or set "
                "local_datasets.imagenet_require_full: false to train on what it holds (not ImageNet-1K)")
        print(f"warning: {found}; local_datasets.imagenet_require_full is false, so training goes on, "
              "but the results are not ImageNet-1K's")
    return manifest


def check_root_matches(root: str | Path | None, manifest: dict) -> Path:
    """Cheap check before training: the directory the manifest was made from is still there
    (every class folder and one file of each). The download stage re-scans it in full."""
    if root is None:
        raise ImageNetLayoutError("no ImageNet directory: set local_datasets.imagenet in params.yaml")
    root = Path(root).expanduser()
    firsts = {}
    for path, label, _ in manifest["train"] + manifest["val"]:
        firsts.setdefault((path.split("/")[0], label), path)
    missing = [p for p in firsts.values() if not (root / p).is_file()]
    if missing:
        raise ImageNetLayoutError(f"{root} does not hold the images the prepared manifest lists "
                                  f"(e.g. {missing[:3]} are missing): point local_datasets.imagenet at "
                                  "the same copy, or re-run dvc repro download@imagenet")
    return root


class ManifestImages(Dataset):
    """A split's images as (PIL image, label), straight from the manifest: no re-scan of
    1.28 M files per training run. Decoding is torchvision's (PIL, RGB)."""

    def __init__(self, root: Path, samples: list):
        from torchvision.datasets.folder import default_loader

        self.root, self.samples, self.loader = Path(root), samples, default_loader
        self.targets = [label for _, label, _ in samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label, _ = self.samples[i]
        return self.loader(str(self.root / path)), label


class SeededAugmentation(Dataset):
    """images[i] through `transform`, with Python's, NumPy's and torch's RNGs seeded by
    (seed, epoch, i) first: timm's transforms draw from those global RNGs, and seeding per
    image makes the result independent of the worker and the process that decodes it.
    Workers copy this object at the start of each epoch (no persistent workers), so setting
    `epoch` before iterating reaches them."""

    def __init__(self, images: Dataset, transform, seed: int):
        self.images, self.transform, self.seed, self.epoch = images, transform, seed, 0

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        image, label = self.images[i]
        s = ((self.seed * 1_000_003 + self.epoch) * 10_000_019 + i) % (2 ** 63)
        random.seed(s)
        np.random.seed(s % (2 ** 32))
        torch.manual_seed(s)
        return self.transform(image), label


def _posterize_to_zero_bits():
    """timm's RandAugment asks PIL to posterize to 0 bits when the magnitude draw reaches 10
    (m9, mstd 0.5: about 2 % of its Posterize ops). Pillow before 13 returned a black image;
    Pillow 13 raises. Keep the old result (what the official run got), only where Pillow raises."""
    from PIL import Image, ImageOps
    from timm.data import auto_augment

    try:
        ImageOps.posterize(Image.new("RGB", (1, 1)), 0)
        return
    except ValueError:
        pass
    timm_posterize = auto_augment.posterize

    def posterize(img, bits_to_keep, **kw):
        return Image.new(img.mode, img.size) if bits_to_keep <= 0 else timm_posterize(img, bits_to_keep, **kw)

    for name, op in list(auto_augment.NAME_TO_OP.items()):
        if op is timm_posterize:
            auto_augment.NAME_TO_OP[name] = posterize


def imagenet_transforms(cfg, image_size: int = 224):
    """(train, eval) transforms of the official command (timm train.py's defaults plus its
    flags): RandomResizedCrop (0.08-1, random bilinear/bicubic), flip, RandAugment,
    random erasing in pixel mode; eval at crop 0.9, bicubic. cfg None: (None, eval)."""
    from timm.data import create_transform

    spec = get_spec("imagenet")
    _posterize_to_zero_bits()
    train = None if cfg is None else create_transform(
        image_size, is_training=True, auto_augment=cfg.randaugment, interpolation="random",
        hflip=0.5 if cfg.hflip else 0.0, re_prob=cfg.random_erasing, re_mode="pixel", re_count=1,
        mean=spec.mean, std=spec.std)
    test = create_transform(image_size, is_training=False, interpolation=EVAL_INTERPOLATION,
                            crop_pct=EVAL_CROP_PCT, mean=spec.mean, std=spec.std)
    return train, test


def imagenet_datasets(root: Path, manifest: dict, cfg, seed: int, train_indices=None):
    """(train, test) datasets: train seeded per image (SeededAugmentation), test plain."""
    train_tf, test_tf = imagenet_transforms(cfg)
    train = ManifestImages(root, manifest["train"])
    if train_indices is not None:
        train = Subset(train, [int(i) for i in train_indices])
    test = ManifestImages(root, manifest["val"])
    return SeededAugmentation(train, train_tf, seed), _Transformed(test, test_tf)


class _Transformed(Dataset):
    def __init__(self, images: Dataset, transform):
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        image, label = self.images[i]
        return self.transform(image), label


def train_loader(train: SeededAugmentation, global_batch: int, ctx: DistributedContext, epoch: int,
                 seed: int, workers: int) -> DataLoader:
    """This process's share of each global batch of `epoch`. DistributedSampler deals a
    seeded permutation out round-robin, so step i's batches of all processes together are
    exactly the permutation's i-th global batch, on any process count (the ragged tail is
    dropped, as in the on-device trainer)."""
    if global_batch % ctx.world_size:
        raise ValueError(f"batch_size={global_batch} is not divisible by the {ctx.world_size} processes; "
                         "the global batch must split evenly")
    train.epoch = epoch
    # the sampler shuffles with seed + epoch: spread the seeds so that no two (seed, epoch)
    # pairs share an order
    sampler = DistributedSampler(train, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True,
                                 seed=seed * 1_000_003, drop_last=True)
    sampler.set_epoch(epoch)
    return DataLoader(train, batch_size=global_batch // ctx.world_size, sampler=sampler,
                      num_workers=workers, pin_memory=torch.cuda.is_available(), drop_last=True)


def test_loader(test: Dataset, ctx: DistributedContext, batch_size: int, workers: int) -> DataLoader:
    """Every test image exactly once over all processes (rank r takes r, r + W, ...; no padding)."""
    shard = Subset(test, range(ctx.rank, len(test), ctx.world_size))
    return DataLoader(shard, batch_size=batch_size, shuffle=False, num_workers=workers,
                      pin_memory=torch.cuda.is_available())


def evaluation_images(root: Path, manifest: dict, count: int | None) -> torch.Tensor:
    """`count` validation images (all when None), evenly spaced so that every class shows up
    (the list is sorted by class), through the eval transform: (count, 3, 224, 224)."""
    _, test_tf = imagenet_transforms(None)
    val = _Transformed(ManifestImages(root, manifest["val"]), test_tf)
    n = len(val) if count is None else min(count, len(val))
    return torch.stack([val[i * len(val) // n][0] for i in range(n)])


def manifest_labels(manifest: dict, split: str = "train") -> torch.Tensor:
    return torch.tensor([label for _, label, _ in manifest[split]], dtype=torch.int64)
