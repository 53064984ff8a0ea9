"""Your own dataset: a folder of files -> the uint8 tensors every dataset becomes (tensors.py).

datasets/<name>/ holds one of two layouts (docs/pipeline.md, "Your own dataset"):

    <file>.npz              x: uint8 (N, H, W) or (N, H, W, C), C = 1 or 3, channels last;
                            y: integer labels 0..K-1, shape (N,); optionally x_test, y_test alike
    train/<class>/<image>   images Pillow reads (PNG, JPEG, ...), square and all one size; the
    test/<class>/<image>    labels are the class folders' names in sorted order; test/ optional

Every class 0..K-1 has training images. Without a test split, a seeded 20 % of each class is
held out (digits' rule: the same images every time). Normalization is each channel's mean and
std over the training images, in [0, 1]. The tensors depend on the files alone, never on
params.yaml, so the folder and this code are all the prepare stage (download@<name>) depends on.

    scan(folder)             shapes, channels, classes and counts, from headers and labels only
                             (check_params runs it on every params edit, before anything else)
    load_own(name, folder)   every image, as an ImageData (tensors.py), checked
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

from structinit.errors import StructinitError

ROOT = "datasets"                 # datasets/<name>/: where the pipeline reads your dataset
TEST_FRACTION = 0.2               # held out per class when the files have no test split
SPLIT_SEED = 0
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")
GRAY_MODES = ("1", "L", "LA")     # Pillow modes read as one channel; other 8-bit modes as RGB
COLOR_MODES = ("RGB", "RGBA", "RGBX", "P", "PA", "CMYK", "YCbCr", "LAB", "HSV")


class OwnDatasetError(StructinitError, ValueError):
    """A dataset folder is not one of the layouts above; the message names the file and the fix."""


@dataclass(frozen=True)
class Facts:
    layout: str                   # "npz" or "folders"
    image_size: int
    channels: int
    num_classes: int
    train_images: int
    test_images: int


def source_dir(name: str, root: str | Path = ".") -> Path:
    return Path(root) / ROOT / name


def layout(folder: str | Path) -> tuple[str, Path]:
    """("npz", the file) or ("folders", folder); OwnDatasetError if neither or both."""
    folder = Path(folder)
    if not folder.is_dir():
        raise OwnDatasetError(f"{folder}: no such folder; put your dataset there (a .npz of x/y arrays, "
                              "or train/<class>/ image folders)")
    npz = sorted(folder.glob("*.npz"))
    has_folders = (folder / "train").is_dir()
    if len(npz) > 1 or (npz and has_folders):
        found = [p.name for p in npz] + (["train/"] if has_folders else [])
        raise OwnDatasetError(f"{folder}: holds {found}; keep one dataset there: one .npz, or train/ (and test/)")
    if npz:
        return "npz", npz[0]
    if has_folders:
        return "folders", folder
    raise OwnDatasetError(f"{folder}: no .npz file and no train/ folder; expected <file>.npz (arrays x, y, "
                          "optionally x_test, y_test) or train/<class>/<image> (and test/<class>/<image>)")


def scan(folder: str | Path) -> Facts:
    kind, _, image_size, channels, y, y_test, _ = _headers(folder)
    num_classes = _check_labels(y, y_test, folder)
    n_test = len(y_test) if y_test is not None else int(_held_out(y).sum())
    return Facts(kind, image_size, channels, num_classes, len(y) - (0 if y_test is not None else n_test), n_test)


def load_own(name: str, folder: str | Path):
    """Your dataset as an ImageData named `name` (what download@<name> saves)."""
    import numpy as np
    import torch

    from structinit.data.specs import DatasetSpec
    from structinit.data.tensors import ImageData

    kind, path, image_size, channels, y, y_test, files = _headers(folder)
    num_classes = _check_labels(y, y_test, folder)            # before reading a pixel
    if kind == "npz":
        with np.load(path, allow_pickle=False) as f:
            x, x_test = f["x"], (f["x_test"] if "x_test" in f else None)
    else:
        x = _read_images(files["train"], image_size, channels)
        x_test = _read_images(files["test"], image_size, channels) if files["test"] else None
    x = x.reshape(len(x), image_size, image_size, channels)
    if x_test is None:
        test = _held_out(y)
        x, x_test, y, y_test = x[~test], x[test], y[~test], y[test]
    x_test = x_test.reshape(len(x_test), image_size, image_size, channels)
    mean, std = _mean_std(x)
    spec = DatasetSpec(name, image_size, channels, num_classes, mean, std)
    as_nchw = lambda a: torch.from_numpy(np.ascontiguousarray(a.transpose(0, 3, 1, 2)))  # noqa: E731
    data = ImageData(spec, as_nchw(x), torch.from_numpy(y.astype(np.int64)),
                     as_nchw(x_test), torch.from_numpy(y_test.astype(np.int64)))
    data.check(folder)
    return data


def _headers(folder):
    """(layout, its path, image size, channels, y, y_test or None, image files or None): all
    but the pixels, which scan() never reads."""
    kind, path = layout(folder)
    if kind == "npz":
        shapes, labels = _npz_headers(path)
        return (kind, path, *_npz_images(path, shapes), labels["y"], labels.get("y_test"), None)
    files = _image_files(path)
    return (kind, path, *_images_headers(files), *_folder_labels(files), files)


def _mean_std(x) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Each channel's mean and std over (N, H, W, C) uint8 images scaled to [0, 1], to 4
    digits as the built-in specs; summed in blocks, so a large dataset needs no float copy."""
    import numpy as np

    c = x.shape[-1]
    s1, s2 = np.zeros(c), np.zeros(c)
    for i in range(0, len(x), 4096):
        b = x[i:i + 4096].reshape(-1, c).astype(np.float64)
        s1 += b.sum(0)
        s2 += (b * b).sum(0)
    n = x.size // c
    mean = s1 / n / 255
    std = np.sqrt(np.maximum(s2 / n / 255 ** 2 - mean ** 2, 0))
    return tuple(round(float(m), 4) for m in mean), tuple(round(float(s), 4) for s in std)


def _held_out(y):
    """The test images' mask when the files have none: TEST_FRACTION of each class, seeded."""
    import numpy as np

    rng = np.random.default_rng(SPLIT_SEED)
    test = np.zeros(len(y), dtype=bool)
    for c in np.unique(y):
        ix = np.flatnonzero(y == c)
        test[rng.permutation(ix)[:round(TEST_FRACTION * len(ix))]] = True
    return test


def _check_labels(y, y_test, folder) -> int:
    """K, when the training labels are exactly 0..K-1 (K >= 2) and the test labels within."""
    import numpy as np

    present = np.unique(y)
    if len(present) < 2 or present[0] != 0 or len(present) != present[-1] + 1:
        missing = sorted(set(range(int(present[-1]) + 1)) - set(present.tolist())) if len(present) else []
        raise OwnDatasetError(f"{folder}: training labels are {present.tolist()[:12]}"
                              f"{'...' if len(present) > 12 else ''}; expected every class 0..K-1 (K >= 2)"
                              + (f", missing {missing[:12]}" if missing else ""))
    k = len(present)
    if y_test is not None and len(y_test) and (y_test.min() < 0 or y_test.max() >= k):
        raise OwnDatasetError(f"{folder}: test labels span {int(y_test.min())}..{int(y_test.max())}; "
                              f"the training labels are 0..{k - 1}")
    if y_test is not None and not len(y_test):
        raise OwnDatasetError(f"{folder}: the test split is empty; give test images or none (then 20 % "
                              "of each class is held out)")
    if y_test is None and not _held_out(y).any():
        raise OwnDatasetError(f"{folder}: too few images to hold out a test split (20 % of each class); "
                              "give a test split")
    return k


# ---- .npz ----------------------------------------------------------------------------------

def _npz_headers(path: Path) -> tuple[dict, dict]:
    """({array: (shape, dtype)} from the headers alone, {"y": ..., "y_test": ...} loaded)."""
    import numpy as np

    shapes = {}
    try:
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                if member.endswith(".npy"):
                    with z.open(member) as f:
                        shapes[member[:-4]] = _npy_header(f)
        with np.load(path, allow_pickle=False) as f:
            labels = {k: f[k] for k in ("y", "y_test") if k in shapes}
    except (zipfile.BadZipFile, ValueError, OSError) as e:
        raise OwnDatasetError(f"{path}: not a readable .npz of arrays ({e}); write it with "
                              "numpy.savez(path, x=..., y=...)") from None
    allowed = {"x", "y", "x_test", "y_test"}
    if not {"x", "y"} <= set(shapes) or set(shapes) - allowed or ("x_test" in shapes) != ("y_test" in shapes):
        raise OwnDatasetError(f"{path}: holds arrays {sorted(shapes)}; expected x and y, and optionally "
                              "x_test with y_test (both or neither)")
    for split in ("", "_test"):
        if f"y{split}" not in labels:
            continue
        y, (xshape, _) = labels[f"y{split}"], shapes[f"x{split}"]
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or len(y) != xshape[0]:
            raise OwnDatasetError(f"{path}: y{split} is {y.dtype} {y.shape}; expected integer labels of shape "
                                  f"({xshape[0]},), one per image of x{split}")
    return shapes, labels


def _npy_header(f) -> tuple[tuple, object]:
    """(shape, dtype) of an .npy stream, reading its header and never its data."""
    from numpy.lib import format as npy

    version = npy.read_magic(f)
    readers = {(1, 0): npy.read_array_header_1_0, (2, 0): npy.read_array_header_2_0}
    if version not in readers:               # a newer header format: read the array itself
        f.seek(0)
        a = npy.read_array(f, allow_pickle=False)
        return a.shape, a.dtype
    shape, _, dtype = readers[version](f)
    return shape, dtype


def _npz_images(path: Path, shapes: dict) -> tuple[int, int]:
    """(image size, channels) of x (and x_test, which must agree)."""
    import numpy as np

    facts = set()
    for key in ("x", "x_test"):
        if key not in shapes:
            continue
        shape, dtype = shapes[key]
        ok = len(shape) in (3, 4) and shape[1] == shape[2] and (len(shape) == 3 or shape[3] in (1, 3))
        if dtype != np.uint8 or not ok:
            raise OwnDatasetError(f"{path}: {key} is {dtype} {shape}; expected uint8 (N, H, W) or (N, H, W, C) "
                                  "with H = W (square images) and C = 1 or 3, values 0..255")
        facts.add((shape[1], 1 if len(shape) == 3 else shape[3]))
    if len(facts) > 1:
        raise OwnDatasetError(f"{path}: x and x_test differ in size or channels ({sorted(facts)})")
    return facts.pop()


# ---- image folders -------------------------------------------------------------------------

def _image_files(folder: Path) -> dict:
    """{"train": [(class index, file)], "test": [...]}, in sorted order; classes from train/."""
    def listed(split):
        root = folder / split
        if not root.is_dir():
            return {}
        return {d.name: sorted(f for f in d.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES
                               and not f.name.startswith("."))
                for d in sorted(root.iterdir()) if d.is_dir() and not d.name.startswith(".")}

    train, test = listed("train"), listed("test")
    classes = sorted(train)
    empty = [f"{split}/{c}" for split, per in (("train", train), ("test", test)) for c, fs in per.items() if not fs]
    if len(classes) < 2 or empty:
        raise OwnDatasetError(f"{folder}/train: " + (f"no images in {empty}" if empty else
                              f"{len(classes)} class folder(s); expected one folder per class, at least 2")
                              + f" (images: {', '.join(IMAGE_SUFFIXES)})")
    unknown = sorted(set(test) - set(train))
    if unknown:
        raise OwnDatasetError(f"{folder}/test: class folders {unknown} are not in train/ {classes}")
    index = {c: i for i, c in enumerate(classes)}
    return {split: [(index[c], f) for c in sorted(per) for f in per[c]]
            for split, per in (("train", train), ("test", test))}


def _images_headers(files: dict) -> tuple[int, int]:
    """(image size, channels): every image square and of one size; one channel when every
    image is grayscale, else three (a grayscale image among color ones is repeated)."""
    from PIL import Image, UnidentifiedImageError

    size, gray, first = None, True, None
    for _, path in files["train"] + files["test"]:
        try:
            with Image.open(path) as im:      # reads the header only
                w, h, mode = im.width, im.height, im.mode
        except (UnidentifiedImageError, OSError) as e:
            raise OwnDatasetError(f"{path}: not an image Pillow reads ({e})") from None
        if mode not in GRAY_MODES + COLOR_MODES:
            raise OwnDatasetError(f"{path}: mode {mode!r} is not 8-bit; save it as 8-bit grayscale or RGB")
        if w != h or (size is not None and w != size):
            raise OwnDatasetError(f"{path}: {w}x{h}; every image must be square and of one size "
                                  f"({size}x{size} like {first}): resize them beforehand")
        size, first = w, first or path
        gray = gray and mode in GRAY_MODES
    return size, 1 if gray else 3


def _folder_labels(files: dict):
    import numpy as np

    y = np.array([c for c, _ in files["train"]], dtype=np.int64)
    y_test = np.array([c for c, _ in files["test"]], dtype=np.int64) if files["test"] else None
    return y, y_test


def _read_images(files: list, size: int, channels: int):
    import numpy as np
    from PIL import Image

    mode = "L" if channels == 1 else "RGB"
    out = np.empty((len(files), size, size, channels), dtype=np.uint8)
    for i, (_, path) in enumerate(files):
        with Image.open(path) as im:
            out[i] = np.asarray(im.convert(mode)).reshape(size, size, channels)
    return out
