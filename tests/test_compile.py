"""torch.compile of the training step (on by default on CUDA, off on the CPU): checked on the
CPU, where inductor compiles as well. The stacked forward and loss must trace as one graph
(a graph break splits the step and re-enters Python mid-step), and compiled steps must train
as eager ones do, to float noise."""
import functools

import pytest
import torch

import structinit as si
from conftest import small_vit
from structinit.training.stacked import autocast, StackedModels, mean_cross_entropy, GUARDED_CALLS, Objective

CPU = torch.device("cpu")


@pytest.mark.parametrize("n_models", [1, 3])
def test_the_stacked_forward_and_loss_trace_without_a_graph_break(n_models):
    """One model (timm's own module) and a batched stack of three, bf16 autocast as on a GPU."""
    torch.manual_seed(0)
    stack = StackedModels([small_vit() for _ in range(n_models)]).train()
    assert stack.way == ("plain" if n_models == 1 else "batched")
    x, y = torch.randn(n_models, 8, 1, 8, 8), torch.randint(0, 10, (n_models, 8))
    loss_fn = functools.partial(mean_cross_entropy, label_smoothing=0.1)
    explanation = torch._dynamo.explain(stack.forward_and_loss)(x, y, loss_fn, functools.partial(autocast, CPU, "bf16"))
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_compile_is_off_on_the_cpu_unless_asked(monkeypatch):
    stack = StackedModels([small_vit(), small_vit()])
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: asked.append(kw) or fn)
    assert Objective(stack, si.TrainConfig(), CPU, "fp32").how == "" and asked == []
    assert Objective(stack, si.TrainConfig(compile="on"), CPU, "fp32").how == "compiled (default mode)"
    assert asked == [{"mode": None}]
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


@pytest.mark.parametrize("chunks", [1, 4])
def test_a_failing_compile_warns_once_and_trains_eager(monkeypatch, digits, capsys, chunks):
    """A machine where compiling fails (no compiler, an unsupported op) trains eager after a
    one-line warning, never a crash; once, also where a step's chunks call it from threads."""
    def broken(fn, **kw):
        def run(*a, **k):
            raise RuntimeError("no C++ compiler found\nmore detail")
        return run
    monkeypatch.setattr(torch, "compile", broken)
    cfg = si.TrainConfig(epochs=2, batch_size=32, warmup_epochs=0, randaugment=None, hflip=False, amp="off",
                         cpu_chunks=chunks, compile="on")
    history = si.train_models([small_vit()], digits, [cfg], device="cpu", train_indices=torch.arange(64))[0]
    out = capsys.readouterr().out
    assert chunks == 1 or f"{chunks} chunks of" in out, out           # the step really ran in threads
    warnings = [line for line in out.splitlines() if line.startswith("warning: torch.compile failed")]
    assert warnings == ["warning: torch.compile failed (RuntimeError: no C++ compiler found); training eager "
                        "(compile: off in the recipe skips the attempt)"], out
    assert len(history) == 2 and all(h["train_loss"] == h["train_loss"] for h in history)
    # the next cell of this process (a cell's seeds trained one after another) does not try again
    assert Objective(StackedModels([small_vit()]), cfg, CPU, "fp32").how == \
        "eager (torch.compile failed earlier in this process)"


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("CUDA graph capture failed: operation not permitted when stream is capturing")


@pytest.mark.parametrize("failing_call", [1, 2])
def test_a_compile_that_fails_in_the_backward_or_a_later_capture_trains_eager(monkeypatch, digits, capsys,
                                                                                failing_call):
    """What torch.compile returns may fail after the forward ran: in the compiled backward,
    or on the call where a CUDA graph is recorded (the second or third). Each falls back with
    the one-line warning, the failed call re-run eager, and the run's losses are the eager
    run's."""
    def eager_run():
        cfg = si.TrainConfig(epochs=2, batch_size=32, warmup_epochs=0, randaugment=None, hflip=False, amp="off",
                             cpu_chunks=1, compile="off")
        torch.manual_seed(0)
        return si.train_models([small_vit()], digits, [cfg], device="cpu", train_indices=torch.arange(64),
                               progress=False)[0]
    expected = eager_run()

    def flaky(fn, **kw):
        calls = []

        def run(*a, **k):
            calls.append(1)
            losses, logits = fn(*a, **k)
            if len(calls) == failing_call:                 # this call's backward fails
                losses = _FailingBackward.apply(losses)
            return losses, logits
        return run
    monkeypatch.setattr(torch, "compile", flaky)
    cfg = si.TrainConfig(epochs=2, batch_size=32, warmup_epochs=0, randaugment=None, hflip=False, amp="off",
                         cpu_chunks=1, compile="on")
    torch.manual_seed(0)
    history = si.train_models([small_vit()], digits, [cfg], device="cpu", train_indices=torch.arange(64))[0]
    out = capsys.readouterr().out
    warnings = [line for line in out.splitlines() if line.startswith("warning: torch.compile failed")]
    assert warnings == ["warning: torch.compile failed (RuntimeError: CUDA graph capture failed: operation not "
                        "permitted when stream is capturing); training eager (compile: off in the recipe skips "
                        "the attempt)"], out
    assert [h["train_loss"] for h in history] == pytest.approx([h["train_loss"] for h in expected], rel=1e-5)


def test_a_failure_after_the_guarded_calls_is_raised(monkeypatch):
    """Past the first GUARDED_CALLS calls a compiled step that fails is an error in the step,
    not in compiling: it is raised, not hidden behind an eager fallback."""
    stack = StackedModels([small_vit()]).train()
    calls = []

    def compiled(fn, **kw):
        def run(*a, **k):
            calls.append(1)
            if len(calls) > GUARDED_CALLS:
                raise RuntimeError("an illegal memory access was encountered")
            return fn(*a, **k)
        return run
    monkeypatch.setattr(torch, "compile", compiled)
    objective = Objective(stack, si.TrainConfig(compile="on"), CPU, "fp32")
    x, y = torch.randn(1, 4, 1, 8, 8), torch.randint(0, 10, (1, 4))
    for _ in range(GUARDED_CALLS):
        objective(stack, x, y)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        objective(stack, x, y)
