"""Fashion-MNIST (Zalando Research, MIT licence): 60,000 training and 10,000 test images,
28x28 grayscale, 10 classes of clothing. At patch size 2 a ViT sees a 14x14 grid of 196
tokens: the token grid of the paper's regime (ViT-T/2 on 32x32 has 16x16), on real images.

Its four IDX files come by the first of three routes that holds them:
  1. datasets/fashion_mnist/ (the dataset's folder, a DVC dependency of its download stage):
     the four files, gzipped or not, placed by hand (an offline machine gets them this way);
  2. Debian's package `dataset-fashion-mnist`, when installed (/usr/share/datasets/fashion-mnist/);
  3. the official download, by torchvision (it checks each .gz against the official MD5).
Every route is checked by the *decompressed* files' SHA-256: Debian rewrote the gzip headers,
so its .gz files have other MD5s but the same data. The checked files go into torchvision's
folder (<root>/FashionMNIST/raw/) and torchvision's FashionMNIST reads them, so the tensors are
the ones torchvision gives.
"""
from __future__ import annotations

import gzip
import hashlib
import http.client
import urllib.error
from pathlib import Path

import torch

from structinit.errors import DownloadError
from structinit.io import write_atomic

# Decompressed file -> (SHA-256, bytes): the official files, as Debian's package holds them.
FILES = {
    "train-images-idx3-ubyte": ("c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888", 47_040_016),
    "train-labels-idx1-ubyte": ("bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9", 60_008),
    "t10k-images-idx3-ubyte": ("5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b", 7_840_016),
    "t10k-labels-idx1-ubyte": ("0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34", 10_008),
}
DEBIAN_FOLDER = Path("/usr/share/datasets/fashion-mnist")
LOCAL_FOLDER = Path("datasets/fashion_mnist")


def routes_text(local: Path = LOCAL_FOLDER, system: Path = DEBIAN_FOLDER) -> str:
    return (f"(1) put the four files, gzipped or not, in {local}/; (2) install Debian's package "
            f"dataset-fashion-mnist (apt-get install dataset-fashion-mnist: {system}/); or (3) let "
            "torchvision download them (needs the internet)")


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()


def place_files(root: str | Path, local: str | Path | None = None, system: str | Path | None = None,
                download: bool = True, expected: dict[str, str] | None = None) -> dict[str, str]:
    """Put the four decompressed, SHA-256-checked files into torchvision's folder
    <root>/FashionMNIST/raw/, from the first route that holds each; returns {file: where from}.
    A file found with other bytes is skipped with a note, never used. `expected` ({file: sha256})
    replaces the official digests (the tests' tiny files); local and system default to
    LOCAL_FOLDER and DEBIAN_FOLDER."""
    expected = expected or {name: digest for name, (digest, _) in FILES.items()}
    local, system = Path(LOCAL_FOLDER if local is None else local), Path(DEBIAN_FOLDER if system is None else system)
    raw = Path(root) / "FashionMNIST" / "raw"
    found, wrong = {}, []

    def good(path: Path) -> bool:
        return path.is_file() and sha256_of(path.read_bytes()) == expected[path.name]

    for name in expected:
        target = raw / name
        if good(target):
            found[name] = str(target)
            continue
        if target.exists():               # damaged or another file: torchvision would read it
            target.unlink()
        for folder in (local, system):
            for src in (folder / name, folder / f"{name}.gz"):
                if not src.is_file():
                    continue
                try:
                    data = _read(src)
                except (OSError, EOFError, gzip.BadGzipFile) as e:
                    wrong.append(f"{src} (unreadable: {e})")
                    continue
                if sha256_of(data) != expected[name]:
                    wrong.append(f"{src} (sha256 {sha256_of(data)[:16]}..., expected {expected[name][:16]}...)")
                    continue
                write_atomic(target, lambda tmp, data=data: tmp.write_bytes(data))
                found[name] = str(src)
                break
            if name in found:
                break
    missing = [name for name in expected if name not in found]
    cause = None if download else "switched off (download=False)"
    if missing and download:
        import torchvision.datasets as tvd

        try:    # torchvision fetches all four .gz (official MD5s) and decompresses them into raw/
            tvd.FashionMNIST(str(root), train=True, download=True)
        except (OSError, RuntimeError, urllib.error.URLError, http.client.HTTPException) as e:
            cause = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        for name in list(missing):
            target = raw / name
            if good(target):
                found[name] = "the official download"
                missing.remove(name)
            elif target.exists():
                wrong.append(f"{target} from the download (sha256 {sha256_of(target.read_bytes())[:16]}...)")
                target.unlink()
    if missing:
        raise DownloadError(
            f"fashion_mnist: no file with Fashion-MNIST's SHA-256 for {', '.join(missing)}"
            + (f"; wrong: {'; '.join(wrong)}" if wrong else "")
            + (f"; the download: {cause}" if cause else "")
            + f". Get them one of three ways: {routes_text(local, system)}; then run again")
    return found


def load_fashion_mnist(root: str | Path = "data/raw", local: str | Path | None = None,
                       system: str | Path | None = None, download: bool = True,
                       expected: dict[str, str] | None = None):
    """(train images, train labels, test images, test labels) of the 60,000 + 10,000 images
    (uint8 (N, 1, 28, 28), int64 (N,)), read by torchvision's FashionMNIST from the checked
    files (place_files)."""
    import torchvision.datasets as tvd

    found = place_files(root, local, system, download, expected)
    print("fashion_mnist: " + ", ".join(f"{name} from {src}" for name, src in found.items()))
    train, test = (tvd.FashionMNIST(str(root), train=split, download=False) for split in (True, False))
    return (train.data.unsqueeze(1).contiguous(), train.targets.to(torch.int64),
            test.data.unsqueeze(1).contiguous(), test.targets.to(torch.int64))


def idx_bytes(array) -> bytes:
    """`array` (uint8, 1-D labels or 3-D images) in the IDX format of the official files: a
    magic number (0, 0, type 0x08 = unsigned byte, number of dimensions), each dimension as a
    big-endian int32, then the bytes. For small test files in the real format."""
    import numpy as np

    a = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, a.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    return header + a.tobytes()

