"""What each dataset is (size, channels, classes, normalization), importable without torch:
params.yaml's schema checks kernels and patch sizes against it before any stage imports torch.
Loading and preparing the data is tensors.py's job."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    image_size: int
    channels: int
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2471, 0.2435, 0.2616)
DATASETS = {
    # digits: mean/std of all 1,797 images scaled to [0, 1].
    "digits": DatasetSpec("digits", 8, 1, 10, (0.3053,), (0.3760,)),
    "cifar10": DatasetSpec("cifar10", 32, 3, 10, CIFAR_MEAN, CIFAR_STD),
    "cifar100": DatasetSpec("cifar100", 32, 3, 100, CIFAR_MEAN, CIFAR_STD),
    # fashion_mnist: mean/std of the 60,000 training images scaled to [0, 1] (fashion_mnist.py).
    "fashion_mnist": DatasetSpec("fashion_mnist", 28, 1, 10, (0.2860,), (0.3530,)),
    "svhn": DatasetSpec("svhn", 32, 3, 10, (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970)),
    # imagenet: the official run's model (timm's vit_tiny_patch16_224) takes its data config from
    # timm's ViT defaults: mean = std = 0.5, evaluated at crop 0.9, bicubic (imagenet.py)
    "imagenet": DatasetSpec("imagenet", 224, 3, 1000, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
}
# Datasets too large for the training device as one tensor: read from a local directory and
# streamed by DataLoader workers (imagenet.py, training/streamed.py) instead of tensors.py's one tensor.
STREAMED = ("imagenet",)
# Training images per dataset (digits: the fixed 80 % split of tensors.py; the others: their
# train splits). Not part of DatasetSpec, which prepared files store: params.yaml's schema
# needs the counts (a study's subset must hold a batch) before any data is loaded.
TRAIN_IMAGES = {"digits": 1437, "cifar10": 50_000, "cifar100": 50_000, "svhn": 73_257,
                "fashion_mnist": 60_000,
                "imagenet": 1_281_167}
# Test images per dataset (digits: the other 20 %; ImageNet: its validation set): what an
# accuracy difference is counted in (./run.sh verify).
TEST_IMAGES = {"digits": 360, "cifar10": 10_000, "cifar100": 10_000, "svhn": 26_032,
               "fashion_mnist": 10_000, "imagenet": 50_000}


def get_spec(name: str) -> DatasetSpec:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {tuple(DATASETS)}")
    return DATASETS[name]
