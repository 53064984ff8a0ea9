"""Fault injection, for real: damaged files, pickled objects, a diverging run, and a training
stage killed with SIGKILL in the middle of `dvc repro` (the next `dvc repro` resumes and gives
the same bytes). Bad parameters: tests/test_params.py."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import structinit as si
from structinit.io import CorruptFileError, load_checked, save_checked, without_timings
from structinit.training.trainer import NonFiniteLossError
from tests.conftest import small_vit
from tests.test_pipeline import REPO, set_params, sh, tiny_repo_copy


class Evil:
    """Unpickling this would run code (here, harmless: print)."""
    def __reduce__(self):
        return (print, ("this ran on load",))


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _flip_tensor_byte(path: Path) -> None:
    """Flip one byte inside the largest tensor record (the zip keeps no checksum torch checks)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    data[start + info.file_size // 2] ^= 0x40
    path.write_bytes(bytes(data))


def _pickled_object(path: Path) -> None:
    torch.save({"structinit_sha256": "0", "content": Evil()}, path)


DAMAGE = {"truncated": _truncate, "flipped byte": _flip_tensor_byte, "pickled object": _pickled_object}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_prepared_dataset_is_detected(tmp_path, digits, damage, capsys):
    path = tmp_path / "digits.pt"
    digits.save(path)
    assert torch.equal(si.ImageData.load(path).train_images, digits.train_images)
    DAMAGE[damage](path)
    with pytest.raises(CorruptFileError, match=f"{path}.*(truncated|corrupted|pickled)"):
        si.ImageData.load(path)
    assert "this ran on load" not in capsys.readouterr().out


def test_a_prepared_dataset_with_wrong_content_is_detected(tmp_path, digits):
    bad = si.ImageData(digits.spec, digits.train_images.float(), digits.train_labels,
                       digits.test_images, digits.test_labels)
    bad.save(tmp_path / "d.pt")
    with pytest.raises(CorruptFileError, match="train images are torch.float32"):
        si.ImageData.load(tmp_path / "d.pt")
    bad = si.ImageData(digits.spec, digits.train_images, digits.train_labels + 5,
                       digits.test_images, digits.test_labels)
    bad.save(tmp_path / "d.pt")
    with pytest.raises(CorruptFileError, match=r"labels span 5..14, expected 0..9"):
        si.ImageData.load(tmp_path / "d.pt")


def test_a_pickled_object_is_refused_with_a_clear_message(tmp_path, capsys):
    torch.save({"q": torch.ones(2), "why": Evil()}, tmp_path / "x.pt")
    with pytest.raises(CorruptFileError, match="holds a pickled Python object.*could run code"):
        load_checked(tmp_path / "x.pt", "a pre-optimization artifact")
    assert "this ran on load" not in capsys.readouterr().out
    # the plain torch.load the project used before would have run it
    torch.load(tmp_path / "x.pt", weights_only=False)
    assert "this ran on load" in capsys.readouterr().out


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_checkpoint_is_discarded_not_resumed(tmp_path, digits, damage, capsys):
    """Two epochs with a checkpoint; damage it; the resumed run starts afresh (and ends where
    an uninterrupted run ends) instead of loading it."""
    cfg = si.TrainConfig(epochs=2, batch_size=64, warmup_epochs=1, randaugment=None, hflip=False)
    idx = torch.arange(256)
    ckpt = tmp_path / "ckpt.pt"
    ref = small_vit(embed_dim=24, depth=1)
    si.initialize(ref, "trunc_normal", seed=0)
    hist_ref = si.train_model(ref, digits, cfg, device="cpu", train_indices=idx, progress=False)

    def stop_after_first(metrics):
        if metrics["epoch"] == 1:
            raise KeyboardInterrupt
    m = small_vit(embed_dim=24, depth=1)
    si.initialize(m, "trunc_normal", seed=0)
    with pytest.raises(KeyboardInterrupt):
        si.train_model(m, digits, cfg, device="cpu", train_indices=idx, checkpoint_path=ckpt,
                       on_epoch_end=stop_after_first, progress=False)
    DAMAGE[damage](ckpt)
    m = small_vit(embed_dim=24, depth=1)
    si.initialize(m, "trunc_normal", seed=0)
    hist = si.train_model(m, digits, cfg, device="cpu", train_indices=idx, checkpoint_path=ckpt,
                          progress=False)
    out = capsys.readouterr().out
    assert "discarding an unusable checkpoint" in out and "resuming" not in out
    assert "this ran on load" not in out
    assert (tmp_path / "ckpt.pt.corrupt").exists()
    assert [h["train_loss"] for h in hist] == [h["train_loss"] for h in hist_ref]
    for (name, a), b in zip(m.state_dict().items(), ref.state_dict().values()):
        assert torch.equal(a, b), name


def test_a_nan_loss_stops_the_cell_naming_epoch_and_step(tmp_path, digits):
    """lr 1e30 blows the weights up after the first step: the run stops at the first
    non-finite loss, and no checkpoint of the broken epoch is written."""
    cfg = si.TrainConfig(epochs=3, batch_size=32, lr=1e30, min_lr=0.0, warmup_epochs=0,
                         randaugment=None, hflip=False)
    m = small_vit(embed_dim=24, depth=1)
    si.initialize(m, "trunc_normal", seed=0)
    with pytest.raises(NonFiniteLossError, match=r"seed 0 became NaN or inf at epoch 1, step \d+ of 8"):
        si.train_model(m, digits, cfg, device="cpu", train_indices=torch.arange(256),
                       checkpoint_path=tmp_path / "c.pt", progress=False)
    assert not (tmp_path / "c.pt").exists()


def test_a_damaged_preopt_artifact_fails_the_stage_in_one_line(tmp_path):
    """The training stage, given a pickled-object solution, refuses it (status 1, one line,
    nothing run); the same for a truncated one."""
    sol = si.solve_impulse_qk((8, 8), 24, 3, 1, kernel=3, seed=0)
    (tmp_path / "sol").mkdir()
    save_checked(tmp_path / "sol/seed0.pt", without_timings(sol.to_dict()))
    data = tmp_path / "digits.pt"
    si.prepare_dataset("digits").save(data)
    for damage in ("pickled object", "truncated"):
        DAMAGE[damage](tmp_path / "sol/seed0.pt")
        r = subprocess.run(
            [sys.executable, "-m", "stages.train", "--dataset", "digits", "--init", "impulse3",
             "--seeds-from", "grid.seeds", "--solutions", str(tmp_path / "sol"),
             "--data", str(data), "--out", str(tmp_path / "out"), "--model-out", str(tmp_path / "m")],
            cwd=REPO, capture_output=True, text=True, env=dict(os.environ, STRUCTINIT_CKPT_DIR=str(tmp_path / "ck")))
        assert r.returncode == 1, r.stderr[-2000:]
        err = r.stderr.strip().splitlines()
        assert err[-1].startswith("error: ") and str(tmp_path / "sol/seed0.pt") in err[-1], r.stderr
        assert "Traceback" not in r.stderr and "preoptimize@digits-3" in err[-1], r.stderr
        assert "this ran on load" not in r.stdout
        save_checked(tmp_path / "sol/seed0.pt", without_timings(sol.to_dict()))


def _outputs(repo: Path, cell: str) -> dict:
    files = sorted((repo / "results/train" / cell).rglob("*")) + sorted((repo / "models" / cell).rglob("*"))
    return {str(f.relative_to(repo)): f.read_bytes() for f in files if f.is_file()}


def test_kill_9_mid_cell_then_dvc_repro_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    """SIGKILL the whole `dvc repro` (DVC and the stage) once a seed has checkpointed an epoch;
    the next `dvc repro` resumes from the checkpoints (naming the code it matched) and ends with
    the same bytes as an uninterrupted run. Then again, with the checkpoint damaged before the
    re-run; then with STRUCTINIT_RESTART=1, which discards a sound checkpoint."""
    monkeypatch.setenv("STRUCTINIT_CHECKPOINT_SECONDS", "0")       # a checkpoint every epoch
    repo = tiny_repo_copy(tmp_path)
    set_params(repo, **{"recipes.digits.train.epochs": 12, "recipes.digits.train.eval_every": 4})
    sh(repo, "git", "commit", "-qam", "longer")
    cell, stage = "digits-trunc_normal", "train_baseline@digits-trunc_normal"
    sh(repo, "dvc", "repro", stage)
    reference = _outputs(repo, cell)
    assert len(reference) > 4
    # one file holds every seed's state (a kill can never leave two seeds at different
    # epochs: test_a_kill_in_the_middle_of_a_checkpoint_write_loses_nothing)
    ckpt = repo / ".ckpt/train" / cell / "checkpoint.pt"

    def kill_mid_run(damage=None):
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   DVC_NO_ANALYTICS="1", STRUCTINIT_CKPT_DIR=str(repo / ".ckpt"))
        proc = subprocess.Popen(["dvc", "repro", "-f", "--single-item", stage], cwd=repo, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.time() + 120
        while not ckpt.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert ckpt.exists() and proc.poll() is None, "the stage ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert not (repo / "models" / cell / "seed0.pt").exists()     # killed before the end
        if damage:
            DAMAGE[damage](ckpt)
        return sh(repo, "dvc", "repro", stage)

    resumed = kill_mid_run()
    assert re.search(r"resuming from \S+ after epoch \d+/12 \(code [0-9a-f]{16}\)", resumed.stdout), resumed.stdout
    assert _outputs(repo, cell) == reference
    restarted = kill_mid_run(damage="flipped byte")
    assert "discarding an unusable checkpoint" in restarted.stdout
    assert _outputs(repo, cell) == reference
    monkeypatch.setenv("STRUCTINIT_RESTART", "1")
    fresh = kill_mid_run()
    assert f"STRUCTINIT_RESTART=1: discarded {ckpt}" in fresh.stdout and "resuming" not in fresh.stdout
    assert _outputs(repo, cell) == reference


KILLED_MID_WRITE = """
import hashlib, os, sys
import torch
import structinit as si
import structinit.training.checkpoint as checkpoint_module
from structinit.data.tensors import prepare_dataset
from structinit.models import create_vit

ckpt, die_at = sys.argv[1], int(sys.argv[2])
real_save = checkpoint_module.save_checked

def save_then_die(path, state):
    # the kill lands inside the write of epoch `die_at`: seed 0's state is serialized, seed 1's
    # not yet (the moment that, with one file per seed, left the seeds an epoch apart)
    if die_at and state["epoch"] + 1 == die_at:
        tmp = str(path) + ".tmp"
        torch.save({"fingerprints": state["fingerprints"], "models": state["models"][:1]}, tmp)
        os._exit(137)
    real_save(path, state)

checkpoint_module.save_checked = save_then_die
cfgs = [si.TrainConfig(epochs=3, batch_size=64, warmup_epochs=1, randaugment=None, hflip=False, seed=s)
        for s in (0, 1)]
models = []
for s in (0, 1):
    models.append(create_vit(img_size=8, patch_size=1, embed_dim=24, depth=1, num_heads=2, num_classes=10,
                             in_chans=1))
    si.initialize(models[-1], "trunc_normal", seed=s)
hists = si.train_models(models, prepare_dataset("digits"), cfgs, device="cpu", train_indices=torch.arange(256),
                        checkpoint_path=ckpt if ckpt != "-" else None, progress=True)
digest = hashlib.sha256()
for m in models:
    for name, t in m.state_dict().items():
        digest.update(name.encode() + t.contiguous().numpy().tobytes())
digest.update(repr([h["train_loss"] for hist in hists for h in hist]).encode())
print("DIGEST", digest.hexdigest())
"""


def test_a_kill_in_the_middle_of_a_checkpoint_write_loses_nothing(tmp_path):
    """An injected exit (not a race) in the middle of epoch 2's checkpoint write, after the
    first seed's state and before the second's: the next run resumes both seeds from epoch 1
    and ends with the uninterrupted run's bytes."""
    def run(*args):
        return subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, *args], cwd=REPO,
                              capture_output=True, text=True)

    reference = run("-", "0")
    assert reference.returncode == 0, reference.stderr[-2000:]
    ckpt = tmp_path / "checkpoint.pt"
    killed = run(str(ckpt), "2")
    assert killed.returncode == 137, killed.stderr[-2000:]
    assert ckpt.exists() and (tmp_path / "checkpoint.pt.tmp").exists()      # epoch 1's, and the torn write
    resumed = run(str(ckpt), "0")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from" in resumed.stdout and "after epoch 1/3" in resumed.stdout
    digest = [ln for ln in resumed.stdout.splitlines() if ln.startswith("DIGEST")]
    assert digest == [ln for ln in reference.stdout.splitlines() if ln.startswith("DIGEST")]
