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


def test_without_a_gpu_it_stops_and_says_how_long_the_cpu_would_take(monkeypatch, tmp_path):
    monkeypatch.setattr("structinit.training.common.default_device", lambda: torch.device("cpu"))
    monkeypatch.setattr("structinit.pipeline.estimate.training_time_line", lambda *a, **k: "ABOUT 3 days")
    with pytest.raises(SystemExit, match="no GPU: this is a GPU measurement. ABOUT 3 days"):
        tool.main(["--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())
