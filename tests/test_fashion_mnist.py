"""Fashion-MNIST's three routes (its folder, Debian's package, the official download), each
checked by the decompressed files' SHA-256, on tiny files in the official IDX format; and the
real files where Debian's package is installed."""
import functools
import gzip
import http.server
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from structinit.data import fashion_mnist as fm
from structinit.data.specs import get_spec
from structinit.data.tensors import DownloadError, ImageData, prepare_dataset

SPEC = get_spec("fashion_mnist")


def tiny_files(n_train=12, n_test=4, seed=0) -> dict[str, bytes]:
    """The four decompressed files of a tiny Fashion-MNIST, in the official format."""
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": fm.idx_bytes(rng.integers(0, 256, (n_train, 28, 28))),
        "train-labels-idx1-ubyte": fm.idx_bytes(np.arange(n_train) % 10),
        "t10k-images-idx3-ubyte": fm.idx_bytes(rng.integers(0, 256, (n_test, 28, 28))),
        "t10k-labels-idx1-ubyte": fm.idx_bytes(np.arange(n_test) % 10),
    }


def digests(files):
    return {name: fm.sha256_of(data) for name, data in files.items()}


def write(folder: Path, files, gz: bool):
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if gz:   # mtime 0 and no name: another gzip header than the official one, as Debian's
            (folder / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (folder / name).write_bytes(data)


def load(*a, **k) -> ImageData:
    return ImageData(SPEC, *fm.load_fashion_mnist(*a, **k))


def check_equal(data, files):
    want_train = np.frombuffer(files["train-images-idx3-ubyte"], np.uint8, offset=16).reshape(-1, 1, 28, 28)
    want_labels = np.frombuffer(files["t10k-labels-idx1-ubyte"], np.uint8, offset=8)
    data.check()
    assert torch.equal(data.train_images, torch.from_numpy(want_train.copy()))
    assert torch.equal(data.test_labels, torch.from_numpy(want_labels.astype(np.int64)))
    assert data.train_images.shape == (12, 1, 28, 28) and data.test_images.shape == (4, 1, 28, 28)


@pytest.mark.parametrize("gz", [True, False])
def test_the_local_folder_route(tmp_path, gz):
    files = tiny_files()
    write(tmp_path / "local", files, gz)
    data = load(tmp_path / "raw", local=tmp_path / "local", system=tmp_path / "none",
                                 download=False, expected=digests(files))
    check_equal(data, files)
    # torchvision reads the checked copies from its own folder, as its FashionMNIST would
    import torchvision.datasets as tvd
    assert torch.equal(tvd.FashionMNIST(str(tmp_path / "raw"), train=False).data, data.test_images[:, 0])


def test_the_system_package_route_and_local_first(tmp_path):
    files, other = tiny_files(seed=0), tiny_files(seed=1)
    write(tmp_path / "debian", files, gz=True)
    write(tmp_path / "local", files, gz=False)           # valid in both routes: the folder wins
    found = fm.place_files(tmp_path / "first", tmp_path / "local", tmp_path / "debian", download=False,
                           expected=digests(files))
    assert all(src.startswith(str(tmp_path / "local")) for src in found.values())
    found = fm.place_files(tmp_path / "raw", tmp_path / "empty", tmp_path / "debian", download=False,
                           expected=digests(files))
    assert all(src.startswith(str(tmp_path / "debian")) for src in found.values())
    # a checked copy in torchvision's folder is used as is; a wrong one is replaced
    (tmp_path / "raw/FashionMNIST/raw/t10k-images-idx3-ubyte").write_bytes(other["t10k-images-idx3-ubyte"])
    found = fm.place_files(tmp_path / "raw", tmp_path / "empty", tmp_path / "debian", download=False,
                           expected=digests(files))
    assert found["t10k-images-idx3-ubyte"].startswith(str(tmp_path / "debian"))
    assert found["train-images-idx3-ubyte"].endswith("FashionMNIST/raw/train-images-idx3-ubyte")


def test_a_wrong_file_is_never_used_and_the_error_names_the_three_routes(tmp_path):
    files, other = tiny_files(seed=0), tiny_files(seed=1)
    write(tmp_path / "local", {**files, "train-images-idx3-ubyte": other["train-images-idx3-ubyte"]}, gz=True)
    with pytest.raises(DownloadError) as e:
        load(tmp_path / "raw", local=tmp_path / "local", system=tmp_path / "none",
                              download=False, expected=digests(files))
    msg = str(e.value)
    assert "\n" not in msg
    assert "train-images-idx3-ubyte" in msg and "train-labels" not in msg.split("wrong:")[0]
    assert f"{tmp_path / 'local'}/train-images-idx3-ubyte.gz (sha256" in msg
    assert str(tmp_path / "local") in msg and "dataset-fashion-mnist" in msg and str(tmp_path / "none") in msg
    assert "download" in msg
    assert not (tmp_path / "raw/FashionMNIST/raw/train-images-idx3-ubyte").exists()
    # the wrong file beside the right ones in another route: the right one is taken
    write(tmp_path / "debian", files, gz=False)
    found = fm.place_files(tmp_path / "raw", tmp_path / "local", tmp_path / "debian", download=False,
                           expected=digests(files))
    assert found["train-images-idx3-ubyte"] == str(tmp_path / "debian/train-images-idx3-ubyte")


def test_a_damaged_gzip_is_reported(tmp_path):
    files = tiny_files()
    write(tmp_path / "local", files, gz=True)
    (tmp_path / "local/t10k-labels-idx1-ubyte.gz").write_bytes(b"not gzip")
    with pytest.raises(DownloadError, match=r"t10k-labels-idx1-ubyte.gz \(unreadable"):
        fm.place_files(tmp_path / "raw", tmp_path / "local", tmp_path / "none", download=False,
                       expected=digests(files))


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A local HTTP server as Fashion-MNIST's mirror, serving the tiny files gzipped: the
    official route runs torchvision's own download (MD5 of each .gz, decompression)."""
    import torchvision.datasets as tvd
    from torchvision.datasets.utils import calculate_md5

    files = tiny_files(seed=2)
    served = tmp_path / "served"
    write(served, files, gz=True)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(tvd.FashionMNIST, "mirrors", [f"http://127.0.0.1:{server.server_address[1]}/"])
    monkeypatch.setattr(tvd.FashionMNIST, "resources",
                        [(f"{name}.gz", calculate_md5(str(served / f"{name}.gz"))) for name in files])
    yield files, served
    server.shutdown()


def test_the_download_route(tmp_path, mirror):
    files, _ = mirror
    data = load(tmp_path / "raw", local=tmp_path / "none", system=tmp_path / "none",
                                 download=True, expected=digests(files))
    assert torch.equal(data.train_labels, torch.arange(12) % 10)
    found = fm.place_files(tmp_path / "raw", tmp_path / "none", tmp_path / "none", download=False,
                           expected=digests(files))
    assert set(found) == set(files)


def test_a_download_of_other_bytes_fails_with_the_routes(tmp_path, mirror):
    files, _ = mirror
    with pytest.raises(DownloadError) as e:   # the mirror serves files whose digests are not these
        fm.place_files(tmp_path / "raw", tmp_path / "none", tmp_path / "none", download=True,
                       expected=digests(tiny_files(seed=3)))
    assert "from the download (sha256" in str(e.value) and "dataset-fashion-mnist" in str(e.value)


def test_offline_download_fails_in_one_line(tmp_path, monkeypatch):
    import torchvision.datasets as tvd

    monkeypatch.setattr(tvd.FashionMNIST, "mirrors", ["http://127.0.0.1:9/"])   # discard port: refused
    monkeypatch.setattr(fm, "DEBIAN_FOLDER", tmp_path / "no-package")
    with pytest.raises(DownloadError) as e:
        prepare_dataset("fashion_mnist", root=tmp_path / "raw", local=tmp_path / "none")
    msg = str(e.value)
    assert "\n" not in msg and "the download: RuntimeError" in msg
    assert "(1) put the four files" in msg and "(2) install Debian" in msg and "(3) let torchvision" in msg


REPO = Path(__file__).resolve().parents[1]
REAL = [p for p in (REPO / "datasets/fashion_mnist", fm.DEBIAN_FOLDER)
        if all((p / f"{name}.gz").is_file() or (p / name).is_file() for name in fm.FILES)]


@pytest.mark.skipif(not REAL, reason="Fashion-MNIST's files are in neither datasets/fashion_mnist/ nor Debian's "
                                     "package (./run.sh test fetches the package: tests/setup_data.sh)")
def test_the_real_files(tmp_path):
    data = prepare_dataset("fashion_mnist", root=tmp_path / "raw", local=REAL[0], download=False)
    assert data.train_images.shape == (60_000, 1, 28, 28) and data.test_images.shape == (10_000, 1, 28, 28)
    assert data.train_labels.bincount().tolist() == [6000] * 10 and data.test_labels.bincount().tolist() == [1000] * 10
    x = data.train_images.double() / 255
    assert round(x.mean().item(), 4) == SPEC.mean[0] and round(x.std().item(), 3) == round(SPEC.std[0], 3)
    raw = tmp_path / "raw/FashionMNIST/raw"
    assert {p.name: p.stat().st_size for p in raw.iterdir()} == {n: size for n, (_, size) in fm.FILES.items()}


@pytest.mark.parametrize("required, rc", [("1", 1), ("", 0)])
def test_setup_data_fails_in_ci_when_it_cannot_fetch(tmp_path, required, rc):
    """CI (.ci/run sets STRUCTINIT_REQUIRE_DATA=1) must not go green with the real-file tests skipped:
    without apt-get the set-up fails there, and only says so elsewhere."""
    (tmp_path / "tests").mkdir()
    shutil.copy(REPO / "tests/setup_data.sh", tmp_path / "tests")
    bin_ = tmp_path / "bin"            # a PATH with dirname alone: no apt-get, no dpkg-deb
    bin_.mkdir()
    (bin_ / "dirname").symlink_to(shutil.which("dirname"))
    if any((fm.DEBIAN_FOLDER / f"{n}.gz").is_file() for n in fm.FILES):
        pytest.skip("Debian's package is installed here: the set-up finds the files without fetching")
    env = {"PATH": str(bin_), "STRUCTINIT_REQUIRE_DATA": required}
    r = subprocess.run([shutil.which("bash"), str(tmp_path / "tests/setup_data.sh")], env=env,
                       capture_output=True, text=True)
    assert r.returncode == rc, r.stderr
    assert "no apt-get/dpkg-deb" in r.stderr
