"""A dataset of your own (structinit/data/own.py): both layouts become the tensors every dataset
becomes, bad files are refused naming the file, check_params checks the declaration against the
files, the documented params pass it, and in a temporary copy the dataset runs through the
pipeline while an edit of its files re-runs its stages alone."""
import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from structinit.data.own import TEST_FRACTION, Facts, OwnDatasetError, load_own, scan
from structinit.pipeline.params import ParamsError, validate_params

REPO = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((REPO / "params.yaml").read_text())


def labelled_images(n=200, size=8, classes=4, channels=None, seed=0):
    """uint8 images whose mean brightness follows the class (a learnable toy), and labels."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % classes
    shape = (n, size, size) + ((channels,) if channels else ())
    x = rng.integers(0, 60, shape) + 50 * y.reshape((n,) + (1,) * (len(shape) - 1))
    return x.astype(np.uint8), y


def write_images(folder: Path, split: str, x, y, names=("cat", "dog", "emu", "fox")):
    for i, (img, c) in enumerate(zip(x, y)):
        path = folder / split / names[c] / f"{i:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(path)


# ---- the loader ------------------------------------------------------------------------------

def test_an_npz_without_test_split_holds_out_a_fixed_fifth_of_each_class(tmp_path):
    x, y = labelled_images()
    np.savez(tmp_path / "data.npz", x=x, y=y)
    data = load_own("toy", tmp_path)
    assert data.train_images.shape == (160, 1, 8, 8) and data.test_images.shape == (40, 1, 8, 8)
    assert torch.bincount(data.test_labels).tolist() == [round(TEST_FRACTION * 50)] * 4
    # the split is a partition of the file's images, labels kept with their images
    pairs = sorted((img.tobytes(), int(c)) for img, c in zip(x, y))
    got = [(img[0].numpy().tobytes(), int(c)) for img, c in zip(torch.cat([data.train_images, data.test_images]),
                                                               torch.cat([data.train_labels, data.test_labels]))]
    assert sorted(got) == pairs
    first_of_each = {x[i].tobytes() for c in range(4) for i in np.flatnonzero(y == c)[:10]}
    assert {img[0].numpy().tobytes() for img in data.test_images} != first_of_each      # drawn, not the first
    again = load_own("toy", tmp_path)                       # the same images every time
    assert torch.equal(again.test_images, data.test_images)
    train = data.train_images.double() / 255
    assert data.spec.mean == (round(train.mean().item(), 4),)
    assert data.spec.std == (round(train.std(unbiased=False).item(), 4),)
    assert (data.spec.name, data.spec.image_size, data.spec.channels, data.spec.num_classes) == ("toy", 8, 1, 4)
    assert scan(tmp_path) == Facts("npz", 8, 1, 4, 160, 40)


def test_an_npz_with_test_split_and_color_channels_last(tmp_path):
    x, y = labelled_images(n=40, size=6, classes=3, channels=3)
    xt, yt = labelled_images(n=9, size=6, classes=3, channels=3, seed=1)
    np.savez_compressed(tmp_path / "anything.npz", x=x, y=y.astype(np.int32), x_test=xt, y_test=yt)
    data = load_own("toy", tmp_path)
    assert data.train_images.shape == (40, 3, 6, 6) and data.test_images.shape == (9, 3, 6, 6)
    assert torch.equal(data.train_images, torch.from_numpy(x).permute(0, 3, 1, 2))   # (N, H, W, C) -> (N, C, H, W)
    assert torch.equal(data.test_labels, torch.from_numpy(yt)) and data.train_labels.dtype == torch.int64
    assert len(data.spec.mean) == len(data.spec.std) == 3
    assert scan(tmp_path).train_images == 40 and scan(tmp_path).test_images == 9


def test_image_folders_take_sorted_class_names_and_read_gray_among_color_as_rgb(tmp_path):
    x, y = labelled_images(n=12, size=5, classes=2)
    write_images(tmp_path, "train", x[:8], y[:8], names=("zebra", "ant"))      # ant = 0, zebra = 1
    write_images(tmp_path, "test", x[8:], y[8:], names=("zebra", "ant"))
    (tmp_path / "train/ant/notes.txt").write_text("not an image: skipped")
    gray = load_own("toy", tmp_path)
    assert gray.spec.channels == 1 and gray.spec.num_classes == 2
    assert gray.train_labels.tolist() == [0] * 4 + [1] * 4                     # ant's files, then zebra's
    assert torch.equal(gray.train_images[:4, 0], torch.from_numpy(x[:8][y[:8] == 1]))
    color = np.full((5, 5, 3), (10, 200, 30), dtype=np.uint8)
    Image.fromarray(color).save(tmp_path / "train/ant/zz_color.png")
    rgb = load_own("toy", tmp_path)
    assert rgb.spec.channels == 3 and rgb.train_images.shape == (9, 3, 5, 5)
    assert torch.equal(rgb.train_images[0, 1], torch.from_numpy(x[:8][y[:8] == 1][0]))   # gray, repeated
    assert rgb.train_images[4, :, 0, 0].tolist() == [10, 200, 30]
    assert scan(tmp_path).channels == 3


def _npz(**arrays):
    def write(folder):
        np.savez(folder / "data.npz", **arrays)
    return write


X, Y = labelled_images(n=40)
BAD_FILES = [
    ("no folder", None, ["no such folder"]),
    ("empty folder", lambda f: None, ["no .npz file and no train/ folder"]),
    ("float images", _npz(x=X.astype(np.float32), y=Y), ["x is float32", "expected uint8"]),
    ("not square", _npz(x=X[:, :, :6], y=Y), ["x is uint8 (40, 8, 6)", "H = W"]),
    ("no labels", _npz(x=X), ["holds arrays ['x']", "expected x and y"]),
    ("x_test without y_test", _npz(x=X, y=Y, x_test=X), ["both or neither"]),
    ("labels of another length", _npz(x=X, y=Y[:30]), ["y is int64 (30,)", "one per image of x"]),
    ("a class missing", _npz(x=X, y=np.where(Y == 1, 3, Y)), ["training labels are [0, 2, 3]", "missing [1]"]),
    ("test label unknown", _npz(x=X, y=Y, x_test=X[:4], y_test=np.array([0, 1, 2, 9])), ["test labels span 0..9"]),
    ("two files", lambda f: (_npz(x=X, y=Y)(f), np.savez(f / "more.npz", x=X, y=Y)), ["keep one dataset there"]),
    ("one class folder", lambda f: write_images(f, "train", X[:4], Y[:4] * 0), ["1 class folder(s)"]),
    ("images of two sizes", lambda f: (write_images(f, "train", X[:8], Y[:8]),
                                       Image.fromarray(X[0, :6, :6]).save(f / "train/cat/small.png")),
     ["small.png: 6x6", "of one size"]),
    ("a test class not in train", lambda f: (write_images(f, "train", X[:8], Y[:8] % 2),
                                             write_images(f, "test", X[:4], Y[:4])),
     ["['emu', 'fox'] are not in train/"]),
]


@pytest.mark.parametrize("make, fragments", [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES])
def test_a_bad_folder_is_refused_naming_the_file_and_what_is_expected(tmp_path, make, fragments):
    folder = tmp_path / "toy"
    if make is not None:
        folder.mkdir()
        make(folder)
    for read in (scan, lambda f: load_own("toy", f)):
        with pytest.raises(OwnDatasetError) as e:
            read(folder)
        assert str(folder) in str(e.value) and all(f in str(e.value) for f in fragments), str(e.value)


# ---- check_params ----------------------------------------------------------------------------

def own_params(name="shapes", facts=None, in_grid=True, recipe=True):
    p = copy.deepcopy(DEFAULT)
    p["own_datasets"] = {name: facts or {"image_size": 8, "channels": 1, "num_classes": 4}}
    if recipe:
        p["recipes"][name] = copy.deepcopy(p["recipes"]["digits"])
    if in_grid:
        p["grid"]["datasets"] = ["digits", name]
    return p


@pytest.fixture
def project(tmp_path):
    """A folder with datasets/shapes/data.npz: 8x8 grayscale, 4 classes, 160 training images."""
    (tmp_path / "datasets/shapes").mkdir(parents=True)
    x, y = labelled_images()
    np.savez(tmp_path / "datasets/shapes/data.npz", x=x, y=y)
    return tmp_path


def test_check_params_takes_a_declared_dataset_whose_files_agree(project):
    validate_params(own_params(), root=project)
    p = own_params()                                           # the docs' patch grid check applies to it
    p["recipes"]["shapes"]["model"]["patch_size"] = 2
    with pytest.raises(ParamsError, match=r"grid.kernels\[1\] = 5: .*4x4 patch grid.*shapes"):
        validate_params(p, root=project)


BAD_PARAMS = [
    ("a built-in's name", own_params(name="digits", in_grid=False, recipe=False),
     ["own_datasets.digits = 'digits'", "built-in dataset's name"]),
    ("a name with a dash", own_params(name="my-data", in_grid=False, recipe=False),
     ["own_datasets.my-data", "lowercase letters, digits and underscores"]),
    ("no folder", own_params(name="other"), ["own_datasets.other = 'other'", "datasets/other: no such folder"]),
    ("another image size", own_params(facts={"image_size": 16, "channels": 1, "num_classes": 4}),
     ["own_datasets.shapes.image_size = 16", "datasets/shapes/ holds 8", "8x8 images"]),
    ("another class count", own_params(facts={"image_size": 8, "channels": 1, "num_classes": 5}),
     ["own_datasets.shapes.num_classes = 5", "holds 4"]),
    ("channels neither 1 nor 3", own_params(facts={"image_size": 8, "channels": 2, "num_classes": 4}),
     ["own_datasets.shapes.channels = 2", "1 or 3"]),
    ("in the grid without a recipe", own_params(recipe=False), ["grid.datasets = 'shapes'", "has no recipe"]),
    ("a grid dataset that is neither", own_params(in_grid=False) | {"grid": DEFAULT["grid"] | {"datasets": ["shapez"]}},
     ["grid.datasets[0] = 'shapez'", "unknown dataset", "own_datasets: ['shapes']"]),
    ("more training images than it has", own_params() | {"data": {"train_size": 200, "subset_seed": 0}},
     ["data.train_size = 200", "shapes has 160 training images"]),
]


@pytest.mark.parametrize("params, fragments", [b[1:] for b in BAD_PARAMS], ids=[b[0] for b in BAD_PARAMS])
def test_check_params_refuses_a_bad_declaration_in_one_line(project, params, fragments):
    with pytest.raises(ParamsError) as e:
        validate_params(params, root=project)
    assert any(all(f in line for f in fragments) for line in str(e.value).splitlines()), str(e.value)


def test_the_documented_params_pass_check_params(tmp_path):
    """docs/pipeline.md's block and command, with files of the facts it declares, through the
    check_params stage as `dvc repro` runs it."""
    text = (REPO / "docs/pipeline.md").read_text()
    block = re.search(r"<!-- own-dataset-params:.*?-->\n```yaml\n(.*?)```", text, re.S)[1]
    command = re.search(r"dvc exp run -S '(grid\.datasets)=\[(.*?)\]'", text[text.index("## Your own dataset"):])
    documented = yaml.safe_load(block)
    name, facts = next(iter(documented["own_datasets"].items()))
    params = copy.deepcopy(DEFAULT)
    params["own_datasets"] = documented["own_datasets"]
    params["recipes"].update(documented["recipes"])
    params["grid"]["datasets"] = command[2].split(",")
    assert name in params["grid"]["datasets"]
    x, y = labelled_images(n=100, size=facts["image_size"], classes=facts["num_classes"])
    write_images(tmp_path / "datasets" / name, "train", x, y)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    # the repo first, and whatever PYTHONPATH already holds (where dependencies may come from)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    r = subprocess.run([sys.executable, "-m", "stages.check_params", "--out", "checked"], cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True)
    assert r.returncode == 0 and (tmp_path / "checked").exists(), r.stderr


# ---- the stages ------------------------------------------------------------------------------

def run_stage_main(module, monkeypatch, *args):
    """A stage's main() in this process (the folder is the project): no interpreter to start."""
    import importlib

    monkeypatch.setattr(sys, "argv", [module, *args])
    importlib.import_module(module).main()


def test_download_prepares_an_own_dataset_and_stops_when_its_files_disagree_with_params(project, monkeypatch):
    from structinit.data.tensors import ImageData

    monkeypatch.chdir(project)
    (project / "params.yaml").write_text(yaml.safe_dump(own_params(), sort_keys=False))
    args = ("--dataset", "shapes", "--source", "datasets/shapes", "--out", "s.pt")
    run_stage_main("stages.download", monkeypatch, *args)
    data = ImageData.load(project / "s.pt")
    assert data.spec.name == "shapes" and data.train_images.shape == (160, 1, 8, 8)
    x, y = labelled_images(size=4)                 # the files change, params.yaml still says 8x8
    np.savez(project / "datasets/shapes/data.npz", x=x, y=y)
    with pytest.raises(OwnDatasetError, match="own_datasets.shapes.image_size is 8 but the files hold 4"):
        run_stage_main("stages.download", monkeypatch, *args)


@pytest.mark.parametrize("stage", ["stages.preoptimize", "stages.reference_solve"])
def test_the_solves_take_an_own_datasets_declared_image_size(project, monkeypatch, stage):
    from structinit.io import load_checked

    # 12 declared, 8x8 files: the solves read the declaration (check_params compares it with the files)
    p = own_params(facts={"image_size": 12, "channels": 1, "num_classes": 4})
    p["recipes"]["shapes"]["model"].update(patch_size=2, embed_dim=12, depth=1)
    p["grid"]["seeds"] = [0]
    p["solve"]["adam"]["steps"] = 5
    monkeypatch.chdir(project)
    (project / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    out = ("--out", "solved") if stage == "stages.preoptimize" else ()
    run_stage_main(stage, monkeypatch, "--dataset", "shapes", "--kernel", "3", "--seeds-from", "grid.seeds",
                   "--record", "record", *out)
    record = json.loads((project / "record/seed0.json").read_text())
    assert record["dataset"] == "shapes" and len(record["offsets_layer0"]) == 3   # 3 heads, a 6x6 grid
    if out:
        assert list(load_checked(project / "solved/seed0.pt", "a solve")["patch_grid"]) == [6, 6]


# ---- the pipeline ----------------------------------------------------------------------------

def test_an_own_dataset_runs_through_the_pipeline_and_an_edit_of_its_files_reruns_its_cells_alone(tmp_path):
    from dvc.repo import Repo

    from test_pipeline import sh, tiny_repo_copy

    def ran(out: str) -> set[str]:
        return set(re.findall(r"Running stage '([^']+)'", out))

    repo = tiny_repo_copy(tmp_path)
    x, y = labelled_images(n=500)                  # 400 training images: data.train_size is 300 here
    (repo / "datasets/shapes").mkdir()
    np.savez(repo / "datasets/shapes/data.npz", x=x, y=y)
    p = yaml.safe_load((repo / "params.yaml").read_text())
    p["own_datasets"] = {"shapes": {"image_size": 8, "channels": 1, "num_classes": 4}}
    p["recipes"]["shapes"] = copy.deepcopy(p["recipes"]["digits"])
    p["recipes"]["shapes"]["train"].update(epochs=1, warmup_epochs=0, eval_every=1)
    p["grid"].update(datasets=["digits", "shapes"], seeds=[0])
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    # the files are a dependency of download@shapes and of no other stage
    with Repo(str(repo)) as dvc:
        watching = {s.name for s in dvc.index.stages if any(d.def_path == "datasets/shapes" for d in s.deps)}
    assert watching == {"download@shapes"}
    # one cell of each dataset (digits' trains on 300 images, 3 epochs: tiny_repo_copy's)
    cells = ["train_baseline@shapes-trunc_normal", "train_baseline@digits-trunc_normal"]
    first = sh(repo, "dvc", "repro", *cells)
    assert ran(first.stdout) == {"check_params", "download@shapes", "download@digits", *cells}
    assert "shapes: 400 train / 100 test images" in first.stdout
    metrics = json.loads((repo / "results/train/shapes-trunc_normal/seed0/metrics.json").read_text())
    assert 0 <= metrics["final_test_acc"] <= 100
    np.savez(repo / "datasets/shapes/data.npz", x=x[::-1].copy(), y=y[::-1].copy())
    second = sh(repo, "dvc", "repro", *cells)
    assert ran(second.stdout) == {"download@shapes", "train_baseline@shapes-trunc_normal"}
    assert "Stage 'train_baseline@digits-trunc_normal' didn't change" in second.stdout
