"""A built-in dataset's download without a network: one line naming the file to place by hand,
the folder, its MD5 and its URL (structinit/data/tensors.py, DownloadError), never urllib's
chained traceback. The network is never touched: urlopen is made to fail as it does offline."""
import hashlib
import os
import socket
import subprocess
import sys
import tarfile
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torchvision.datasets as tvd

import structinit as si
from structinit.data.tensors import DownloadError

REPO = Path(__file__).resolve().parents[1]


def _offline(monkeypatch):
    def unreachable(*a, **k):   # what urlopen raises when DNS cannot be reached
        raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))
    monkeypatch.setattr(urllib.request, "urlopen", unreachable)


def _expected_files(name):
    """(url, filename, md5) of what the dataset needs, from torchvision's own attributes."""
    if name == "svhn":
        return [tuple(tvd.SVHN.split_list[s]) for s in ("train", "test")]
    cls = tvd.CIFAR10 if name == "cifar10" else tvd.CIFAR100
    return [(cls.url, cls.filename, cls.tgz_md5)]


@pytest.mark.parametrize("name", ["cifar10", "cifar100", "svhn"])
def test_an_unreachable_server_is_one_line_naming_file_folder_md5_and_url(tmp_path, monkeypatch, name):
    _offline(monkeypatch)
    root = tmp_path / "data/raw"
    with pytest.raises(DownloadError) as e:
        si.prepare_dataset(name, root=root)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{name}: could not download")
    assert "Temporary failure in name resolution" in msg                    # the cause, kept
    assert f"place by hand in {root.resolve()}/: " in msg
    for url, filename, md5 in _expected_files(name):
        assert f"{filename} (md5 {md5}, from {url})" in msg
    assert e.value.__cause__ is None and e.value.__suppress_context__      # no chained traceback


@pytest.mark.parametrize("error", [
    TimeoutError("timed out"),
    ConnectionRefusedError(111, "Connection refused"),
    urllib.error.HTTPError("https://www.cs.toronto.edu/", 503, "Service Unavailable", None, None),
], ids=lambda e: type(e).__name__)
def test_every_kind_of_failed_fetch_is_the_same_one_line(tmp_path, monkeypatch, error):
    def fail(*a, **k):
        raise error
    monkeypatch.setattr(urllib.request, "urlopen", fail)
    with pytest.raises(DownloadError, match=f"cifar10: could not download its files \\({type(error).__name__}: "
                                            f".*cifar-10-python.tar.gz \\(md5 {tvd.CIFAR10.tgz_md5}"):
        si.prepare_dataset("cifar10", root=tmp_path)


class _Response:
    """What urlopen returns, serving `body` from `url` (no redirect)."""

    def __init__(self, url, body):
        self.url, self.length, self._body = url, len(body), [body]

    def read(self, *a):
        return self._body.pop() if self._body else b""

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_a_download_that_arrives_damaged_is_one_line_with_both_md5s(tmp_path, monkeypatch):
    """The server answers, with the wrong bytes (a proxy's page): torchvision's "File not found
    or corrupted." becomes the line, with the MD5 of what arrived."""
    body = b"<html>sign in to the wifi</html>"
    monkeypatch.setattr(urllib.request, "urlopen", lambda req, *a, **k: _Response(req.full_url, body))
    with pytest.raises(DownloadError) as e:
        si.prepare_dataset("cifar100", root=tmp_path)
    assert "\n" not in str(e.value) and "RuntimeError: File not found or corrupted." in str(e.value)
    assert (f"cifar-100-python.tar.gz (md5 {tvd.CIFAR100.tgz_md5}, from {tvd.CIFAR100.url}; the one there "
            f"has md5 {hashlib.md5(body).hexdigest()}: incomplete or another file, replace it)") in str(e.value)


def test_only_the_svhn_file_still_missing_is_named(tmp_path, monkeypatch):
    """train_32x32.mat placed and intact, test_32x32.mat not: the message asks for the test file."""
    train = tmp_path / "train_32x32.mat"
    scipy.io.savemat(train, {"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.array([[1], [2]], np.uint8)})
    split_list = {**tvd.SVHN.split_list,
                  "train": [tvd.SVHN.split_list["train"][0], "train_32x32.mat",
                            hashlib.md5(train.read_bytes()).hexdigest()]}
    monkeypatch.setattr(tvd.SVHN, "split_list", split_list)
    _offline(monkeypatch)
    with pytest.raises(DownloadError) as e:
        si.prepare_dataset("svhn", root=tmp_path)
    assert f"test_32x32.mat (md5 {tvd.SVHN.split_list['test'][2]}" in str(e.value)
    assert "train_32x32.mat" not in str(e.value)


def test_an_archive_placed_by_hand_with_the_wrong_md5_is_named_with_both_md5s(tmp_path, monkeypatch):
    """torchvision re-fetches a file whose MD5 differs (offline: urllib's error); the line says
    the file there is not the one expected."""
    placed = tmp_path / "cifar-10-python.tar.gz"
    placed.write_bytes(b"half a download")
    _offline(monkeypatch)
    with pytest.raises(DownloadError) as e:
        si.prepare_dataset("cifar10", root=tmp_path)
    found = hashlib.md5(b"half a download").hexdigest()
    assert "\n" not in str(e.value)
    assert (f"cifar-10-python.tar.gz (md5 {tvd.CIFAR10.tgz_md5}, from {tvd.CIFAR10.url}; the one there has "
            f"md5 {found}: incomplete or another file, replace it)") in str(e.value)


def test_a_correctly_placed_archive_is_extracted_and_used_offline(tmp_path, monkeypatch):
    """What the message asks for works: cifar-10-python.tar.gz alone in the folder (MD5 patched
    to the tiny archive's), no network."""
    from test_data import _cifar10_files

    staging = tmp_path / "staging"
    _cifar10_files(staging, monkeypatch)
    root = tmp_path / "raw"
    root.mkdir()
    archive = root / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(staging / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setattr(tvd.CIFAR10, "tgz_md5", hashlib.md5(archive.read_bytes()).hexdigest())
    _offline(monkeypatch)
    data = si.prepare_dataset("cifar10", root=root)
    assert len(data.train_labels) == 20 and len(data.test_labels) == 3


def test_download_false_keeps_torchvisions_error(tmp_path):
    """No fetch asked for, none failed: torchvision's own "not found" stays as it was."""
    with pytest.raises(RuntimeError, match="not found or corrupted") as e:
        si.prepare_dataset("cifar100", root=tmp_path, download=False)
    assert not isinstance(e.value, DownloadError)


def test_the_download_stage_prints_one_line_and_no_traceback_offline(tmp_path):
    """python -m stages.download, as DVC runs it, with every urlopen failing as offline
    (a sitecustomize on PYTHONPATH): exit status 1, stderr the one line."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""\
        import socket, urllib.error, urllib.request
        def unreachable(*a, **k):
            raise urllib.error.URLError(socket.gaierror(-3, "Temporary failure in name resolution"))
        urllib.request.urlopen = unreachable
        """))
    path = os.pathsep.join(p for p in (str(site), str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("DVC_STAGE", None)
    raw = tmp_path / "raw"
    r = subprocess.run([sys.executable, "-m", "stages.download", "--dataset", "cifar10", "--source",
                        "datasets/cifar10", "--raw", str(raw), "--out", str(tmp_path / "cifar10.pt")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: cifar10: could not download its files (URLError: <urlopen error [Errno -3] Temporary failure "
        f"in name resolution>); place by hand in {raw.resolve()}/: cifar-10-python.tar.gz (md5 "
        f"{tvd.CIFAR10.tgz_md5}, from {tvd.CIFAR10.url}), then run again (docs/scaling-out.md)"]
    assert not (tmp_path / "cifar10.pt").exists()
