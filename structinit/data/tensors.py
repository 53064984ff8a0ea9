"""Dataset registry: every dataset becomes uint8 tensors (N, C, H, W) + int64 labels.

    digits    the 8x8 handwritten digits shipped inside scikit-learn (no network)
    cifar10   torchvision, checksum-verified download
    cifar100  torchvision, checksum-verified download
    svhn      torchvision, checksum-verified download ("train" split, as in the paper)
    fashion_mnist  its four files from datasets/fashion_mnist/, Debian's package or the official
              download, each checked by SHA-256 (fashion_mnist.py)

The trainer keeps these tensors on the training device and augments batches there.
"""
from __future__ import annotations

import http.client
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from structinit.data.specs import STREAMED, DatasetSpec, get_spec
from structinit.errors import DownloadError
from structinit.io import CorruptFileError, load_checked, save_checked


@dataclass
class ImageData:
    spec: DatasetSpec
    train_images: torch.Tensor   # (N, C, H, W) uint8
    train_labels: torch.Tensor   # (N,) int64
    test_images: torch.Tensor
    test_labels: torch.Tensor

    def save(self, path: str | Path) -> None:
        """Atomic save (write then rename) with a checksum: an interrupted run never leaves
        half a file, and a damaged one is detected on load."""
        save_checked(path, {"spec": asdict(self.spec), "train_images": self.train_images,
                            "train_labels": self.train_labels, "test_images": self.test_images,
                            "test_labels": self.test_labels})

    @classmethod
    def load(cls, path: str | Path) -> "ImageData":
        """A prepared dataset; CorruptFileError (naming the file) if it is damaged."""
        d = load_checked(path, "a prepared dataset: re-create it with dvc repro -f download@<dataset>")
        try:
            spec = d.pop("spec")
            spec = DatasetSpec(**{**spec, "mean": tuple(spec["mean"]), "std": tuple(spec["std"])})
            data = cls(spec=spec, **d)
        except (KeyError, TypeError, AttributeError) as e:
            raise CorruptFileError(f"{path} is not a prepared dataset ({e})") from None
        data.check(path)
        return data

    def check(self, source="dataset") -> None:
        """Shapes, dtypes and label range as the spec says; CorruptFileError otherwise."""
        s = self.spec
        for split in ("train", "test"):
            x, y = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
            want = (s.channels, s.image_size, s.image_size)
            if x.dtype != torch.uint8 or x.ndim != 4 or tuple(x.shape[1:]) != want:
                raise CorruptFileError(f"{source}: {split} images are {x.dtype} {tuple(x.shape)}, "
                                       f"expected uint8 (N, {', '.join(map(str, want))})")
            if y.dtype != torch.int64 or y.shape != (len(x),) or len(x) == 0:
                raise CorruptFileError(f"{source}: {split} labels are {y.dtype} {tuple(y.shape)}, "
                                       f"expected int64 ({len(x)},) for {len(x)} images")
            if y.min() < 0 or y.max() >= s.num_classes:
                raise CorruptFileError(f"{source}: {split} labels span {int(y.min())}..{int(y.max())}, "
                                       f"expected 0..{s.num_classes - 1}")


DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0




def prepare_dataset(name: str, root: str | Path = "data/raw", download: bool = True,
                    local: str | Path | None = None) -> ImageData:
    """Load (downloading into `root` if needed) and convert to uint8 tensors. `local`: the
    dataset's own folder (datasets/<name>), where Fashion-MNIST's files may be placed by hand."""
    spec = get_spec(name)
    if name in STREAMED:
        raise ValueError(f"{name} is read from a local directory and streamed, never held as tensors: "
                         "see structinit/data/imagenet.py")
    if name == "digits":
        return _digits(spec)
    if name == "fashion_mnist":
        from structinit.data.fashion_mnist import load_fashion_mnist

        return ImageData(spec, *load_fashion_mnist(root, local=local, download=download))
    import torchvision.datasets as tvd

    root = str(root)
    if name in ("cifar10", "cifar100"):
        cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
        splits = [{"train": True}, {"train": False}]
        files = [(cls.url, cls.filename, cls.tgz_md5)]   # one archive: torchvision extracts it
        to_tensor = lambda ds: (torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous(),  # noqa: E731
                                torch.tensor(ds.targets, dtype=torch.int64))
    else:  # svhn
        cls = tvd.SVHN
        splits = [{"split": "train"}, {"split": "test"}]
        files = [tvd.SVHN.split_list[s["split"]] for s in splits]   # [url, filename, md5] each
        to_tensor = lambda ds: (torch.from_numpy(ds.data).contiguous(),  # noqa: E731
                                torch.from_numpy(ds.labels.astype(np.int64)))
    try:
        train, test = (cls(root, download=download, **s) for s in splits)
    except (OSError, http.client.HTTPException, RuntimeError) as e:
        # Offline, torchvision ends in a chained urllib traceback that never says a file can be
        # placed by hand; a damaged download in "File not found or corrupted.". Either way the
        # cure is a file in root with torchvision's MD5: say which, one line (run_stage).
        missing = _not_in_place(root, files) if download else []
        if not missing:               # every file is there and intact: not a fetch problem
            raise
        raise _download_error(name, root, missing, e) from None
    return ImageData(spec, *to_tensor(train), *to_tensor(test))


def _not_in_place(root: str, files) -> list[tuple[str, str, str, str | None]]:
    """(url, filename, md5, md5 of the file there or None if absent) of each of `files` not in
    `root` with torchvision's MD5."""
    from torchvision.datasets.utils import calculate_md5

    out = []
    for url, filename, md5 in files:
        path = os.path.join(os.path.expanduser(root), filename)
        found = calculate_md5(path) if os.path.isfile(path) else None
        if found != md5:
            out.append((url, filename, md5, found))
    return out


def _download_error(name: str, root: str, missing, cause: BaseException) -> DownloadError:
    folder = os.path.abspath(os.path.expanduser(root))
    reason = " ".join(f"{type(cause).__name__}: {cause}".split())   # one line, whatever urllib says
    each = "; ".join(f"{filename} (md5 {md5}, from {url}"
                     + ("" if found is None else f"; the one there has md5 {found}: incomplete or another "
                        "file, replace it") + ")"
                     for url, filename, md5, found in missing)
    return DownloadError(f"{name}: could not download its files ({reason}); place by hand in {folder}/: "
                         f"{each}, then run again (docs/scaling-out.md)")


def _digits(spec: DatasetSpec) -> ImageData:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    images = torch.from_numpy(np.round(d.images * (255 / 16)).astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(d.target.astype(np.int64))
    tr, te = train_test_split(np.arange(len(labels)), test_size=DIGITS_TEST_FRACTION,
                              stratify=d.target, random_state=DIGITS_SPLIT_SEED)
    return ImageData(spec, images[tr], labels[tr], images[te], labels[te])


def stratified_subset(labels: torch.Tensor, size: float | int | None, seed: int) -> torch.Tensor:
    """Indices of a seeded, class-stratified subset of the training set.

    size: None or 1.0 = everything; a float in (0, 1) = that fraction; an int = that many
    images. Classes keep their proportions (largest-remainder rounding); the same (labels,
    size, seed) always gives the same subset, whatever the initializer.
    """
    n = len(labels)
    if size is None or size == 1.0:
        return torch.arange(n)
    if isinstance(size, bool) or not isinstance(size, (int, float)):
        raise ValueError(f"train_size={size!r}: give a fraction in (0, 1], a count, or null")
    count = round(size * n) if isinstance(size, float) else size
    if isinstance(size, float) and not 0 < size <= 1:
        raise ValueError(f"train_size={size}: a fraction must be in (0, 1]")
    classes = labels.unique()
    if not len(classes) <= count <= n:
        raise ValueError(f"train_size={size} gives {count} images; allowed: {len(classes)}..{n} "
                         f"(at least one per class, at most the {n} training images)")
    gen = torch.Generator().manual_seed(seed)
    per_class = [torch.nonzero(labels == c).flatten() for c in classes]
    sizes = torch.tensor([len(ix) for ix in per_class])
    exact = sizes * count / n
    take = exact.floor().long().clamp(min=1)              # every class keeps one image
    # Largest remainder up to `count`; when the one-per-class floor overshoots (rare
    # classes on imbalanced labels), take the excess back from the classes furthest above
    # their exact share, never below one image.
    for i in torch.argsort(exact - exact.floor(), descending=True)[: max(0, count - int(take.sum()))]:
        take[i] += 1
    while int(take.sum()) > count:
        over = torch.where(take > 1, take - exact, torch.full_like(exact, -float("inf")))
        take[int(torch.argmax(over))] -= 1
    chosen = [ix[torch.randperm(len(ix), generator=gen)[:t]] for ix, t in zip(per_class, take)]
    return torch.sort(torch.cat(chosen)).values


def validation_split(data: ImageData, size: float | int, seed: int = 0) -> ImageData:
    """The training set split in two: a stratified, seeded held-out part (`size`: a fraction or
    a count, as stratified_subset) as the "test" split, the rest to train on. What a recipe or
    budget is chosen on, so that the test set never is."""
    held = stratified_subset(data.train_labels, size, seed)
    keep = torch.ones(len(data.train_labels), dtype=torch.bool)
    keep[held] = False
    return ImageData(data.spec, data.train_images[keep], data.train_labels[keep],
                     data.train_images[held], data.train_labels[held])


def synthetic_data(spec: DatasetSpec, n_train: int, n_test: int, seed: int = 0) -> ImageData:
    """Random uint8 images of the dataset's shape and random labels, seeded: for timing the
    trainer (what a step costs does not depend on what the pixels show; RandAugment's ops are
    data-independent in cost): the GPU probe, the CPU's estimate of a GPU recipe."""
    g = torch.Generator().manual_seed(seed)
    shape = (spec.channels, spec.image_size, spec.image_size)
    return ImageData(spec=spec, train_images=torch.randint(0, 256, (n_train, *shape), dtype=torch.uint8, generator=g),
                     train_labels=torch.randint(0, spec.num_classes, (n_train,), generator=g),
                     test_images=torch.randint(0, 256, (n_test, *shape), dtype=torch.uint8, generator=g),
                     test_labels=torch.randint(0, spec.num_classes, (n_test,), generator=g))
