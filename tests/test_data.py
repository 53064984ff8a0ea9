import hashlib
import pickle

import numpy as np
import pytest
import scipy.io
import torch
import torchvision.datasets as tvd

import structinit as si
from structinit.data.tensors import ImageData, stratified_subset


def test_digits_split_is_fixed_stratified_and_real(digits):
    assert digits.train_images.shape == (1437, 1, 8, 8) and digits.test_images.shape == (360, 1, 8, 8)
    assert digits.train_images.dtype == torch.uint8 and digits.train_images.max() == 255
    counts = torch.bincount(digits.test_labels, minlength=10)
    assert counts.min() >= 35 and counts.max() <= 37
    again = si.prepare_dataset("digits")
    assert torch.equal(again.test_images, digits.test_images)


def test_prepared_data_round_trip(tmp_path, digits):
    digits.save(tmp_path / "d.pt")
    back = ImageData.load(tmp_path / "d.pt")
    assert back.spec == digits.spec and torch.equal(back.train_labels, digits.train_labels)


@pytest.mark.parametrize("count", [10, 12, 15, 40])
def test_stratified_subset_gives_exactly_the_count_on_imbalanced_labels(count):
    """One big class and nine rare ones: the one-per-class floor overshoots the exact shares
    (it used to return more images than asked)."""
    labels = torch.cat([torch.zeros(200, dtype=torch.long), torch.arange(1, 10).repeat_interleave(2)])
    idx = stratified_subset(labels, count, seed=0)
    assert len(idx) == count == len(set(idx.tolist()))
    assert set(labels[idx].tolist()) == set(range(10))              # every class kept


def test_stratified_subset():
    labels = torch.arange(10).repeat_interleave(torch.tensor([50, 50, 50, 50, 50, 10, 10, 10, 10, 10]))
    idx = stratified_subset(labels, 0.2, seed=0)
    assert len(idx) == 60
    assert torch.equal(torch.bincount(labels[idx]), torch.tensor([10] * 5 + [2] * 5))
    assert torch.equal(idx, stratified_subset(labels, 60, seed=0))      # count == fraction
    assert not torch.equal(idx, stratified_subset(labels, 60, seed=1))
    assert len(stratified_subset(labels, 33, seed=0)) == 33
    assert torch.equal(stratified_subset(labels, None, 0), torch.arange(300))
    for bad in (0.0, 1.5, 5, 301, "half"):
        with pytest.raises(ValueError, match="train_size"):
            stratified_subset(labels, bad, seed=0)


def test_unknown_dataset():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; choose one of"):
        si.prepare_dataset("mnist")


# --- torchvision's own on-disk formats, written small; no network ---------------------

def _md5(path):
    return hashlib.md5(path.read_bytes()).hexdigest()


def _pickle(path, obj):
    path.write_bytes(pickle.dumps(obj))


def _images(rng, n):
    return rng.integers(0, 256, size=(n, 3 * 32 * 32), dtype=np.uint8)


def _cifar10_files(root, monkeypatch):
    """A small CIFAR-10 in torchvision's extracted layout under root (MD5s patched in); returns
    the train batches' (images, labels)."""
    rng = np.random.default_rng(0)
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    train_list, expect = [], []
    for i in range(1, 6):
        x, y = _images(rng, 4), [int(v) for v in rng.integers(0, 10, 4)]
        _pickle(base / f"data_batch_{i}", {"data": x, "labels": y})
        train_list.append([f"data_batch_{i}", _md5(base / f"data_batch_{i}")])
        expect.append((x, y))
    _pickle(base / "test_batch", {"data": _images(rng, 3), "labels": [1, 2, 3]})
    _pickle(base / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    monkeypatch.setattr(tvd.CIFAR10, "train_list", train_list)
    monkeypatch.setattr(tvd.CIFAR10, "test_list", [["test_batch", _md5(base / "test_batch")]])
    monkeypatch.setattr(tvd.CIFAR10, "meta", {"filename": "batches.meta", "key": "label_names",
                                               "md5": _md5(base / "batches.meta")})
    return expect


def _no_network(monkeypatch):
    import urllib.request

    def refuse(*a, **k):
        raise AssertionError("a fetch was attempted")
    monkeypatch.setattr(urllib.request, "urlopen", refuse)


def test_cifar10_from_torchvision_format(tmp_path, monkeypatch):
    expect = _cifar10_files(tmp_path, monkeypatch)
    _no_network(monkeypatch)
    data = si.prepare_dataset("cifar10", root=tmp_path)       # download=True: verified, no fetch
    assert data.train_images.shape == (20, 3, 32, 32) and data.test_images.shape == (3, 3, 32, 32)
    # CIFAR stores rows of [R plane | G plane | B plane]: pixel (0, 0) of image 0
    x0 = expect[0][0][0]
    assert data.train_images[0, :, 0, 0].tolist() == [x0[0], x0[1024], x0[2048]]
    assert data.train_labels[:4].tolist() == expect[0][1]
    assert data.spec.num_classes == 10 and data.spec.mean[0] == 0.4914


def test_the_download_stage_uses_files_placed_in_data_raw_on_an_offline_node(tmp_path, monkeypatch):
    """docs/scaling-out.md's placement: the extracted archive in data/raw/ (the stage's --raw),
    and download@cifar10 prepares it without fetching anything."""
    from structinit.data.tensors import ImageData
    from test_own_dataset import run_stage_main

    _cifar10_files(tmp_path / "data/raw", monkeypatch)
    _no_network(monkeypatch)
    monkeypatch.chdir(tmp_path)
    run_stage_main("stages.download", monkeypatch, "--dataset", "cifar10", "--source", "datasets/cifar10",
                   "--out", "data/prepared/cifar10.pt")                  # --raw: data/raw, the default
    data = ImageData.load(tmp_path / "data/prepared/cifar10.pt")
    assert data.spec.name == "cifar10" and len(data.train_labels) == 20 and len(data.test_labels) == 3


def test_cifar10_corrupt_file_is_refused(tmp_path, monkeypatch):
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    monkeypatch.setattr(tvd.CIFAR10, "train_list", [["data_batch_1", "0" * 32]])
    monkeypatch.setattr(tvd.CIFAR10, "test_list", [])
    _pickle(base / "data_batch_1", {"data": _images(np.random.default_rng(0), 2), "labels": [0, 1]})
    with pytest.raises(RuntimeError, match="not found or corrupted"):
        si.prepare_dataset("cifar10", root=tmp_path, download=False)


def test_cifar100_from_torchvision_format(tmp_path, monkeypatch):
    rng = np.random.default_rng(1)
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    _pickle(base / "train", {"data": _images(rng, 6), "fine_labels": [0, 99, 5, 6, 7, 8]})
    _pickle(base / "test", {"data": _images(rng, 2), "fine_labels": [42, 1]})
    _pickle(base / "meta", {"fine_label_names": [f"c{i}" for i in range(100)]})
    monkeypatch.setattr(tvd.CIFAR100, "train_list", [["train", _md5(base / "train")]])
    monkeypatch.setattr(tvd.CIFAR100, "test_list", [["test", _md5(base / "test")]])
    monkeypatch.setattr(tvd.CIFAR100, "meta", {"filename": "meta", "key": "fine_label_names",
                                                "md5": _md5(base / "meta")})
    data = si.prepare_dataset("cifar100", root=tmp_path)
    assert data.train_labels.tolist() == [0, 99, 5, 6, 7, 8] and data.test_labels.tolist() == [42, 1]
    assert data.spec.num_classes == 100


def test_svhn_from_torchvision_format(tmp_path, monkeypatch):
    rng = np.random.default_rng(2)
    split_list = {}
    for split, n in (("train", 5), ("test", 2)):
        x = rng.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)   # SVHN: H, W, C, N
        y = np.array([[10], [1], [2], [3], [4]][:n], dtype=np.uint8)    # 10 means digit 0
        name = f"{split}_32x32.mat"
        scipy.io.savemat(tmp_path / name, {"X": x, "y": y})
        split_list[split] = ["http://invalid/" + name, name, _md5(tmp_path / name)]
        if split == "train":
            x_train = x
    monkeypatch.setattr(tvd.SVHN, "split_list", split_list)
    data = si.prepare_dataset("svhn", root=tmp_path)
    assert data.train_images.shape == (5, 3, 32, 32)
    assert data.train_labels.tolist() == [0, 1, 2, 3, 4]
    assert data.train_images[1, :, 3, 7].tolist() == x_train[3, 7, :, 1].tolist()
