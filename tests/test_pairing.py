"""The premise of the paired statistics: at one seed, the arms of the main table share every
weight their initializer does not set, and see the same data in the same order, so a
difference between two arms at one seed is the initializer's alone (reports: paired by seed).
"""
import pytest
import torch

import structinit as si
from conftest import small_vit
from structinit.training.trainer import BatchAugmentation

C = 48


def _state(init: str, seed: int, **kw) -> dict:
    model = small_vit()
    si.initialize(model, init, seed=seed, **kw)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _differing(a: dict, b: dict) -> set[str]:
    return {k for k in a if not torch.equal(a[k], b[k])}


# What each arm sets on top of Trunc Normal (the rest must be Trunc Normal's, bit for bit).
QK = {f"blocks.{i}.attn.qkv.weight" for i in range(3)}
PROJ = {f"blocks.{i}.attn.proj.weight" for i in range(3)}


@pytest.mark.parametrize("init, kw, sets", [
    ("impulse", {"kernel": 3}, QK),
    ("impulse", {"kernel": 5}, QK),
    ("mimetic", {}, QK | PROJ),
    ("mimetic_qk", {}, QK),
])
def test_arms_share_every_weight_their_init_does_not_set(init, kw, sets):
    base, arm = _state("trunc_normal", 1), _state(init, 1, **kw)
    assert _differing(base, arm) == sets
    if init != "mimetic":                  # Q/K rows only: V (the last C rows) is Trunc Normal's
        for key in QK:
            assert torch.equal(arm[key][2 * C:], base[key][2 * C:])
    assert _differing(_state("trunc_normal", 1), _state("trunc_normal", 2))   # and seeds do differ


def test_kaiming_and_trunc_normal_share_what_trunc_normal_leaves_alone():
    """Kaiming Uniform is PyTorch's defaults; Trunc Normal re-draws the Linear layers over them."""
    kaiming, trunc = _state("kaiming_uniform", 1), _state("trunc_normal", 1)
    model = small_vit()
    linear = {f"{n}.{p}" for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
              for p in ("weight", "bias")}
    shared = set(kaiming) - linear
    assert shared and not _differing({k: kaiming[k] for k in shared}, {k: trunc[k] for k in shared})


def test_arms_at_one_seed_see_the_same_batches(monkeypatch, digits):
    """The data order and augmentation draw depend on the seed alone, not on the initializer."""
    seen = []
    real = BatchAugmentation.augment

    def record(self, x_uint8, gens):                 # every model's batch side by side
        seen.append(x_uint8.clone().view(len(gens), -1, *x_uint8.shape[1:]))
        return real(self, x_uint8, gens)
    monkeypatch.setattr(BatchAugmentation, "augment", record)
    arms = [("trunc_normal", 0), ("mimetic", 0), ("trunc_normal", 1)]
    models = []
    for init, seed in arms:
        models.append(small_vit())
        si.initialize(models[-1], init, seed=seed)
    cfg = dict(epochs=2, batch_size=64, warmup_epochs=0, randaugment=None, hflip=False, amp="off",
               cpu_chunks=1)
    si.train_models(models, digits, [si.TrainConfig(**cfg, seed=s) for _, s in arms], device="cpu",
                    train_indices=torch.arange(256), progress=False)
    per_model = [[x[i] for x in seen] for i in range(len(arms))]   # each step draws every model's batch
    assert len(per_model[0]) == 2 * (256 // 64)
    assert all(torch.equal(a, b) for a, b in zip(per_model[0], per_model[1]))      # same seed
    assert not all(torch.equal(a, c) for a, c in zip(per_model[0], per_model[2]))  # another seed
