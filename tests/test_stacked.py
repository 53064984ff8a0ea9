"""Stacked training (structinit/training/stacked.py, train_models): each model as if trained alone."""

import pytest
import torch

import structinit as si
from structinit.models import convmixer
from conftest import small_vit
from structinit.training.stacked import StackedModels, mean_cross_entropy, clip_grad_norm_per_model
from reference import train_plain
from structinit.training.trainer import train_models

# fp32 (amp off): these tests compare stacked, chunked and plain steps to float noise, which
# bf16 (amp=auto's choice on CPUs with native bf16) would drown; test_train.py runs bf16
FAST = dict(batch_size=64, warmup_epochs=1, hflip=False, lr=2e-3, randaugment=None, adam_eps=1e-8,
            eval_every=1, amp="off")
SUBSET = torch.arange(512)


def _vits(seeds, method="trunc_normal"):
    models = []
    for seed in seeds:
        models.append(small_vit())
        si.initialize(models[-1], method, seed=seed)
    return models


def _convmixers(seeds):
    return [si.create_convmixer(16, 2, 3, 1, 10, in_chans=1, filter_mode="impulse", seed=s) for s in seeds]


def test_stacked_forward_is_each_models_forward():
    models = _vits([0, 1, 2])
    x = torch.randn(3, 8, 1, 8, 8)
    out = StackedModels(models)(x)
    assert out.shape == (3, 8, 10)
    for i, m in enumerate(models):
        torch.testing.assert_close(out[i], m(x[i]), atol=1e-5, rtol=1e-5)
    shared = StackedModels(models)(x[0], shared_input=True)
    torch.testing.assert_close(shared[2], models[2](x[0]), atol=1e-5, rtol=1e-5)


def test_batchnorm_statistics_stay_per_model():
    """ConvMixer's BatchNorm in training mode: each model normalizes by its own batch and
    updates its own running statistics, as alone."""
    models = _convmixers([0, 1])
    stack = StackedModels(models)
    x = torch.randn(2, 8, 1, 8, 8)
    out = stack(x)
    alone = [m(x[i]) for i, m in enumerate(models)]           # updates each module's stats
    for i, m in enumerate(models):
        torch.testing.assert_close(out[i], alone[i], atol=1e-5, rtol=1e-5)
        mine = stack.state_dict_of(i)
        for k, v in m.state_dict().items():
            torch.testing.assert_close(mine[k].to(v.dtype), v, atol=1e-6, rtol=1e-5, msg=k)


def test_clipping_is_torchs_clip_for_each_model():
    torch.manual_seed(0)
    models = _vits([0, 1])
    stack = StackedModels(models)
    params = list(stack.trainable().values())
    assert len(params) == len([p for p in models[0].parameters() if p.requires_grad])
    for p in params:
        p.grad = torch.randn_like(p) * torch.tensor([0.01, 10.0]).view(-1, *[1] * (p.ndim - 1))
    per_model = [[p.grad[i].clone() for p in params] for i in range(2)]
    norms = clip_grad_norm_per_model(params, max_norm=3.0)
    for i in range(2):
        alone = [torch.nn.Parameter(torch.zeros_like(g)) for g in per_model[i]]
        for p, g in zip(alone, per_model[i]):
            p.grad = g
        norm = torch.nn.utils.clip_grad_norm_(alone, 3.0)
        torch.testing.assert_close(norms[i], norm)
        for p, q in zip(params, alone):
            torch.testing.assert_close(p.grad[i], q.grad)
    assert norms[0] < 3 < norms[1]                  # one model clipped, the other not


def _curves(histories):
    """Each history's per-epoch (train loss, test loss, test accuracy), flattened."""
    return [[v for h in hist for v in (h["train_loss"], h["test_loss"], h["test_acc"])] for hist in histories]


def test_two_seeds_stacked_train_as_each_alone(digits):
    """The curves and weights of seeds 0 and 1 trained as one stacked model equal those of
    each trained alone, to float noise; and the two seeds really differ."""
    cfgs = [si.TrainConfig(epochs=3, seed=s, **FAST) for s in (0, 1)]
    together = _vits([0, 1])
    stacked = train_models(together, digits, cfgs, device="cpu", train_indices=SUBSET, progress=False)
    for i, seed in enumerate((0, 1)):
        alone = _vits([seed])[0]
        hist = si.train_model(alone, digits, cfgs[i], device="cpu", train_indices=SUBSET, progress=False)
        assert _curves([hist])[0] == pytest.approx(_curves([stacked[i]])[0], rel=1e-4, abs=1e-4)
        for k, v in alone.state_dict().items():
            torch.testing.assert_close(together[i].state_dict()[k], v, atol=1e-4, rtol=1e-4, msg=k)
    assert stacked[0][-1]["train_loss"] != stacked[1][-1]["train_loss"]
    assert stacked[1][-1]["train_loss"] < stacked[1][0]["train_loss"]


def test_trainer_matches_a_plain_training_loop(digits):
    """train_models on one model == the reference trainer (reference.py: the textbook loop,
    timm's module as it is, torch's clip and AdamW), to float noise, with the paper's clip and
    label smoothing active."""
    cfg = si.TrainConfig(epochs=2, seed=3, **{**FAST, "grad_clip": 0.5, "randaugment": "rand-m9-mstd0.5-inc1"})
    a, b = _vits([3, 3])
    plain = train_plain(a, digits, cfg, train_indices=SUBSET)
    ours = train_models([b], digits, [cfg], device="cpu", train_indices=SUBSET, progress=False)[0]
    assert [h["train_loss"] for h in ours] == pytest.approx([h["train_loss"] for h in plain], rel=1e-4)
    for k, v in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[k], v, atol=1e-4, rtol=1e-4, msg=k)


def test_convmixer_seeds_stacked_train_as_alone(digits):
    """BatchNorm and frozen (impulse) filters, stacked: the ConvMixer study's cells."""
    cfgs = [si.TrainConfig(epochs=2, seed=s, **FAST) for s in (0, 1)]
    together = _convmixers([0, 1])
    stacked = train_models(together, digits, cfgs, device="cpu", train_indices=SUBSET, progress=False)
    alone = _convmixers([1])[0]
    hist = si.train_model(alone, digits, cfgs[1], device="cpu", train_indices=SUBSET, progress=False)
    assert _curves([hist])[0] == pytest.approx(_curves([stacked[1]])[0], rel=1e-4, abs=1e-4)
    frozen = convmixer.spatial_filters(alone)[0].weight
    assert not frozen.requires_grad
    assert torch.equal(frozen, convmixer.spatial_filters(_convmixers([1])[0])[0].weight)


class Interrupt(Exception):
    pass


def test_an_interrupted_stack_resumes_from_one_checkpoint_to_the_same_bytes(digits, tmp_path):
    """Every model's state is one file: stopped after epoch 2 (after the write, on model 1's
    report), the resumed stack restores both at the same epoch and ends bitwise where the
    uninterrupted run ends; the restored epochs are reported first."""
    cfgs = [si.TrainConfig(epochs=3, seed=s, **FAST) for s in (0, 1)]
    full = _vits([0, 1])
    expected = train_models(full, digits, cfgs, device="cpu", train_indices=SUBSET, progress=False)
    ckpt = tmp_path / "checkpoint.pt"

    def stop_at(epoch):
        def callback(i, metrics):
            if metrics["epoch"] == epoch and i == 1:
                raise Interrupt
        return callback

    with pytest.raises(Interrupt):
        train_models(_vits([0, 1]), digits, cfgs, device="cpu", train_indices=SUBSET, progress=False,
                     checkpoint_path=ckpt, on_epoch_end=stop_at(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]      # one file, no temp left
    seen = []
    resumed = _vits([0, 1])
    hist = train_models(resumed, digits, cfgs, device="cpu", train_indices=SUBSET, progress=False,
                        checkpoint_path=ckpt, on_epoch_end=lambda i, m: seen.append((i, m["epoch"])))
    assert seen == [(0, 1), (0, 2), (1, 1), (1, 2), (0, 3), (1, 3)]
    assert [[h["train_loss"] for h in x] for x in hist] == [[h["train_loss"] for h in x] for x in expected]
    for model, ref in zip(resumed, full):
        for k, v in ref.state_dict().items():
            assert torch.equal(model.state_dict()[k], v), k


def test_a_checkpoint_of_other_models_is_not_resumed(digits, tmp_path, capsys):
    """The fingerprints of every model must match: the same checkpoint with another seed set
    (or order) is ignored, and the run starts afresh."""
    cfgs = [si.TrainConfig(epochs=2, seed=s, **FAST) for s in (0, 1)]
    ckpt = tmp_path / "checkpoint.pt"
    train_models(_vits([0, 1]), digits, cfgs, device="cpu", train_indices=SUBSET, progress=False,
                 checkpoint_path=ckpt)
    swapped = [si.TrainConfig(epochs=2, seed=s, **FAST) for s in (1, 0)]
    hist = train_models(_vits([1, 0]), digits, swapped, device="cpu", train_indices=SUBSET, progress=True,
                        checkpoint_path=ckpt)
    assert "written for a different configuration" in capsys.readouterr().out
    assert all(len(h) == 2 for h in hist)


def test_what_cannot_stack_is_refused():
    with pytest.raises(ValueError, match="model 1 .* differs from model 0"):
        StackedModels([small_vit(), small_vit(embed_dim=24)])
    with pytest.raises(ValueError, match=r"configs 0 and 1 differ in \['lr'\]"):
        train_models(_vits([0, 1]), None, [si.TrainConfig(lr=1e-3), si.TrainConfig(lr=2e-3)])
    with pytest.raises(ValueError, match="2 models but 1 configs"):
        train_models(_vits([0, 1]), None, [si.TrainConfig()])


def test_fused_attention_only_off_on_cpu():
    """CPU's fused attention kernel has no vmap batching rule (a per-model loop), so the stack
    runs timm's explicit attention there; CUDA's fused kernels have batching rules, so moving
    the stack off the CPU gives timm's own choice back. ("meta" stands in for a GPU here.)"""
    stack = StackedModels(_vits([0, 1]), batched=False)               # the vmap way
    attns = [m for m in stack.base.modules() if hasattr(m, "fused_attn")]
    assert attns and not any(m.fused_attn for m in attns)
    stack.to("meta")
    assert all(m.fused_attn == m.fused_attn_default for m in attns)
    assert all(m.fused_attn for m in attns)              # timm's default on this torch


def test_batched_stack_trains_explicit_attention_only_on_cpu_in_bf16():
    """The batched stack keeps the fused kernel except on CPU in bf16, where its backward is
    several times slower than timm's explicit path; the
    vmap stack is explicit on CPU whatever the dtype. ("meta" stands in for a GPU.)"""
    stack = StackedModels(_vits([0, 1]))
    attns = [m for m in stack.base.modules() if hasattr(m, "fused_attn")]
    assert stack.choose_attention(torch.device("cpu"), "bf16") == "explicit attention"
    assert attns and not any(m.fused_attn for m in attns)
    assert stack.choose_attention(torch.device("cpu"), "fp32") == "fused attention"
    assert all(m.fused_attn for m in attns)
    assert stack.choose_attention(torch.device("meta"), "bf16") == "fused attention"
    assert all(m.fused_attn for m in attns)
    vmapped = StackedModels(_vits([0, 1]), batched=False)
    assert vmapped.choose_attention(torch.device("cpu"), "fp32") == "explicit attention"


def test_explicit_and_fused_attention_give_the_same_gradients():
    """Switching the kernel changes float summation order only: the batched stack's losses and
    gradients agree to float noise (fp32) and to bf16's resolution (bf16 autocast)."""
    torch.manual_seed(0)
    stack = StackedModels(_vits([0, 1], method="impulse"))
    x, y = torch.randn(2, 16, 1, 8, 8), torch.randint(0, 10, (2, 16))

    def loss(logits, labels):
        return mean_cross_entropy(logits, labels)
    for dtype, tol in (("fp32", dict(rtol=1e-5, atol=1e-6)), ("bf16", dict(rtol=0.05, atol=0.01))):
        def ctx(bf16=dtype == "bf16"):
            return torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
        out = {}
        for device in ("cpu", "meta"):                # explicit (bf16 on CPU) / fused otherwise
            stack.choose_attention(torch.device(device), "bf16")
            out[device] = stack.loss_and_grads(x, y, loss, ctx)
        (g1, l1, _), (g2, l2, _) = out["cpu"], out["meta"]
        torch.testing.assert_close(l1, l2, **tol)
        for k in g1:
            torch.testing.assert_close(g1[k], g2[k], **tol)


def test_cuda_attention_kernels_have_vmap_batching_rules():
    """Why fused attention stays on under vmap on CUDA: its kernels have batching rules. With
    vmap's per-example fallback switched off, CUDA's kernels get past vmap (to the CPU backend,
    which cannot run them), while CPU's fused kernel is stopped at vmap: it has no rule."""
    from torch.func import vmap

    q = torch.randn(2, 1, 2, 4, 8)
    torch._C._functorch._set_vmap_fallback_enabled(False)
    try:
        for op in (lambda a: torch.ops.aten._scaled_dot_product_efficient_attention(a, a, a, None, False)[0],
                   lambda a: torch.ops.aten._scaled_dot_product_flash_attention(a, a, a)[0]):
            with pytest.raises(NotImplementedError, match="'CPU' backend"):
                vmap(op)(q)
        with pytest.raises(RuntimeError, match="hit the vmap fallback"):
            vmap(lambda a: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(a, a, a)[0])(q)
    finally:
        torch._C._functorch._set_vmap_fallback_enabled(True)


def test_vits_run_batched_and_batchnorm_models_by_vmap():
    """The project's ViTs take the batched way (timm's module on N*B samples, weights with a
    model axis, fused attention over models x batch x heads); ConvMixer (BatchNorm: per-model
    statistics) takes vmap. Both give each model's own forward."""
    vits = StackedModels(_vits([0, 1]))
    assert vits.batched is not None
    assert all(m.fused_attn for m in vits.base.modules() if hasattr(m, "fused_attn"))   # timm's own choice
    assert vits.params["blocks.0.attn.qkv.weight"].shape == (2, 48, 144)   # held as the GEMM reads it
    assert vits.state_dict_of(1)["blocks.0.attn.qkv.weight"].shape == (144, 48)
    assert StackedModels(_convmixers([0, 1])).batched is None


def test_batched_gradients_are_each_models_own():
    """The batched way's per-model gradients and losses == each model's .backward() alone and
    == the vmap way's, to float noise (fp32)."""
    torch.manual_seed(0)
    models = _vits([0, 1, 2], method="impulse")
    x, y = torch.randn(3, 16, 1, 8, 8), torch.randint(0, 10, (3, 16))
    def loss(logits, labels):
        return mean_cross_entropy(logits, labels, 0.1)
    stack = StackedModels(models)
    grads, losses, logits = stack.loss_and_grads(x, y, loss)
    vgrads, vlosses, vlogits = StackedModels(models, batched=False).loss_and_grads(x, y, loss)
    assert sorted(grads) == sorted(vgrads) and "pos_embed" not in grads
    torch.testing.assert_close(losses, vlosses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logits, vlogits, rtol=1e-5, atol=1e-5)
    for i, m in enumerate(models):
        m.zero_grad()
        loss(m(x[i]), y[i]).backward()
        for name, p in m.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(stack.in_model_layout(name, grads[name][i]), p.grad, rtol=1e-4,
                                           atol=1e-6, msg=name)
                torch.testing.assert_close(vgrads[name][i], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_batched_step_computes_in_bf16_under_autocast():
    """The reason vmap needs functional gradients (autocast stays fp32 for tensors that require
    grad under vmap) does not apply here: with bf16 autocast on the CPU the batched step's
    matmuls run in bf16 (logits come out bf16), and its gradients stay close to fp32's."""
    models = _vits([0, 1])
    x, y = torch.randn(2, 16, 1, 8, 8), torch.randint(0, 10, (2, 16))
    from structinit.training.stacked import Objective
    cpu, stack = torch.device("cpu"), StackedModels(models)
    grads, losses, logits = Objective(stack, si.TrainConfig(), cpu, "bf16")(stack, x, y)
    assert logits.dtype == torch.bfloat16 and losses.dtype == torch.float32
    stack = StackedModels(models)
    fp32, _, _ = Objective(stack, si.TrainConfig(), cpu, "fp32")(stack, x, y)
    for name, g in grads.items():
        assert g.dtype == torch.float32
        rel = (g - fp32[name]).norm() / fp32[name].norm().clamp_min(1e-12)
        assert rel < 0.1, (name, rel.item())


def test_what_has_no_batched_form_falls_back_to_vmap():
    """A frozen tensor that differs between the models (here the position encoding) or a
    trained parameter outside Linear/LayerNorm/Conv2d (a class token) has no batched form."""
    from structinit.training.stacked import why_not_batched
    a, b = _vits([0, 1])
    with torch.no_grad():
        b.pos_embed.add_(1.0)
    assert "pos_embed is frozen but differs" in why_not_batched([a, b])
    assert StackedModels([a, b]).batched is None
    cls = [si.create_vit(img_size=8, patch_size=1, embed_dim=48, depth=1, num_heads=3, num_classes=10,
                         in_chans=1) for _ in range(2)]
    for m in cls:
        m.cls_token = torch.nn.Parameter(torch.zeros(1, 1, 48))
    assert "cls_token" in why_not_batched(cls) and "trains" in why_not_batched(cls)
    # a parameter-free module with batch statistics would mix the models' samples
    coupled = _vits([0, 1])
    for m in coupled:
        m.fc_norm = torch.nn.BatchNorm1d(48, affine=False, track_running_stats=False)
    assert "fc_norm is BatchNorm1d (batch statistics)" in why_not_batched(coupled)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_batched_stack_on_cuda_is_each_models_own():
    """The GPU path: the batched stack on CUDA (fused attention, bf16 autocast as amp=auto
    picks there) against each model alone on the CPU in fp32, to bf16 noise."""
    models = _vits([0, 1])
    x, y = torch.randn(2, 32, 1, 8, 8), torch.randint(0, 10, (2, 32))
    stack = StackedModels(models).to(torch.device("cuda"))
    assert stack.batched is not None
    from structinit.training.stacked import compute_dtype, Objective
    cfg, cuda = si.TrainConfig(amp="auto"), torch.device("cuda")
    grads, losses, logits = Objective(stack, cfg, cuda, compute_dtype(cfg, cuda))(stack, x.cuda(), y.cuda())
    assert logits.dtype == torch.bfloat16
    for i, m in enumerate(models):
        ref = torch.nn.functional.cross_entropy(m(x[i]), y[i], label_smoothing=cfg.label_smoothing)
        assert abs(losses[i].item() - ref.item()) < 0.05


def test_a_checkpoint_of_other_code_is_not_resumed_and_the_resume_line_names_the_code(digits, tmp_path, capsys):
    """The caller's fingerprint carries the code hash (stages/train.py: code_fingerprint):
    stopped after epoch 2, the same code resumes (and says which code), other code starts
    afresh and says that the code is what differs."""
    cfgs = [si.TrainConfig(epochs=3, seed=s, **FAST) for s in (0, 1)]
    ckpt = tmp_path / "checkpoint.pt"

    def stop_at_2(i, metrics):
        if metrics["epoch"] == 2 and i == 1:
            raise Interrupt

    def run(code, callback=None):
        seen = []
        train_models(_vits([0, 1]), digits, cfgs, device="cpu", train_indices=SUBSET, progress=True,
                     checkpoint_path=ckpt, fingerprints=[{"code": code}] * 2,
                     on_epoch_end=callback or (lambda i, m: seen.append((i, m["epoch"]))))
        return seen, capsys.readouterr().out

    with pytest.raises(Interrupt):
        run("c0de", stop_at_2)
    capsys.readouterr()
    seen, out = run("0ther")
    assert "ignoring" in out and "(differs in: code)" in out and "resuming" not in out
    assert seen[:2] == [(0, 1), (1, 1)]               # trained from its first epoch, not restored
    with pytest.raises(Interrupt):
        run("c0de", stop_at_2)
    capsys.readouterr()
    seen, out = run("c0de")
    assert "after epoch 2/3 (code c0de)" in out
    assert seen[:4] == [(0, 1), (0, 2), (1, 1), (1, 2)]   # the restored epochs, reported first


def test_checkpoint_every_s_writes_only_when_due_and_after_the_last_epoch(digits, tmp_path):
    """With an hour between writes, a run stopped after epoch 2 of 3 has written nothing (it
    restarts from epoch 1); an uninterrupted one writes once, after its last epoch."""
    cfgs = [si.TrainConfig(epochs=3, seed=s, **FAST) for s in (0, 1)]
    ckpt = tmp_path / "checkpoint.pt"

    def stop_at_2(i, metrics):
        if metrics["epoch"] == 2 and i == 1:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_models(_vits([0, 1]), digits, cfgs, device="cpu", train_indices=SUBSET, progress=False,
                     checkpoint_path=ckpt, on_epoch_end=stop_at_2, checkpoint_every_s=3600)
    assert not ckpt.exists()
    train_models(_vits([0, 1]), digits, cfgs, device="cpu", train_indices=SUBSET, progress=False,
                 checkpoint_path=ckpt, checkpoint_every_s=3600)
    from structinit.io import load_checked
    assert load_checked(ckpt, "a checkpoint")["epoch"] == 2          # 0-based: the last of 3


def test_micro_batches_are_the_whole_batch_step_to_float_noise():
    """STRUCTINIT_MICRO_BATCH for the stacked trainer: a batch of 64 per model as pieces of 24
    (24, 24, 16, weighted by share) gives the one-pass gradients, losses and counts."""
    from structinit.training.stacked import Objective, plan_gradients
    cfg = si.TrainConfig(seed=0, **FAST)
    x, y = torch.randn(2, 64, 1, 8, 8), torch.randint(0, 10, (2, 64))
    results = []
    for micro in (None, 24):
        stack = StackedModels(_vits([0, 1]))
        objective = Objective(stack, cfg, torch.device("cpu"), "fp32")
        step, how = plan_gradients(1, stack, torch.device("cpu"), 64, objective, micro_batch=micro)
        with step:
            sums = step.collect(step.submit(x, y))
        results.append((sums, {k: p.grad.clone() for k, p in stack.trainable().items()}, how))
    (whole_sums, whole, _), (micro_sums, micro, how) = results
    assert how.startswith("3 micro-batches of <= 24 images per model")
    torch.testing.assert_close(micro_sums[0], whole_sums[0], atol=1e-4, rtol=1e-5)
    assert torch.equal(micro_sums[1], whole_sums[1])
    assert whole.keys() == micro.keys()
    for k in whole:
        torch.testing.assert_close(micro[k], whole[k], atol=1e-6, rtol=1e-4)


def test_micro_batches_are_refused_where_they_change_the_step():
    from structinit.training.stacked import plan_gradients
    stack = StackedModels(_convmixers([0, 1]))
    with pytest.raises(ValueError, match=r"micro-batches of 8 images .*BatchNorm2d.*STRUCTINIT_MICRO_BATCH"):
        plan_gradients(1, stack, torch.device("cpu"), 64, lambda *a: None, micro_batch=8)


def test_a_seed_trains_the_same_alone_on_timms_module_and_in_a_stack(digits):
    """One model trains on timm's own module (the plain way), several stacked: seed 0's
    weights and metrics do not depend on which, beyond float noise (fp32, 2 epochs)."""
    cfgs = [si.TrainConfig(epochs=2, seed=s, **{**FAST, "amp": "off", "cpu_chunks": 1}) for s in (0, 1)]
    alone, stacked = _vits([0]), _vits([0, 1])
    assert StackedModels(alone).way == "plain" and StackedModels(stacked).way == "batched"
    h_alone = si.train_models(alone, digits, cfgs[:1], device="cpu", train_indices=torch.arange(256),
                              progress=False)[0]
    h_stacked = si.train_models(stacked, digits, cfgs, device="cpu", train_indices=torch.arange(256),
                                progress=False)[0]
    for k, v in alone[0].state_dict().items():
        torch.testing.assert_close(stacked[0].state_dict()[k], v, rtol=1e-4, atol=1e-5, msg=k)
    for a, b in zip(h_alone, h_stacked):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        # other kernels (addmm / baddbmm) may flip a borderline test image on another CPU
        assert abs(a["test_acc"] - b["test_acc"]) <= 2 / len(digits.test_labels)
