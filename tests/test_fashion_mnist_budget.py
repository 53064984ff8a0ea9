"""tools/fashion_mnist.py: Fashion-MNIST's budget at B and 2B on a validation split (never the
test set), resumable, with the grid's time from the B run; tiny on the CPU."""
import pandas as pd
import pytest
import torch

from structinit.data.specs import get_spec
from structinit.data.tensors import ImageData, validation_split
from tools import fashion_mnist as tool


def test_the_validation_split_is_held_out_of_the_training_set_and_stratified():
    spec = get_spec("fashion_mnist")
    labels = torch.arange(200) % 10
    images = torch.arange(200, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 28, 28).contiguous()
    data = ImageData(spec, images, labels, images[:5], labels[:5])
    split = validation_split(data, 50, seed=0)
    train_ids, val_ids = set(split.train_images[:, 0, 0, 0].tolist()), set(split.test_images[:, 0, 0, 0].tolist())
    assert len(val_ids) == 50 and len(train_ids) == 150 and not train_ids & val_ids
    assert split.test_labels.bincount().tolist() == [5] * 10                       # stratified
    assert torch.equal(validation_split(data, 50, seed=0).test_images, split.test_images)   # seeded
    assert not torch.equal(validation_split(data, 50, seed=1).test_images, split.test_images)


def test_tiny_budget_run_reports_and_resumes(tmp_path, monkeypatch, capsys):
    assert tool.main(["--tiny", "--out", str(tmp_path)]) == 0
    curves = pd.read_csv(tmp_path / "epochs.csv")
    from structinit.pipeline.load import load_params
    arms = tool.arms(load_params(tool.REPO / "params.yaml"))
    assert sorted(curves.init.unique()) == sorted(arms)
    assert sorted(curves.budget.unique()) == [1, 2]
    # every arm, budget and seed; evaluated every epoch at these budgets (1 + 2 epochs)
    assert len(curves) == len(arms) * tool.TINY["seeds"] * 3
    report = (tmp_path / "epochs.md").read_text()
    assert "tiny (CPU): not a measurement" in report and "validation split of 32 held out" in report
    assert "Doubling 1 epochs moves" in report and ("is converged" in report or "is NOT converged" in report)
    assert "The main grid's cells at 1 epochs" in report
    # a second run trains nothing it has: each (arm, budget) is in epochs.csv already
    monkeypatch.setattr("structinit.evidence.epoch_budget.run_budget",
                        lambda *a, **k: pytest.fail("trained again what the first run finished"))
    capsys.readouterr()
    assert tool.main(["--tiny", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("already") == len(arms) * 2
    # ... and never mixes in rows of another recipe: the file's rows carry theirs
    frame = pd.read_csv(tmp_path / "epochs.csv")
    frame.assign(recipe="0123456789ab").to_csv(tmp_path / "epochs.csv", index=False)
    with pytest.raises(SystemExit, match="holds runs of another recipe"):
        tool.main(["--tiny", "--out", str(tmp_path)])


def test_without_a_gpu_it_stops_and_says_how_long_the_cpu_would_take(monkeypatch, tmp_path):
    monkeypatch.setattr("structinit.training.trainer.default_device", lambda: torch.device("cpu"))
    monkeypatch.setattr("structinit.pipeline.estimate.training_time_line", lambda *a, **k: "ABOUT 3 days")
    with pytest.raises(SystemExit, match="no GPU: this is a GPU measurement. ABOUT 3 days"):
        tool.main(["--budget", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_without_a_gpu_the_grid_stops_before_touching_params(tmp_path, monkeypatch):
    monkeypatch.setattr(tool.torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("STRUCTINIT_ALLOW_CPU", raising=False)
    (tmp_path / "params.yaml").write_text("grid:\n  gpu_datasets: []\n")
    for argv in (["--grid", "--root", str(tmp_path)], ["--root", str(tmp_path)]):   # the grid alone, or both
        with pytest.raises(SystemExit, match="no GPU: the grid's stages train on a GPU"):
            tool.main(argv)
    assert (tmp_path / "params.yaml").read_text() == "grid:\n  gpu_datasets: []\n"


def test_a_grid_that_fails_leaves_params_and_dvc_yaml_as_they_were(tmp_path, monkeypatch):
    """A frozen stage without its outputs would stop every later `dvc repro`: a failed run takes
    fashion_mnist off grid.gpu_datasets again, and dvc.yaml is frozen whatever happened."""
    from structinit.pipeline import scratch

    copy = scratch.copy_working_tree(tmp_path / "repo")
    before = {f: (copy / f).read_text() for f in ("params.yaml", "dvc.yaml")}
    seen = []

    def failing_dvc(root, *args, **kw):
        seen.append(((root / "dvc.yaml").read_text().count("frozen: false"),
                     "- fashion_mnist" in (root / "params.yaml").read_text()))
        return 1

    monkeypatch.setattr(scratch, "run_dvc", failing_dvc)
    monkeypatch.setenv("STRUCTINIT_ALLOW_CPU", "1")
    assert tool.run_grid(copy) == 1
    assert seen == [(4, True)]                       # ran with the 4 GPU stages unfrozen, the dataset listed
    assert {f: (copy / f).read_text() for f in before} == before


def test_listing_the_dataset_edits_exactly_its_two_lists_in_params_yaml(tmp_path):
    from structinit.pipeline.load import load_params

    path = tmp_path / "params.yaml"
    path.write_text((tool.REPO / "params.yaml").read_text())
    before = path.read_text().splitlines()
    assert tool.list_as_gpu_dataset(path) is True
    after = path.read_text().splitlines()
    added = [line for line in after if line not in before]
    assert [line.strip() for line in added if line.strip().startswith("-")] == ["- fashion_mnist"] * 2
    assert len(after) == len(before) + 2
    p = load_params(path)
    assert p["grid"]["gpu_datasets"] == p["studies"]["data_size"]["gpu"]["datasets"] == ["fashion_mnist"]
    assert {k: v for k, v in p.items() if k not in ("grid", "studies")} == {
        k: v for k, v in load_params(tool.REPO / "params.yaml").items() if k not in ("grid", "studies")}
    assert tool.list_as_gpu_dataset(path) is False and path.read_text().splitlines() == after


def test_a_tiny_budget_needs_its_own_folder():
    with pytest.raises(SystemExit):
        tool.main(["--tiny"])


def test_the_main_grid_alone_runs_its_cells_one_by_one_the_primary_pair_first(tmp_path, monkeypatch):
    """--grid --main-only: one `dvc repro` per cell, Imp.-<init.kernel> and Trunc Normal first (a
    run cut short by --timeout has the pair the paper's claim needs), no data-size stage, and
    only grid.gpu_datasets lists the dataset; each stage's seconds are in the written file."""
    from structinit.pipeline.load import load_params
    from structinit.pipeline import scratch

    copy = scratch.copy_working_tree(tmp_path / "repo")
    targets, timeouts = [], []

    def dvc(root, *args, timeout=None, **kw):
        targets.append(args[-1])
        timeouts.append(timeout)
        return 0

    monkeypatch.setattr(scratch, "run_dvc", dvc)
    monkeypatch.setenv("STRUCTINIT_ALLOW_CPU", "1")
    assert tool.run_grid(copy, timeout=300, main_only=True) == 0
    p = load_params(copy / "params.yaml")
    assert targets[:2] == [f"train_gpu_impulse@fashion_mnist-{p['init']['kernel']}",
                           "train_gpu_baseline@fashion_mnist-trunc_normal"]
    # then the cells' analysis, where their weights are
    assert targets[-1] == "analyze_gpu@fashion_mnist"
    targets = targets[:-1]
    assert len(targets) == len(set(targets)) == len(tool.arms(p)) and not any("study" in t for t in targets)
    assert all(0 < t <= 300 for t in timeouts) and timeouts == sorted(timeouts, reverse=True)
    assert p["grid"]["gpu_datasets"] == ["fashion_mnist"] and p["studies"]["data_size"]["gpu"]["datasets"] == []
    report = next((copy / "benchmarks").glob("fashion_mnist_grid-*.md")).read_text()
    listed = [line.split("|")[1].split()[0] for line in report.splitlines() if line.startswith("| train_gpu")]
    assert listed == targets                                              # the stage table, in the order run


def test_a_grid_cut_short_keeps_its_finished_cells_and_prices_the_rest(tmp_path, monkeypatch):
    """The call's window ends inside a cell (as on the H200 at 17f4fe7): the finished cells'
    accuracies and seconds are written, split by the stage's own marks; a cell DVC skipped as up
    to date is marked so (its logs are an older run's) and left out of the price; the cut one is
    marked and its running metrics (no final_test_acc yet) read as unfinished; the whole grid is
    priced from the cells trained in this run, labelled an extrapolation; params.yaml is as it was."""
    import json
    import os

    from structinit.pipeline.cells import main_stage
    from structinit.pipeline.load import load_params
    from structinit.pipeline import scratch

    copy = scratch.copy_working_tree(tmp_path / "repo")
    before = (copy / "params.yaml").read_text()
    p = load_params(copy / "params.yaml")
    p["grid"]["gpu_datasets"] = ["fashion_mnist"]                        # as the run lists it
    cells = {main_stage("train", "fashion_mnist", i, p): f"results/train/fashion_mnist-{i}" for i in tool.arms(p)}
    ran = []

    def write_logs(root, cell, acc):
        logs = root / "logs/timings" / cell
        logs.mkdir(parents=True, exist_ok=True)
        (logs / "phases.json").write_text(json.dumps({"seconds_since_start": {
            "imported": 8.0, "data": 9.0, "built": 10.0, "training": 12.0, "trained": 165.0, "saved": 167.0}}))
        for seed in range(5):
            (root / cell / f"seed{seed}").mkdir(parents=True, exist_ok=True)
            (root / cell / f"seed{seed}/metrics.json").write_text(json.dumps({"final_test_acc": acc}))
            (logs / f"seed{seed}.json").write_text(json.dumps({"epochs": [{"seconds": 100.0}, {"seconds": 50.0}]}))

    # Trunc Normal trained in an earlier run: DVC finds it up to date and runs nothing
    write_logs(copy, cells["train_gpu_baseline@fashion_mnist-trunc_normal"], 0.855)
    old = copy / "logs/timings" / cells["train_gpu_baseline@fashion_mnist-trunc_normal"] / "phases.json"
    os.utime(old, (1e9, 1e9))

    def dvc(root, *args, timeout=None, **kw):
        target = args[-1]
        ran.append(target)
        if "trunc_normal" in target:
            return 0                                                      # up to date
        if len(ran) == 4:                                                 # dvclive's running metrics, then the kill
            for seed in range(5):
                (root / cells[target] / f"seed{seed}").mkdir(parents=True, exist_ok=True)
                (root / cells[target] / f"seed{seed}/metrics.json").write_text(json.dumps({"step": 4}))
            return scratch.TIMED_OUT
        write_logs(root, cells[target], 0.875 - 0.01 * len(ran))
        return 0

    monkeypatch.setattr(scratch, "run_dvc", dvc)
    monkeypatch.setenv("STRUCTINIT_ALLOW_CPU", "1")
    assert tool.run_grid(copy, timeout=300, main_only=True) == scratch.TIMED_OUT
    assert len(ran) == 4 and (copy / "params.yaml").read_text() == before
    report = next((copy / "benchmarks").glob("fashion_mnist_grid-*.md")).read_text()
    lines = report.splitlines()

    def row(target):
        line = next(line for line in lines if line.startswith(f"| {target}"))
        return [c.strip() for c in line.strip("|").split("|")]

    assert row(ran[0])[0] == ran[0] and row(ran[0])[2:6] == ["12.0", "153.0", "150.0", "2.0"]
    assert row(ran[1])[0].endswith("(up to date: not run)") and row(ran[1])[2:] == ["-"] * 5
    assert row(ran[3])[0].endswith("(cut short)") and row(ran[3])[2:] == ["-"] * 5
    assert "2 of the main grid's 6 cells trained to the end" in report and "extrapolation" in report
    assert "86.50" in report and "85.50" in report and "84.50" in report   # impulse3, trunc_normal, kaiming


def test_the_grid_always_analyses_and_retrains_a_cell_whose_weights_are_not_here(tmp_path):
    """tools.fashion_mnist.forced: the analysis runs every time (-f -s: its deps are its code, so
    DVC would call it up to date after the cells were retrained); a main cell DVC holds up to
    date but whose weights are not on this machine (they are never committed) trains again."""
    cells_of = {"train_gpu_impulse@fashion_mnist-3": "results/train/fashion_mnist-impulse3"}
    params = {"grid": {"seeds": [0, 1]}}
    assert tool.forced(tmp_path, "analyze_gpu@fashion_mnist", cells_of, params) == ("-f", "-s")
    assert tool.forced(tmp_path, "train_gpu_impulse@fashion_mnist-3", cells_of, params) == ("-f",)
    weights = tmp_path / "models/gpu/fashion_mnist-impulse3"
    weights.mkdir(parents=True)
    (weights / "seed0.pt").write_bytes(b"w")
    assert tool.forced(tmp_path, "train_gpu_impulse@fashion_mnist-3", cells_of, params) == ("-f",)   # one seed short
    (weights / "seed1.pt").write_bytes(b"w")
    assert tool.forced(tmp_path, "train_gpu_impulse@fashion_mnist-3", cells_of, params) == ()
    assert tool.forced(tmp_path, "study_data_size_gpu@fashion_mnist-0.05-impulse3", cells_of, params) == ()
