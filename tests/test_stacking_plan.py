"""Which way a cell's seeds train (memory.plan_stacking) and what the way changes.

On a GPU a model whose step fills the card (the paper's ViT-T/2 at batch 512) trains its
seeds one after another on timm's own module, as does a stack whose memory estimate does not
fit; small models stack. The plan's CUDA branch is checked here with the card's properties
faked (it reads only their memory size; the estimate runs on fake tensors). The sequential
way itself runs on the CPU by forcing the plan: each seed's numbers are the stacked run's to
float noise, and each model keeps its own checkpoint file."""
import types

import pytest
import torch
import yaml
from pathlib import Path

import structinit as si
from conftest import small_vit
from structinit.data.specs import get_spec
from structinit.pipeline.build import build_model
from structinit.io import load_checked
from structinit.training import trainer
from structinit.memory import plan_stacking

ROOT = Path(__file__).resolve().parents[1]
RECIPES = yaml.safe_load((ROOT / "params.yaml").read_text())["recipes"]
CUDA = torch.device("cuda")


def shaped(dataset: str, n_train: int, n_test: int = 8):
    """What plan_stacking reads of a dataset: its images' shape and count (zeros)."""
    spec = get_spec(dataset)
    shape = (spec.channels, spec.image_size, spec.image_size)
    return types.SimpleNamespace(train_images=torch.zeros(n_train, *shape, dtype=torch.uint8),
                                 train_labels=torch.zeros(n_train, dtype=torch.long),
                                 test_images=torch.zeros(n_test, *shape, dtype=torch.uint8),
                                 test_labels=torch.zeros(n_test, dtype=torch.long))


@pytest.fixture
def gpu_of(monkeypatch):
    """A fake CUDA card of the given memory (GiB), bf16-capable."""
    def fake(gib: float):
        props = types.SimpleNamespace(total_memory=int(gib * 2 ** 30), name="fake")
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    return fake


def recipe(dataset: str) -> si.TrainConfig:
    return si.TrainConfig(**RECIPES[dataset]["train"])


def test_the_cpu_stacks():
    models = [small_vit(), small_vit()]
    assert plan_stacking(models, shaped("digits", 64), recipe("digits"), torch.device("cpu"), "bf16") == (
        True, "stacked on the CPU")


def test_a_model_that_fills_the_gpu_trains_its_seeds_one_after_another(gpu_of):
    gpu_of(80)
    spec = get_spec("cifar10")
    models = [build_model(RECIPES["cifar10"]["model"], spec) for _ in range(2)]
    together, why = plan_stacking(models, shaped("cifar10", 1024), recipe("cifar10"), CUDA, "bf16")
    assert not together
    assert "TFLOP, enough to fill the GPU" in why


def test_small_models_stack_on_a_gpu_unless_the_stack_does_not_fit(gpu_of):
    spec = get_spec("digits")
    models = [build_model(RECIPES["digits"]["model"], spec) for _ in range(5)]
    data, cfg = shaped("digits", 1437, 360), recipe("digits")
    gpu_of(80)
    together, why = plan_stacking(models, data, cfg, CUDA, "bf16")
    assert together and "the seeds stack" in why
    gpu_of(0.1)                            # a stack of 5 digits ViTs needs more than 0.09 GiB
    together, why = plan_stacking(models, data, cfg, CUDA, "bf16")
    assert not together
    assert "the stack of 5 needs about" in why and "of the GPU's 0.1 GiB" in why


def test_seeds_one_after_another_train_as_stacked_with_a_checkpoint_each(digits, tmp_path, monkeypatch, capsys):
    """The sequential way forced on the CPU: seed i's curve and weights are the stacked run's
    to float noise (fp32), the log says which way and why, and each model wrote its own
    checkpoint file (the cell's one file is the stacked way's)."""
    cfgs = [si.TrainConfig(epochs=2, seed=s, batch_size=64, warmup_epochs=1, hflip=False, randaugment=None,
                           amp="off", cpu_chunks=1) for s in (0, 1)]

    def vits():
        models = [small_vit() for _ in range(2)]
        for seed, m in enumerate(models):
            si.initialize(m, "trunc_normal", seed=seed)
        return models
    subset = torch.arange(256)
    stacked_models = vits()
    stacked = si.train_models(stacked_models, digits, cfgs, device="cpu", train_indices=subset, progress=False)
    monkeypatch.setattr(trainer, "plan_stacking", lambda *a, **k: (False, "forced by the test"))
    apart_models = vits()
    apart = si.train_models(apart_models, digits, cfgs, device="cpu", train_indices=subset, progress=True,
                            checkpoint_path=tmp_path / "checkpoint.pt")
    assert "training the 2 models one after another: forced by the test" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-model0.pt", "checkpoint-model1.pt"]
    for a, b in zip(stacked, apart):
        assert [h["train_loss"] for h in a] == pytest.approx([h["train_loss"] for h in b], rel=1e-4)
    for ma, mb in zip(stacked_models, apart_models):
        for k, v in ma.state_dict().items():
            torch.testing.assert_close(mb.state_dict()[k], v, rtol=1e-4, atol=1e-5, msg=k)
    assert stacked[0][-1]["train_loss"] != stacked[1][-1]["train_loss"]


def test_a_stacks_checkpoint_holds_each_models_optimizer_state_in_the_models_layout(digits, tmp_path):
    """The batched Linear weights are held transposed in a stack; their AdamW moments are
    written as the model's own parameters are laid out, so a checkpoint reads the same
    whichever way its models trained."""
    cfgs = [si.TrainConfig(epochs=1, seed=s, batch_size=64, warmup_epochs=0, hflip=False, randaugment=None,
                           amp="off") for s in (0, 1)]
    models = [small_vit(), small_vit()]
    si.train_models(models, digits, cfgs, device="cpu", train_indices=torch.arange(128), progress=False,
                    checkpoint_path=tmp_path / "checkpoint.pt")
    saved = load_checked(tmp_path / "checkpoint.pt", "checkpoint")
    shapes = {k: tuple(p.shape) for k, p in models[0].named_parameters()}
    linear = [k for k in shapes if len(shapes[k]) == 2 and shapes[k][0] != shapes[k][1]]
    assert linear, shapes                                  # non-square weights: a transpose would show
    for entry in saved["models"]:
        for moment in ("exp_avg", "exp_avg_sq"):
            held = entry["optimizer"][moment]
            assert {k: tuple(v.shape) for k, v in held.items()} == {k: shapes[k] for k in held}
