"""The CPU chunked step: same gradients as the full batch, refused where it would change the math."""
import pytest
import torch
import torch.nn.functional as F
from timm.layers import DropPath

import structinit as si
from conftest import small_vit
from structinit.training.trainer import BatchAugmentation
from structinit.training.stacked import ChunkedGradients, Objective, WholeBatchGradients, plan_cpu_chunks, StackedModels

CPU = torch.device("cpu")


def _batch(digits, n=64):
    cfg = si.TrainConfig(randaugment=None)
    return BatchAugmentation(digits, cfg, CPU).normalize(digits.train_images[:n]), digits.train_labels[:n]


def test_chunked_gradient_is_the_full_batch_gradient(digits):
    """Two stacked models, each batch of 60 split into 3 chunks of 20: each model's gradient,
    loss sum and correct count are those of its full batch."""
    models = [small_vit(), small_vit()]
    for seed, model in enumerate(models):
        si.initialize(model, "impulse", seed=seed)
    x, y = _batch(digits, 120)
    x, y = x.view(2, 60, *x.shape[1:]), y.view(2, 60)
    cfg = si.TrainConfig(label_smoothing=0.1, amp="off")   # fp32: compared to float noise
    stack = StackedModels(models)
    objective = Objective(stack, cfg, CPU, "fp32")
    full, losses, logits = objective(stack, x, y)
    assert "pos_embed" not in full                               # frozen: no gradient
    with ChunkedGradients(stack, 3, objective) as chunked:
        loss_sum, correct = chunked.collect(chunked.submit(x, y))
    torch.testing.assert_close(loss_sum, losses * 60, rtol=1e-5, atol=1e-5)
    whole = WholeBatchGradients(stack, objective)   # the same interface
    whole_sum, whole_correct = whole.collect(whole.submit(x, y))
    torch.testing.assert_close(whole_sum, loss_sum, rtol=1e-5, atol=1e-5)
    assert whole_correct.tolist() == correct.tolist()
    assert correct.tolist() == (logits.argmax(-1) == y).sum(1).tolist()
    for n, p in stack.trainable().items():
        torch.testing.assert_close(p.grad, full[n], rtol=1e-4, atol=1e-6, msg=n)
    # and the gradient is each model's own, as .backward() on that model alone gives it
    F.cross_entropy(models[1](x[1]), y[1], label_smoothing=0.1).backward()
    for n, p in models[1].named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(stack.in_model_layout(n, stack.trainable()[n].grad[1]), p.grad,
                                       rtol=1e-4, atol=1e-6, msg=n)


def test_chunked_training_tracks_the_unchunked_run(digits):
    """Two optimizer steps: the weights agree to float noise, not just "both trained"."""
    models = []
    for chunks in (1, 2):
        model = small_vit()
        si.initialize(model, "trunc_normal", seed=0)
        cfg = si.TrainConfig(epochs=1, batch_size=64, warmup_epochs=0, lr=1e-3, randaugment=None,
                             hflip=False, cpu_chunks=chunks)
        si.train_model(model, digits, cfg, device="cpu", train_indices=torch.arange(128), progress=False)
        models.append(model)
    init = small_vit()
    si.initialize(init, "trunc_normal", seed=0)
    moved = max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), init.parameters()))
    assert moved > 1e-4                                       # the steps did move the weights
    # Adam (eps 1e-3) turns float noise in near-zero gradients into visible update noise:
    # the runs agree to a few % of how far the weights moved, not to rounding error.
    apart = max((a - b).abs().max().item() for a, b in zip(models[0].parameters(), models[1].parameters()))
    assert apart < 0.05 * moved, (apart, moved)


def test_auto_uses_one_chunk_per_thread_on_cpu_only():
    model = small_vit()
    torch.set_num_threads(2)
    assert plan_cpu_chunks("auto", model, CPU, 64)[0] == 2
    assert plan_cpu_chunks("auto", model, CPU, 16)[0] == 1    # chunks too small
    assert plan_cpu_chunks("auto", model, torch.device("cuda"), 64)[0] == 1
    assert plan_cpu_chunks(2, model, torch.device("cuda"), 64)[0] == 1   # no error
    torch.set_num_threads(1)
    assert plan_cpu_chunks("auto", model, CPU, 64)[0] == 1


def test_models_whose_forward_couples_samples_are_not_split():
    convmixer = si.create_convmixer(dim=16, depth=1, kernel_size=3, patch_size=1, num_classes=10,
                                    in_chans=1)
    chunks, why = plan_cpu_chunks("auto", convmixer, CPU, 64)
    assert chunks == 1 and "BatchNorm2d" in why
    with pytest.raises(ValueError, match="cpu_chunks=2 .*BatchNorm2d"):
        plan_cpu_chunks(2, convmixer, CPU, 64)
    dropout = small_vit()
    dropout.blocks[1].mlp.drop1.p = 0.1
    chunks, why = plan_cpu_chunks("auto", dropout, CPU, 64)
    assert chunks == 1 and "blocks.1.mlp.drop1 is Dropout(p=0.1)" in why
    drop_path = small_vit()
    drop_path.blocks[0].drop_path1 = DropPath(0.2)
    chunks, why = plan_cpu_chunks("auto", drop_path, CPU, 64)
    assert chunks == 1 and "DropPath(p=0.2)" in why
    assert plan_cpu_chunks("auto", small_vit(), CPU, 64)[0] == 2   # p=0: fine


def test_threads_are_restored_even_when_training_stops_midway(digits):
    torch.set_num_threads(2)

    def stop(metrics):
        raise KeyboardInterrupt

    cfg = si.TrainConfig(epochs=2, batch_size=64, randaugment=None, hflip=False)
    with pytest.raises(KeyboardInterrupt):
        si.train_model(small_vit(), digits, cfg, device="cpu", train_indices=torch.arange(128),
                       progress=False, on_epoch_end=stop)
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("bad", [0, -1, "two", True, 1.5])
def test_bad_cpu_chunks_is_refused(bad):
    with pytest.raises(ValueError, match=f"cpu_chunks={bad!r}"):
        si.TrainConfig(cpu_chunks=bad)
