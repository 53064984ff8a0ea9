"""The memory estimate printed before a cell trains (structinit/training/memory.py)."""
import pytest
import torch

import structinit as si
from conftest import small_vit
from structinit.training.memory import estimate_training_memory, saved_activation_bytes
from structinit.training.trainer import train_models


def test_saved_activations_are_counted_once_per_storage():
    """Linear(10, 20) -> ReLU -> Linear(20, 5) -> cross-entropy on 4 images saves, besides the
    weights (the state's): the input (4x10), ReLU's output (4x20, shared by ReLU's backward and
    the second Linear's: once), log-softmax's output (4x5), the targets (4 int64) and the
    loss's total weight (one fp32 scalar)."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 5))
    got = saved_activation_bytes(mlp, torch.randn(4, 1, 2, 5), "fp32")
    assert got == 4 * (10 + 20 + 5) * 4 + 4 * 8 + 4


def test_the_estimate_scales_with_images_in_flight_and_models(digits):
    model = small_vit()
    sample = torch.randn(8, 1, 8, 8)
    one = estimate_training_memory([model], sample, batch=64, micro_batch=None, dtype="fp32")
    three = estimate_training_memory([model] * 3, sample, batch=64, micro_batch=None, dtype="fp32")
    micro = estimate_training_memory([model] * 3, sample, batch=64, micro_batch=16, dtype="fp32")
    assert three.activation_bytes == pytest.approx(3 * one.activation_bytes, rel=1e-6)
    assert micro.activation_bytes == pytest.approx(three.activation_bytes / 4, rel=1e-6)
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert three.state_bytes == 3 * 5 * weights                  # no buffers in a ViT
    assert three.micro_batch_to_fit(three.total_bytes) == 64
    assert 1 <= three.micro_batch_to_fit(three.state_bytes + three.activation_bytes // 2) <= 32
    assert three.micro_batch_to_fit(three.state_bytes // 2) is None


def test_the_probe_leaves_batchnorm_statistics_alone():
    cm = si.create_convmixer(16, 2, 3, 1, 10, in_chans=1, filter_mode="impulse", seed=0)
    before = {k: v.clone() for k, v in cm.state_dict().items()}
    assert saved_activation_bytes(cm, torch.randn(4, 1, 8, 8), "fp32") > 0
    for k, v in cm.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_the_trainer_prints_the_estimate_before_the_first_epoch(digits, capsys):
    cfg = si.TrainConfig(epochs=1, batch_size=32, warmup_epochs=0, randaugment=None, hflip=False, amp="off")
    train_models([small_vit(), small_vit()], digits, [cfg, si.TrainConfig(**{**cfg.__dict__, "seed": 1})],
                 device="cpu", train_indices=torch.arange(64))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("memory estimate"))
    assert "2 model(s) x 32 images per pass" in line
    assert out.index("memory estimate") < out.index("epoch 1/1")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the estimate is checked against its peak")
def test_the_estimate_is_within_a_factor_of_the_measured_cuda_peak(digits):
    """On a GPU: 3 stacked digits ViTs, batch 64, one epoch; the peak torch allocated lies
    between half and twice the estimate (transients are not counted, nor the allocator's cache)."""
    cfgs = [si.TrainConfig(epochs=1, batch_size=64, warmup_epochs=0, randaugment=None, hflip=False, seed=s)
            for s in range(3)]
    models = [small_vit() for _ in cfgs]
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    train_models(models, digits, cfgs, device="cuda", progress=False)
    peak = torch.cuda.max_memory_allocated() - base
    sample = ((digits.train_images[:8].float() / 255) - 0.3) / 0.37
    estimate = estimate_training_memory(models, sample, batch=64, micro_batch=None, dtype="bf16",
                                        data_bytes=digits.train_images.nbytes + digits.test_images.nbytes)
    assert 0.5 * estimate.total_bytes <= peak <= 2 * estimate.total_bytes, (peak, estimate.describe())


def test_the_probe_runs_the_trainers_attention_kernel_and_restores_the_random_state():
    """Explicit attention saves its attention maps, the fused kernel does not: the probe takes
    the trainer's choice. And the probe leaves the random state as it found it."""
    model = small_vit()
    x = torch.randn(4, 1, 8, 8)
    state = torch.get_rng_state()
    explicit = saved_activation_bytes(model, x, "fp32", fused_attention=False)
    fused = saved_activation_bytes(model, x, "fp32", fused_attention=True)
    assert torch.equal(torch.get_rng_state(), state)
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    maps = len(model.blocks) * 4 * model.blocks[0].attn.num_heads * tokens * tokens * 4   # fp32 (B, H, T, T)
    assert 0.9 * maps <= explicit - fused <= 1.5 * maps     # explicit keeps each block's attention maps
