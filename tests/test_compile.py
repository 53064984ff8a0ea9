"""torch.compile of the training step (on by default on CUDA, off on the CPU): checked on the
CPU, where inductor compiles as well. The stacked forward and loss must trace as one graph
(a graph break splits the step and re-enters Python mid-step), and compiled steps must train
as eager ones do, to float noise."""
import functools

import pytest
import torch

import structinit as si
from conftest import small_vit
from structinit.training.common import autocast
from structinit.training.stacked import StackedModels, mean_cross_entropy
from structinit.training.trainer import step_forward

CPU = torch.device("cpu")


@pytest.mark.parametrize("n_models", [1, 3])
def test_the_stacked_forward_and_loss_trace_without_a_graph_break(n_models):
    """One model (timm's own module) and a batched stack of three, bf16 autocast as on a GPU."""
    torch.manual_seed(0)
    stack = StackedModels([small_vit() for _ in range(n_models)]).train()
    assert stack.way == ("plain" if n_models == 1 else "batched")
    cfg = si.TrainConfig(amp="bf16")
    x, y = torch.randn(n_models, 8, 1, 8, 8), torch.randint(0, 10, (n_models, 8))
    loss_fn = functools.partial(mean_cross_entropy, label_smoothing=0.1)
    explanation = torch._dynamo.explain(stack.forward_and_loss)(x, y, loss_fn, functools.partial(autocast, cfg, CPU))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compile_is_off_on_the_cpu_unless_asked():
    stack = StackedModels([small_vit(), small_vit()])
    assert step_forward(stack, si.TrainConfig(), CPU) == (None, "")
    forward, how = step_forward(stack, si.TrainConfig(compile="on"), CPU)
    assert forward is not None and how == "compiled (default mode)"
    with pytest.raises(ValueError, match="compile='yes'; choose one of"):
        si.TrainConfig(compile="yes")


def test_compiled_steps_train_as_eager_ones_do(digits, capsys):
    """Three epochs of a stack of two, fp32: compiled and eager give the same losses and
    weights to float noise (inductor fuses ops, so sums may round differently). The compiled
    run must really be compiled: a fallback to eager (its warning) would compare eager with
    eager."""
    def run(compile):
        models = [small_vit() for _ in range(2)]
        for seed, m in enumerate(models):
            si.initialize(m, "trunc_normal", seed=seed)
        cfgs = [si.TrainConfig(epochs=3, batch_size=32, warmup_epochs=1, randaugment=None, hflip=False, amp="off",
                               cpu_chunks=1, compile=compile, seed=s) for s in range(2)]
        histories = si.train_models(models, digits, cfgs, device="cpu", train_indices=torch.arange(128),
                                    progress=False)
        return histories, models
    (eager, eager_models), (compiled, compiled_models) = run("off"), run("on")
    assert "torch.compile failed" not in capsys.readouterr().out
    for he, hc in zip(eager, compiled):
        for a, b in zip(he, hc):
            assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    for me, mc in zip(eager_models, compiled_models):
        for k, v in me.state_dict().items():
            torch.testing.assert_close(mc.state_dict()[k], v, rtol=1e-3, atol=1e-4, msg=k)


def test_a_failing_compile_warns_once_and_trains_eager(monkeypatch, digits, capsys):
    """A machine where compiling fails (no compiler, an unsupported op) trains eager after a
    one-line warning, never a crash."""
    def broken(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("no C++ compiler found\nmore detail")
        return run
    monkeypatch.setattr(torch, "compile", broken)
    cfg = si.TrainConfig(epochs=2, batch_size=32, warmup_epochs=0, randaugment=None, hflip=False, amp="off",
                         cpu_chunks=1, compile="on")
    history = si.train_models([small_vit()], digits, [cfg], device="cpu", train_indices=torch.arange(64))[0]
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning: torch.compile failed")]
    assert warnings == ["warning: torch.compile failed (RuntimeError: no C++ compiler found); training eager "
                        "(compile: off in the recipe skips the attempt)"], out
    assert len(history) == 2 and all(h["train_loss"] == h["train_loss"] for h in history)
