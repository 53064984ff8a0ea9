"""End to end: ImageNet-1K cells of the real pipeline, read from a tiny ILSVRC folder of JPEGs,
each cell trained on two processes (DDP, gloo) as STRUCTINIT_NPROC asks."""
import json

import yaml

from ilsvrc_files import write_ilsvrc
from test_pipeline import set_params, sh, tiny_repo_copy


def test_imagenet_cells_train_from_a_local_folder_on_two_processes(tmp_path, monkeypatch):
    root = tmp_path / "ILSVRC"
    write_ilsvrc(root, classes=1000, per_class=(1, 1), size=(12, 10))     # 1,000 wnids: the real count
    repo = tiny_repo_copy(tmp_path)
    set_params(repo, **{"grid.streamed_datasets": ["imagenet"],     # beside digits (not run here)
                        "local_datasets.imagenet": str(root),
                        "local_datasets.imagenet_require_full": False,
                        "data.train_size": None, "grid.kernels": [3], "init.kernel": 3, "grid.seeds": [0],
                        "recipes.imagenet.model.embed_dim": 24, "recipes.imagenet.model.depth": 1,
                        "recipes.imagenet.train.epochs": 1, "recipes.imagenet.train.warmup_epochs": 0,
                        "recipes.imagenet.train.batch_size": 100})
    sh(repo, "git", "commit", "-qam", "imagenet")
    monkeypatch.setenv("STRUCTINIT_NPROC", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")      # two gloo processes on the CPU, on any machine
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("STRUCTINIT_ALLOW_CPU", "1")      # ImageNet's recipe is a GPU recipe
    cells = ("train_streamed_baseline@imagenet-trunc_normal", "train_streamed_impulse@imagenet-3")
    analysis = "analyze_streamed_baseline@imagenet-trunc_normal"   # the attention stages read ImageNet too
    run = sh(repo, "dvc", "repro", *cells, analysis)
    out = run.stdout + run.stderr
    assert "1000 train / 1000 val images" in out                       # the manifest stage
    assert "STRUCTINIT_ALLOW_CPU=1: training imagenet's GPU recipe on the CPU" in out
    assert out.count("running under torchrun") == 2                    # both training cells
    assert (repo / "artifacts/analysis/imagenet-trunc_normal/seed0.pt").exists()
    for cell in ("imagenet-trunc_normal", "imagenet-impulse3"):
        for seed in (0,):
            metrics = json.loads((repo / f"results/train/{cell}/seed{seed}/metrics.json").read_text())
            assert 0 <= metrics["final_test_acc"] <= 1 and metrics["step"] == 0
            assert (repo / f"models/{cell}/seed{seed}.pt").exists()
    # the process count is how a cell ran, not what it is: not in dvc.lock, and a plain
    # (one-process) dvc repro has nothing to do
    lock = (repo / "dvc.lock").read_text()
    assert "NPROC" not in lock and "torchrun" not in lock
    # the folder's path is the manifest stage's parameter only: the cells depend on the manifest
    stages = yaml.safe_load(lock)["stages"]
    # (and check_params', which reads the whole file: its output is the same line for any path)
    assert [name for name, entry in stages.items() if str(root) in yaml.safe_dump(entry)] == [
        "check_params", "download_streamed@imagenet"]
    monkeypatch.delenv("STRUCTINIT_NPROC")
    again = sh(repo, "dvc", "repro", *cells, analysis)
    assert "Running stage" not in again.stdout
