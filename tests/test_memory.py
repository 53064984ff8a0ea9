"""The memory estimate printed before a cell trains (structinit/memory.py)."""
import pytest
import torch

import structinit as si
from conftest import small_vit
from structinit.memory import PeakBytes, estimate_training_memory, simulated_peak_bytes
from structinit.training.trainer import train_models


def test_the_tracker_counts_each_storage_once_and_frees_it():
    """PeakBytes: a view costs nothing, a released tensor gives its bytes back, the peak stays."""
    with PeakBytes() as t:
        a = torch.empty(1000)                       # 4,000 bytes
        b = a.view(10, 100)                         # a view: no new storage
        c = torch.empty(500, dtype=torch.float64)   # 4,000 more
        del c
        d = torch.empty(250)                        # 1,000
    assert (t.peak, t.live) == (8000, 5000), (t.peak, t.live)
    assert b.shape == (10, 100) and d.numel() == 250
    with PeakBytes(block=512) as r:
        e = torch.empty(3)                          # 12 bytes: one 512-byte block on a GPU
    assert r.peak == 512 and e.numel() == 3


def test_the_simulation_on_fake_tensors_matches_a_real_step_on_the_cpu():
    """The estimate's core: the training pass and evaluation simulated on fake tensors peak
    where the same work on real CPU tensors peaks (same ops, same storages)."""
    models = [small_vit(depth=1) for _ in range(2)]
    fake = simulated_peak_bytes(models, (1, 8, 8), images_per_pass=16, eval_batch=32, dtype="fp32", block=1)

    import copy
    from structinit.training.stacked import StackedModels, mean_cross_entropy, set_grads
    torch.manual_seed(0)
    real = [copy.deepcopy(m) for m in models]
    tracker = PeakBytes()
    tracker.hold([*(p for m in real for p in m.parameters())])
    with tracker:
        stack = StackedModels(real).train()
        x, y = torch.randn(2, 16, 1, 8, 8), torch.zeros(2, 16, dtype=torch.long)
        grads, losses, logits = stack.loss_and_grads(x, y, lambda out, t: mean_cross_entropy(out, t, 0.1))
        params = stack.trainable()
        set_grads(params, grads)
        del grads, losses, logits
        stack.clip_grad_norms(1.0)
        opt = torch.optim.AdamW(list(params.values()), lr=1e-3, fused=True)
        opt.step()
        stack.eval()
        with torch.no_grad():
            out = stack(torch.randn(32, 1, 8, 8), shared_input=True)
            torch.nn.functional.cross_entropy(out.float().flatten(0, 1), torch.zeros(64, dtype=torch.long),
                                              reduction="none")
    assert fake == pytest.approx(tracker.peak, rel=0.02), (fake, tracker.peak)


def test_the_estimate_scales_with_images_in_flight_and_models(digits):
    model = small_vit()
    sample = torch.randn(8, 1, 8, 8)
    two = estimate_training_memory([model] * 2, sample, batch=64, micro_batch=None, dtype="fp32", test_images=32)
    three = estimate_training_memory([model] * 3, sample, batch=64, micro_batch=None, dtype="fp32", test_images=32)
    micro = estimate_training_memory([model] * 3, sample, batch=64, micro_batch=16, dtype="fp32", test_images=32)
    # simulated, not scaled: a stack's memory grows with its models (a few shared tensors
    # aside), and micro-batches of 16 hold a quarter of the images in flight
    assert three.activation_bytes == pytest.approx(1.5 * two.activation_bytes, rel=0.1)
    assert three.activation_bytes / 5 < micro.activation_bytes < three.activation_bytes / 2
    weights = sum(p.numel() * 4 for p in model.parameters())
    assert three.state_bytes == 3 * 5 * weights                  # no buffers in a ViT
    assert three.micro_batch_to_fit(three.total_bytes) == 64
    assert 1 <= three.micro_batch_to_fit(three.state_bytes + three.activation_bytes // 2) <= 32
    assert three.micro_batch_to_fit(three.state_bytes // 2) is None


def test_the_estimate_leaves_batchnorm_statistics_and_the_random_state_alone():
    cm = si.create_convmixer(16, 2, 3, 1, 10, in_chans=1, filter_mode="impulse", seed=0)
    before = {k: v.clone() for k, v in cm.state_dict().items()}
    sample = torch.randn(4, 1, 8, 8)
    state = torch.get_rng_state()
    assert estimate_training_memory([cm], sample, batch=4, micro_batch=None,
                                    dtype="fp32").activation_bytes > 0
    assert torch.equal(torch.get_rng_state(), state)
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


def _peak_against_estimate(models, data, cfgs, capsys):
    """(the measured CUDA peak of train_models, the estimate it printed before training)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    train_models(models, data, cfgs, device="cuda", progress=True)
    peak = torch.cuda.max_memory_allocated() - base
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("memory estimate"))
    estimate = float(line.split()[2]) * 2 ** 30          # "memory estimate X.XX GiB: ..."
    return peak, estimate, line


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the estimate is checked against its peak")
def test_the_estimate_bounds_the_measured_cuda_peak_on_digits(digits, capsys):
    """On a GPU: 3 stacked digits ViTs, batch 64, one epoch with its evaluation; the estimate
    the trainer prints is never below the peak torch allocated, and at most 1.25x above it."""
    cfgs = [si.TrainConfig(epochs=1, batch_size=64, warmup_epochs=0, randaugment=None, hflip=False, seed=s)
            for s in range(3)]
    peak, estimate, line = _peak_against_estimate([small_vit() for _ in cfgs], digits, cfgs, capsys)
    # the printed figure has 2 decimals of a GiB: allow its rounding
    assert peak <= estimate + 0.005 * 2 ** 30 and estimate <= 1.25 * peak + 0.005 * 2 ** 30, (peak, line)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: the estimate is checked against its peak")
def test_the_estimate_bounds_the_measured_cuda_peak_on_vit_t2(capsys):
    """The paper's CIFAR cell shape: ViT-T/2, batch 512, its recipe (RandAugment, flips), one
    model, on synthetic CIFAR-shaped data (the peak is one step's and one evaluation's)."""
    from structinit.data.specs import get_spec
    from structinit.data.tensors import ImageData
    from structinit.pipeline.build import build_model
    from structinit.pipeline.load import load_params

    p = load_params()
    spec = get_spec("cifar10")
    g = torch.Generator().manual_seed(0)
    data = ImageData(spec, torch.randint(0, 256, (2048, 3, 32, 32), dtype=torch.uint8, generator=g),
                     torch.randint(0, 10, (2048,), generator=g),
                     torch.randint(0, 256, (1024, 3, 32, 32), dtype=torch.uint8, generator=g),
                     torch.randint(0, 10, (1024,), generator=g))
    cfg = si.TrainConfig(**{**p["recipes"]["cifar10"]["train"], "epochs": 1, "warmup_epochs": 0})
    peak, estimate, line = _peak_against_estimate([build_model(p["recipes"]["cifar10"]["model"], spec)],
                                                  data, [cfg], capsys)
    assert peak <= estimate + 0.005 * 2 ** 30 and estimate <= 1.25 * peak + 0.005 * 2 ** 30, (peak, line)


def test_the_estimate_runs_the_trainers_attention_kernel():
    """Explicit attention keeps each block's attention maps for the backward, the fused kernel
    does not: the estimate takes the trainer's choice."""
    model = small_vit()
    x = torch.randn(4, 1, 8, 8)
    explicit, fused = (estimate_training_memory([model], x, batch=64, micro_batch=None, dtype="fp32",
                                                fused_attention=f, device_type="cpu").activation_bytes
                       for f in (False, True))
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    maps = len(model.blocks) * 64 * model.blocks[0].attn.num_heads * tokens * tokens * 4   # fp32 (B, H, T, T)
    assert 0.9 * maps <= explicit - fused <= 6 * maps     # the maps kept, and their gradients in the backward


def test_the_estimate_calls_nothing_deprecated_and_warns_nothing():
    """The estimate deep-copies fake models (the stack's batched copy): torch's own deepcopy of
    a FakeTensor reads its data pointer, deprecated ("Accessing the data pointer of FakeTensor
    is deprecated"), a warning every training stage printed. memory.deepcopied_as_fake copies them
    as torch does without it: no warning, and the same figures (tests above)."""
    import warnings

    from structinit.memory import training_flops_per_image

    sample = torch.randn(8, 1, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for models in ([small_vit()], [small_vit(), small_vit()]):
            for device_type in ("cpu", "cuda"):
                estimate_training_memory(models, sample, batch=32, micro_batch=None, dtype="bf16",
                                         test_images=64, device_type=device_type)
        estimate_training_memory([small_vit()] * 3, sample, batch=32, micro_batch=8, dtype="fp32", test_images=64)
        cm = si.create_convmixer(16, 2, 3, 1, 10, in_chans=1, filter_mode="impulse", seed=0)
        estimate_training_memory([cm, cm], sample, batch=4, micro_batch=None, dtype="fp32", test_images=8)
        assert training_flops_per_image(small_vit(), (1, 8, 8)) > 0
