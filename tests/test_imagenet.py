"""ImageNet-1K from a local ILSVRC folder, streamed; one cell on several processes (DDP)."""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ilsvrc_files import write_ilsvrc
from structinit.training.config import TrainConfig
from structinit.models import create_vit
from structinit.distributed import (DistributedContext, relaunch_under_torchrun, requested_micro_batch,
                                   requested_processes)
from structinit.errors import ConfigError
from structinit.data.imagenet import (ImageNetLayoutError, check_root_matches, imagenet_datasets, scan_imagenet,
                                 train_loader)

HERE = Path(__file__).resolve().parent
# The jobs here compare runs to float noise and were measured on the CPU (fp32): on a machine
# with a GPU they hide it, and two processes meet through gloo, never NCCL on one GPU.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture
def no_gpu(monkeypatch):
    """In this process: the trainers pick the CPU (DistributedContext.device(), pin_memory)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.fixture(scope="module")
def ilsvrc(tmp_path_factory):
    root = tmp_path_factory.mktemp("ilsvrc")
    write_ilsvrc(root)
    return root


def test_scan_lists_both_splits_with_labels_in_wnid_order(ilsvrc):
    m = scan_imagenet(ilsvrc, num_classes=4)
    assert m["classes"] == sorted(m["classes"]) and len(m["classes"]) == 4
    assert len(m["train"]) == 24 and len(m["val"]) == 8
    path, label, size = m["train"][7]
    assert path.startswith(f"train/{m['classes'][label]}/") and size == (ilsvrc / path).stat().st_size


@pytest.mark.parametrize("damage, expected", [
    (None, "set local_datasets.imagenet in params.yaml"),
    ("missing", "does not exist; expected a folder with train/<wnid>/*.JPEG"),
    ("no_val", "has no val/ folder"),
    ("flat_val", "holds 8 images but no class folders: sort them into val/<wnid>/"),
    ("class_count", "has 3 class folders named like n01440764; ImageNet-1K has 4"),
    ("other_classes", "class folders differ from train/'s"),
    ("empty_class", "1 class folders of"),
])
def test_missing_or_incomplete_directory_is_a_clear_error(tmp_path, damage, expected):
    import shutil

    root = tmp_path / "imagenet"
    wnids = write_ilsvrc(root)
    if damage == "missing":
        shutil.rmtree(root)
    elif damage == "no_val":
        shutil.rmtree(root / "val")
    elif damage == "flat_val":
        for f in list((root / "val").rglob("*.JPEG")):
            f.rename(root / "val" / f.name)
        for w in wnids:
            (root / "val" / w).rmdir()
    elif damage == "class_count":
        shutil.rmtree(root / "val" / wnids[0])
    elif damage == "other_classes":
        (root / "val" / wnids[0]).rename(root / "val" / "n99999999")
    elif damage == "empty_class":
        for f in (root / "train" / wnids[1]).iterdir():
            f.unlink()
    with pytest.raises(ImageNetLayoutError, match=expected.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        scan_imagenet(None if damage is None else root, num_classes=4)


def test_a_copy_short_of_images_is_an_error_unless_a_subset_is_allowed(ilsvrc, capsys):
    # every class folder there, but not every image (a half-extracted archive): 24 / 8 here
    full = {"train": 24, "val": 8}
    assert len(scan_imagenet(ilsvrc, num_classes=4, expected_images=full)["train"]) == 24
    short = {"train": 25, "val": 8}
    with pytest.raises(ImageNetLayoutError, match=r"holds 24 train / 8 val images; expected 25 / 8 .*"
                                                  "imagenet_require_full: false"):
        scan_imagenet(ilsvrc, num_classes=4, expected_images=short)
    m = scan_imagenet(ilsvrc, num_classes=4, expected_images=short, require_full=False)
    assert len(m["train"]) == 24 and "warning: " in capsys.readouterr().out


def test_a_moved_or_changed_copy_is_caught_before_training(ilsvrc, tmp_path):
    m = scan_imagenet(ilsvrc, num_classes=4)
    assert check_root_matches(ilsvrc, m) == ilsvrc
    with pytest.raises(ImageNetLayoutError, match="does not hold the images the prepared manifest lists"):
        check_root_matches(tmp_path, m)


def test_each_image_is_augmented_the_same_on_any_worker_or_process_split(ilsvrc):
    m = scan_imagenet(ilsvrc, num_classes=4)
    cfg = TrainConfig(batch_size=8, randaugment="rand-m9-mstd0.5-inc1", random_erasing=0.25)
    train, _ = imagenet_datasets(ilsvrc, m, cfg, seed=5)
    x0, _ = train[3]
    assert x0.shape == (3, 224, 224)
    assert torch.equal(train[3][0], x0)                       # seeded per image: repeatable
    train.epoch = 1
    assert not torch.equal(train[3][0], x0)                   # and new each epoch
    one = list(train_loader(train, 8, DistributedContext(1, 0), epoch=2, seed=5, workers=0))
    two = [list(train_loader(train, 8, DistributedContext(2, r), epoch=2, seed=5, workers=w))
           for r, w in ((0, 0), (1, 2))]                      # another process, two worker processes
    assert len(one) == len(two[0]) == len(two[1]) == 3        # 24 images // 8: same steps
    for step, (x, y) in enumerate(one):
        x2 = torch.cat([two[0][step][0], two[1][step][0]])
        y2 = torch.cat([two[0][step][1], two[1][step][1]])
        order, order2 = torch.argsort(x.flatten(1).sum(1)), torch.argsort(x2.flatten(1).sum(1))
        assert torch.equal(y[order], y2[order2]) and torch.equal(x[order], x2[order2])


def test_mixed_up_training_learns_the_tiny_set(ilsvrc, tmp_path):
    out = tmp_path / "one.pt"
    run = subprocess.run([sys.executable, str(HERE / "ddp_job.py"), str(ilsvrc), str(out), "--epochs", "6",
                          "--mixup", "0.8"], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, **CPU_ONLY))
    assert run.returncode == 0, run.stderr[-3000:]
    history = torch.load(out)["history"]
    assert [h["epoch"] for h in history] == [1, 2, 3, 4, 5, 6]
    assert all(k in history[-1] for k in ("train_loss", "test_acc", "lr", "images_per_s"))
    # Learning, against the untrained model (test loss 1.392 ~ ln 4, 2 of 8 right), with these
    # seeds on the CPU: the mixed-up loss falls (seen 1.365 -> 1.221); the test loss (no mixing,
    # no augmentation: the steadier signal) falls, 1.201 -> 1.061; and 6 of the 8 test images
    # are right: the two classes of a colour of their own, and one of the two red ones (classes
    # 0 and 3 differ only in brightness, which 18 steps do not learn). 6 of 8 is reached after
    # epoch 1 already, so the accuracy alone would not show that the epochs after it train.
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.05
    assert history[-1]["test_loss"] < history[0]["test_loss"] - 0.05
    assert history[-1]["test_loss"] < math.log(4) - 0.2
    assert history[-1]["test_acc"] >= 0.75


def torchrun(*args, nproc=2, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", **CPU_ONLY)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={nproc}", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_two_gloo_processes_train_as_one_and_resume(ilsvrc, tmp_path):
    """Same global batch on 1 and 2 processes: the same model to float noise. A run killed after
    its first epoch on 2 processes resumes on 1 to the uninterrupted 2-process run's weights."""
    job = str(HERE / "ddp_job.py")
    single = subprocess.run([sys.executable, job, str(ilsvrc), str(tmp_path / "one.pt")],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, **CPU_ONLY))
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = torchrun(job, str(ilsvrc), str(tmp_path / "two.pt"))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert two["world_size"] == 2
    # Tolerance: the two runs differ only in summation order (each process sums half a batch,
    # then gloo averages), ~1e-7 relative per step; after 6 AdamW steps at lr 1e-3 the weights
    # agree to 1e-5 while lr * steps = 6e-3 is what training moves them (so a wrong batch split,
    # a missing gradient average or a different data order would exceed it by far).
    for k, w in one["model"].items():
        torch.testing.assert_close(two["model"][k], w, rtol=0, atol=1e-5, msg=k)
    torch.manual_seed(0)                                     # the job's init, to show training moved
    init = create_vit(img_size=224, patch_size=16, embed_dim=24, depth=1, num_heads=2, num_classes=4,
                      in_chans=3).state_dict()
    assert max((w - init[k]).abs().max() for k, w in one["model"].items()) > 1e-3
    for h1, h2 in zip(one["history"], two["history"]):
        assert abs(h1["train_loss"] - h2["train_loss"]) < 1e-5 and h1["test_acc"] == h2["test_acc"]

    ckpt = tmp_path / "ckpt.pt"
    killed = torchrun(job, str(ilsvrc), str(tmp_path / "k.pt"), "--checkpoint", str(ckpt), "--stop-after", "1")
    assert killed.returncode != 0 and ckpt.exists() and not (tmp_path / "k.pt").exists()
    resumed = subprocess.run([sys.executable, job, str(ilsvrc), str(tmp_path / "k.pt"), "--checkpoint", str(ckpt)],
                             capture_output=True, text=True, timeout=300, env=dict(os.environ, **CPU_ONLY))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout + resumed.stderr
    again = torch.load(tmp_path / "k.pt")
    assert again["world_size"] == 1 and [h["epoch"] for h in again["history"]] == [1, 2]
    for k, w in two["model"].items():
        torch.testing.assert_close(again["model"][k], w, rtol=0, atol=1e-5, msg=k)


def test_process_count_comes_from_the_environment():
    assert requested_processes({}) == 1
    assert requested_processes({"STRUCTINIT_NPROC": "4"}) == 4
    for bad in ("0", "two", "-1"):
        # the library raises (a caller may catch it as the ValueError it is); it never exits
        with pytest.raises(ConfigError, match=f"STRUCTINIT_NPROC='{bad}': give a whole number") as error:
            requested_processes({"STRUCTINIT_NPROC": bad})
        assert isinstance(error.value, ValueError)
    assert requested_micro_batch({}) is None and requested_micro_batch({"STRUCTINIT_MICRO_BATCH": "64"}) == 64
    with pytest.raises(ConfigError, match=r"STRUCTINIT_MICRO_BATCH='0': give a whole number of images >= 1"):
        requested_micro_batch({"STRUCTINIT_MICRO_BATCH": "0"})
    # a stage is what exits: one line with the message, no traceback
    from stages.common import run_stage

    with pytest.raises(SystemExit) as stage_exit:
        run_stage(lambda: requested_processes({"STRUCTINIT_NPROC": "two"}))
    assert str(stage_exit.value.code).startswith("error: STRUCTINIT_NPROC='two': give a whole number")
    # one process, or already a torchrun worker: carry on here
    assert relaunch_under_torchrun("stages.train", [], {"STRUCTINIT_NPROC": "1"}) is None
    assert relaunch_under_torchrun("stages.train", [], {"STRUCTINIT_NPROC": "2", "LOCAL_RANK": "0"}) is None


def test_imagenet_in_the_grid_without_a_folder_is_refused_before_any_stage_runs():
    import yaml

    from structinit.pipeline.params import ParamsError, validate_params

    params = yaml.safe_load((HERE.parent / "params.yaml").read_text())
    params["grid"]["streamed_datasets"] = ["imagenet"]
    with pytest.raises(ParamsError, match=r"^params.yaml: grid.streamed_datasets = 'imagenet': is read from a "
                                          r"local directory, never downloaded: set local_datasets.imagenet to its "
                                          r"folder \(ILSVRC layout: train/<wnid>/\*.JPEG, val/<wnid>/\*.JPEG\)$"):
        validate_params(params)
    params["local_datasets"]["imagenet"] = "/data/ILSVRC"
    validate_params(params)                                  # the recipe itself is valid
    # the on-device stages never train it: it has its own templates (download_streamed, train_streamed_*)
    params["grid"]["datasets"].append("imagenet")
    with pytest.raises(ParamsError, match=r"grid.datasets\[1\] = 'imagenet': is read from a local folder while "
                                          r"training: list it in grid.streamed_datasets"):
        validate_params(params)


def test_the_on_device_trainer_refuses_what_only_the_streamed_one_does(digits):
    from structinit.training.trainer import train_models

    model = create_vit(img_size=8, patch_size=1, embed_dim=24, depth=1, num_heads=2, num_classes=10, in_chans=1)
    with pytest.raises(ValueError, match=r"\{'mixup': 0.8\}: the on-device trainer does not implement"):
        train_models([model], digits, [TrainConfig(epochs=1, mixup=0.8)])


def test_stacked_on_device_cell_on_two_gloo_processes_equals_one(tmp_path):
    """The on-device trainer under torchrun: each process keeps half of every global batch and
    gradients are averaged, so two stacked digits models train as on one process. Rank 1
    builds other weights here: rank 0's (the ones written out) are the ones trained."""
    job = str(HERE / "ddp_job.py")
    single = subprocess.run([sys.executable, job, "digits", str(tmp_path / "one.pt")],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ, **CPU_ONLY))
    assert single.returncode == 0, single.stderr[-3000:]
    ddp = torchrun(job, "digits", str(tmp_path / "two.pt"), "--rank1-builds-other-weights")
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    # rank 0 alone reports (logs, metrics, checkpoints): one line per model and epoch
    assert (tmp_path / "two.pt.reports").read_text().split("\n")[:-1] == [
        f"rank0 model{i} epoch{e}" for e in (1, 2) for i in (0, 1)]
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert two["world_size"] == 2
    # 16 steps of AdamW at lr 1e-3 move weights by ~1e-2; summation order alone differs (1e-5)
    for m1, m2 in zip(one["models"], two["models"]):
        for k, w in m1.items():
            torch.testing.assert_close(m2[k], w, rtol=0, atol=2e-5, msg=k)
    for h1, h2 in zip(one["histories"], two["histories"]):
        assert all(abs(a["train_loss"] - b["train_loss"]) < 1e-5 for a, b in zip(h1, h2))
        assert [h["test_acc"] for h in h1] == [h["test_acc"] for h in h2]
    assert one["histories"][0][-1]["test_acc"] != one["histories"][1][-1]["test_acc"]   # two seeds, two runs
    init = create_vit(img_size=8, patch_size=1, embed_dim=24, depth=1, num_heads=2, num_classes=10, in_chans=1)
    torch.manual_seed(0)                                  # the job's init of model 0
    for p in init.parameters():
        torch.nn.init.normal_(p, std=0.05)
    assert max((w - init.state_dict()[k]).abs().max() for k, w in one["models"][0].items()) > 1e-3

    ckpt = tmp_path / "ckpt.pt"                           # killed after epoch 1, resumed on 2 processes
    killed = torchrun(job, "digits", str(tmp_path / "k.pt"), "--checkpoint", str(ckpt), "--stop-after", "1")
    assert killed.returncode != 0 and not (tmp_path / "k.pt").exists()
    resumed = torchrun(job, "digits", str(tmp_path / "k.pt"), "--checkpoint", str(ckpt))
    assert resumed.returncode == 0 and "resuming from" in resumed.stdout, resumed.stderr[-3000:]
    for m1, m2 in zip(two["models"], torch.load(tmp_path / "k.pt")["models"]):
        for k, w in m1.items():
            torch.testing.assert_close(m2[k], w, rtol=0, atol=1e-6, msg=k)


def test_analysis_images_span_every_class_through_the_eval_transform(ilsvrc):
    from structinit.data.imagenet import evaluation_images

    m = scan_imagenet(ilsvrc, num_classes=4)
    x = evaluation_images(ilsvrc, m, 4)                      # 8 val images, 2 per class: one of each
    assert x.shape == (4, 3, 224, 224)
    picked = [m["val"][i * 8 // 4][1] for i in range(4)]
    assert picked == [0, 1, 2, 3]
    assert torch.equal(x, evaluation_images(ilsvrc, m, 4))  # no randomness at eval
    assert -1.01 <= x.min() and x.max() <= 1.01                # mean = std = 0.5: [-1, 1]


def test_micro_batches_take_the_same_step_in_less_memory(ilsvrc, capsys, no_gpu):
    """A process's share of the batch in pieces of 3 images, gradients accumulated: the same
    training as all 8 at once, to float noise; each run prints its memory estimate first, for
    the images it has in flight."""
    from structinit.training.streamed import train_streamed

    m = scan_imagenet(ilsvrc, num_classes=4)
    cfg = TrainConfig(epochs=1, batch_size=8, lr=1e-3, warmup_epochs=0, randaugment=None, eval_every=1, seed=1,
                      amp="off")   # fp32: compared to float noise
    runs = []
    for micro in (None, 3):
        torch.manual_seed(0)
        model = create_vit(img_size=224, patch_size=16, embed_dim=24, depth=1, num_heads=2, num_classes=4, in_chans=3)
        train, test = imagenet_datasets(ilsvrc, m, cfg, cfg.seed)
        history = train_streamed(model, train, test, cfg, workers=0, micro_batch=micro, progress=False)
        runs.append((model.state_dict(), history))
        estimate = [line for line in capsys.readouterr().out.splitlines() if line.startswith("memory estimate")]
        assert len(estimate) == 1 and f"(1 model(s) x {micro or 8} images per pass)" in estimate[0], estimate
    (whole, h1), (pieces, h2) = runs
    for k, w in whole.items():
        torch.testing.assert_close(pieces[k], w, rtol=0, atol=1e-6, msg=k)
    assert abs(h1[0]["train_loss"] - h2[0]["train_loss"]) < 1e-6 and h1[0]["train_acc"] == h2[0]["train_acc"]
    with pytest.raises(ValueError, match="micro_batch=0: give a positive number"):
        train_streamed(model, train, test, cfg, micro_batch=0)


def test_batchnorm_models_are_refused_on_several_processes(digits, no_gpu):
    from structinit.models import create_convmixer
    from structinit.training.streamed import train_streamed
    from structinit.training.trainer import train_models

    model = create_convmixer(dim=16, depth=1, kernel_size=3, patch_size=1, num_classes=10, in_chans=1)
    with pytest.raises(ValueError, match="ConvMixer has BatchNorm: on 2 processes each would normalize"):
        train_models([model], digits, [TrainConfig(epochs=1, batch_size=64)], ctx=DistributedContext(2, 0))
    with pytest.raises(ValueError, match="ConvMixer has BatchNorm: on 2 processes each would normalize"):
        train_streamed(model, None, None, TrainConfig(epochs=1, batch_size=64), ctx=DistributedContext(2, 0))
