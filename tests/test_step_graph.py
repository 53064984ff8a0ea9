"""StepGraph: the whole training step as one CUDA graph. Its numbers are tested here on the CPU
through the same code with the graph switched off (capture=False); its capture and replay, which
need a GPU, are tested for their order (warm-up steps, one capture, then replays only) and their
fallback with torch.cuda's graph calls stood in for."""
import contextlib
import copy
import dataclasses
import functools
import pytest
import torch

import structinit as si
from conftest import small_vit
from structinit.distributed import DistributedContext
from structinit.training import step as step_module
from structinit.training.batches import BatchAugmentation
from structinit.training.checkpoint import stacked_adamw
from structinit.training.common import lr_at
from structinit.training.stacked import StackedModels
from structinit.training.step import (WARMUP_STEPS, Objective, StepGraph, WholeBatchGradients, plan_step_graph,
                                      train_step)

CPU = torch.device("cpu")
CUDA = torch.device("cuda", 0)
STEPS = WARMUP_STEPS + 3


def stack_and_optimizer(models, cfg, graphed=False):
    stack = StackedModels(models).train()
    opt = stacked_adamw(stack, [None] * len(models), cfg, CPU)
    gradients = WholeBatchGradients(stack, Objective(stack, cfg, CPU, "fp32", graphed=graphed))
    return stack, opt, gradients


@pytest.fixture
def setup(digits):
    """Two stacked digits ViTs, a recipe whose lr moves every step (warm-up), and STEPS batches."""
    models = []
    for seed in (0, 1):
        model = small_vit()
        si.initialize(model, "impulse", seed=seed)
        models.append(model)
    cfg = si.TrainConfig(batch_size=16, warmup_epochs=1, randaugment=None, hflip=False, amp="off", cpu_chunks=1)
    x = BatchAugmentation(digits, cfg, CPU).normalize(digits.train_images[:2 * 16 * STEPS])
    xs = x.view(STEPS, 2, 16, *x.shape[1:])
    ys = digits.train_labels[:2 * 16 * STEPS].view(STEPS, 2, 16)
    lrs = [lr_at(i, 10 * STEPS, 10 * STEPS, cfg) for i in range(STEPS)]
    assert len(set(lrs)) == STEPS                     # a schedule the graph must follow step by step
    return models, cfg, list(zip(xs, ys)), lrs


def run(step, batches, lrs):
    """Each step's (loss_sum, correct, nonfinite), copied before the next overwrites them."""
    return [tuple(t.clone() for t in step(x, y, lr=lr)[:3]) for (x, y), lr in zip(batches, lrs)]


def test_with_the_graph_off_the_graphs_step_is_train_step_to_float_noise(setup):
    """The step the graph holds, run eagerly, against train_step with the recipe's optimizer:
    the same losses and correct counts, and weights to the float noise of the lr held in a
    float32 tensor (the graph's) rather than a Python float; against train_step whose optimizer
    reads the same tensor lr, bit for bit (the same ops: only where the inputs live differs)."""
    models, cfg, batches, lrs = setup
    stack, opt, gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
    graphed = run(StepGraph(stack, opt, gradients, max_norm=3.0, ctx=DistributedContext(), capture=False),
                  batches, lrs)

    ref_stack, ref_opt, ref_gradients = stack_and_optimizer(copy.deepcopy(models), cfg)
    plain = run(functools.partial(train_step, ref_stack, ref_opt, ref_gradients, max_norm=3.0,
                                  ctx=DistributedContext()), batches, lrs)
    for (loss, correct, bad), (ref_loss, ref_correct, ref_bad) in zip(graphed, plain):
        torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
        assert correct.tolist() == ref_correct.tolist() and not bad.any() and not ref_bad.any()
    for name, p in stack.trainable().items():
        torch.testing.assert_close(p, ref_stack.trainable()[name], rtol=1e-4, atol=1e-6, msg=name)

    tensor_stack, tensor_opt, tensor_gradients = stack_and_optimizer(copy.deepcopy(models), cfg)
    lr = torch.tensor(cfg.lr)
    for group in tensor_opt.param_groups:
        group["lr"], group["capturable"] = lr, True
    for (x, y), value in zip(batches, lrs):
        lr.fill_(value)
        train_step(tensor_stack, tensor_opt, tensor_gradients, x, y, lr=None, max_norm=3.0, ctx=DistributedContext())
    for name, p in stack.trainable().items():
        assert torch.equal(p, tensor_stack.trainable()[name]), name


def test_the_schedule_moves_through_the_graphs_lr_tensor_and_the_weights_move(setup):
    models, cfg, batches, lrs = setup
    stack, opt, gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
    before = {k: v.detach().clone() for k, v in stack.trainable().items()}
    step = StepGraph(stack, opt, gradients, max_norm=3.0, ctx=DistributedContext(), capture=False)
    for (x, y), lr in zip(batches, lrs):
        step(x, y, lr=lr)
        assert all(g["lr"] is step.lr for g in opt.param_groups)
        assert step.lr.item() == torch.tensor(lr, dtype=torch.float32).item()
    assert all(not torch.equal(before[k], v) for k, v in stack.trainable().items())
    assert float(opt.state[next(iter(stack.trainable().values()))]["step"]) == STEPS


def test_a_captured_step_takes_one_batch_shape(setup):
    models, cfg, batches, lrs = setup
    stack, opt, gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
    step = StepGraph(stack, opt, gradients, max_norm=3.0, ctx=DistributedContext(), capture=False)
    (x, y), lr = batches[0], lrs[0]
    step(x, y, lr=lr)
    with pytest.raises(ValueError, match=r"one shape: batch \(2, 8, 1, 8, 8\).*\(2, 16, 1, 8, 8\)"):
        step(x[:, :8], y[:, :8], lr=lr)


class FakeCuda:
    """torch.cuda's stream and graph calls, stood in for on the CPU, for one StepGraph `step`.
    A capture records without computing, as CUDA's does: its body (the step's function) runs,
    then the weights and AdamW's state are put back as they were, and the body's outputs are
    kept as the graph's; replay() runs the body again and writes its results into those
    outputs. So a replay computes what the graph would, with the inputs as they are at replay.
    Streams are objects: which one each warm-up step and the capture ran on is recorded.
    fail: the capture raises as it starts, as a capture that CUDA refuses does."""

    def __init__(self, monkeypatch, stack, opt, fail=False):
        self.events, self.fail, self.streams = [], fail, []
        self.body = self.outputs = None
        self.current = object()                           # the default stream
        fake = self

        class Stream:
            def __init__(self, device=None):
                pass

            def wait_stream(self, other):
                pass

        class Graph:
            def replay(self):
                fake.events.append("replay")
                for kept, new in zip(fake.outputs, fake.body()):
                    kept.copy_(new)

        @contextlib.contextmanager
        def graph(g, stream=None, **kwargs):
            if fake.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            fake.events.append("capture")
            fake.streams.append(("capture", stream))
            weights = {k: v.detach().clone() for k, v in stack.trainable().items()}
            state = {p: {k: v.clone() for k, v in st.items()} for p, st in opt.state.items()}
            yield
            with torch.no_grad():                          # capturing computed nothing: put back, in place
                for k, v in stack.trainable().items():
                    v.copy_(weights[k])
                for p, st in state.items():
                    for k, v in st.items():
                        opt.state[p][k].copy_(v)
            fake.events.append("captured")

        @contextlib.contextmanager
        def stream(s):
            before, fake.current = fake.current, s
            try:
                yield
            finally:
                fake.current = before

        for name, value in {"Stream": Stream, "CUDAGraph": Graph, "graph": graph, "stream": stream,
                            "current_stream": lambda device=None: Stream(),
                            "synchronize": lambda device=None: None}.items():
            monkeypatch.setattr(torch.cuda, name, value)

    def watch(self, step):
        """Count the step's eager runs, note the stream each ran on, and keep the captured body."""
        eager = step._eager

        def run():
            self.events.append("eager")
            self.streams.append(("eager", self.current))
            out = eager()
            if self.events[-2:] == ["capture", "eager"]:
                self.body, self.outputs = eager, out
            return out
        step._eager = run


def test_warm_up_steps_then_one_capture_then_replays_that_train_as_the_eager_step(setup, monkeypatch):
    """The order (WARMUP_STEPS eager steps on the capture's own stream, then one capture and its
    replay, then replays only) and what the replays compute: every step's results and the final
    weights are, bit for bit, those of the same steps with the graph off."""
    models, cfg, batches, lrs = setup
    monkeypatch.setattr(step_module, "_FAILED_CAPTURE", False)
    stack, opt, gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
    fake = FakeCuda(monkeypatch, stack, opt)
    step = StepGraph(stack, opt, gradients, max_norm=3.0, ctx=DistributedContext(), capture=True)
    fake.watch(step)
    graphed = run(step, batches, lrs)
    assert fake.events == (["eager"] * WARMUP_STEPS + ["capture", "eager", "captured", "replay"]
                           + ["replay"] * (STEPS - WARMUP_STEPS - 1))
    # warm-up and capture on one side stream, the one the graph is given (not the default)
    assert {s for _, s in fake.streams} == {step.stream} and step.stream is not None
    assert all(o is t for o, t in zip(step(*batches[0], lr=lrs[0])[:3], step.out))   # the graph's own tensors

    monkeypatch.undo()
    ref_stack, ref_opt, ref_gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
    eager = run(StepGraph(ref_stack, ref_opt, ref_gradients, max_norm=3.0, ctx=DistributedContext(), capture=False),
                batches, lrs)
    for i, (a, b) in enumerate(zip(graphed, eager)):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), f"step {i}"
    # one step more on the graphed stack (the check above): compare the reference after it too
    ref_step = StepGraph(ref_stack, ref_opt, ref_gradients, max_norm=3.0, ctx=DistributedContext(), capture=False)
    ref_step(*batches[0], lr=lrs[0])
    for name, p in stack.trainable().items():
        assert torch.equal(p, ref_stack.trainable()[name]), name


def test_the_captured_objective_is_compiled_in_default_mode_with_autocasts_cache_off(monkeypatch):
    """Inside the step's graph the forward's kernels must be plain ones: reduce-overhead's own
    CUDA graphs cannot nest in a capture (it would fail, and the run fall back to eager)."""
    stack = StackedModels([small_vit(), small_vit()])
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: asked.append(kw) or fn)
    graphed = Objective(stack, si.TrainConfig(), CUDA, "bf16", graphed=True)
    assert asked == [{"mode": None}] and graphed.how == "compiled (default mode)" and not graphed.host_bound
    Objective(stack, si.TrainConfig(), CUDA, "bf16")
    assert asked[-1] == {"mode": "reduce-overhead"}
    with graphed.context():
        assert not torch.is_autocast_cache_enabled()
    with Objective(stack, si.TrainConfig(), CPU, "bf16").context():
        assert torch.is_autocast_cache_enabled()


def test_a_capture_that_fails_warns_once_and_loses_no_step(setup, monkeypatch, capsys):
    models, cfg, batches, lrs = setup
    monkeypatch.setattr(step_module, "_FAILED_CAPTURE", False)
    stack, opt, gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
    FakeCuda(monkeypatch, stack, opt, fail=True)
    step = StepGraph(stack, opt, gradients, max_norm=3.0, ctx=DistributedContext(), capture=True)
    run(step, batches, lrs)
    out = capsys.readouterr().out
    assert out.count("warning: capturing the step as a CUDA graph failed (RuntimeError: operation not "
                     "permitted when stream is capturing); training eager (cuda_graph: off") == 1
    assert step.failed and step.graph is None
    # the process's later cells do not try again
    assert plan_step_graph("auto", "batched", CUDA, 1, None, 16) == (False, "capturing failed earlier in this process")
    monkeypatch.undo()
    ref_stack, ref_opt, ref_gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
    run(StepGraph(ref_stack, ref_opt, ref_gradients, max_norm=3.0, ctx=DistributedContext(), capture=False),
        batches, lrs)
    for name, p in stack.trainable().items():                 # every step once: no step lost or doubled
        assert torch.equal(p, ref_stack.trainable()[name]), name


@pytest.mark.parametrize("setting, n_models, device, ctx_world, micro_batch, expected", [
    ("auto", 2, CUDA, 1, None, (True, "the whole step as one CUDA graph")),
    ("off", 2, CUDA, 1, None, (False, "cuda_graph: off")),
    ("auto", 2, CPU, 1, None, (False, "no CUDA graph on cpu")),
    ("auto", 1, CUDA, 1, None, (False, "one model: its kernels, not the host, set its pace")),
    ("auto", 2, CUDA, 2, None, (False, "several processes: the gradients' collectives stay outside a graph")),
    ("auto", 2, CUDA, 1, 4, (False, "micro-batches: the step is several passes")),
    ("auto", 2, CUDA, 1, 16, (True, "the whole step as one CUDA graph")),    # a micro-batch of the whole batch
])
def test_where_the_step_is_captured(setting, n_models, device, ctx_world, micro_batch, expected):
    stack = StackedModels([small_vit() for _ in range(n_models)])
    assert plan_step_graph(setting, stack.way, device, ctx_world, micro_batch, 16) == expected


def test_the_recipe_names_a_bad_cuda_graph_setting():
    with pytest.raises(ValueError, match=r"cuda_graph='on'; choose one of \('auto', 'off'\)"):
        si.TrainConfig(cuda_graph="on")


def test_a_captured_steps_memory_keeps_its_training_peak_beside_the_evaluation():
    """The estimate the stacking plan weighs: eager, the evaluation reuses the training pass's
    freed memory (a small one adds nothing to the peak); captured, the graph's private memory
    keeps the training pass's peak and the evaluation comes on top of it."""
    from structinit.training.memory import simulated_peak_bytes

    models = [small_vit(), small_vit()]
    peak = functools.partial(simulated_peak_bytes, models, (1, 8, 8), images_per_pass=64, dtype="fp32")
    eager_small, eager_larger = peak(eval_batch=1), peak(eval_batch=16)
    graphed_small, graphed_larger = peak(eval_batch=1, graphed=True), peak(eval_batch=16, graphed=True)
    assert eager_small == eager_larger                       # the training pass is the peak
    assert graphed_small > eager_small and graphed_larger > graphed_small


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("compile_mode", ["off", "on"])
def test_on_cuda_the_replayed_step_trains_as_the_eager_one(setup, compile_mode):
    """On a GPU: the captured step replayed (after its warm-up and capture) against the same
    code with the graph off, on the same batches and lrs: the graph was used, every step's
    results and the final weights agree to float noise, and the schedule reached the graph."""
    models, cfg, batches, lrs = setup
    cfg = dataclasses.replace(cfg, compile=compile_mode)
    batches = [(x.cuda(), y.cuda()) for x, y in batches]
    results, stacks = [], []
    for capture in (True, False):
        stack = StackedModels(copy.deepcopy(models)).to(CUDA).train()
        opt = stacked_adamw(stack, [None] * len(models), cfg, CUDA)
        gradients = WholeBatchGradients(stack, Objective(stack, cfg, CUDA, "bf16", graphed=True))
        step = StepGraph(stack, opt, gradients, max_norm=3.0, ctx=DistributedContext(), capture=capture)
        results.append(run(step, batches, lrs))
        stacks.append(stack)
        assert (step.graph is not None) == capture and not step.failed
    for graphed, eager in zip(*results):
        torch.testing.assert_close(graphed[0], eager[0], rtol=2e-2, atol=1e-2)
    for name, p in stacks[0].trainable().items():
        torch.testing.assert_close(p, stacks[1].trainable()[name], rtol=2e-2, atol=1e-3, msg=name)
    start = StackedModels(models).trainable()["head.weight"].cuda()
    assert not torch.equal(stacks[0].trainable()["head.weight"], start)          # it trained


def test_the_trainer_trains_through_the_graphs_step_and_resumes_where_it_was_cut(digits, monkeypatch, tmp_path):
    """train_models with the step planned as a graph (here with the graph off: the same code
    on the CPU): its epochs, evaluation, lr record and checkpoint with the optimizer's lr a
    tensor; a run cut after its first epoch resumes and ends with the uncut run's weights."""
    from structinit.training import trainer

    made = []

    class Uncaptured(StepGraph):
        def __init__(self, *args, capture, **kwargs):
            super().__init__(*args, capture=False, **kwargs)
            made.append(self)
    monkeypatch.setattr(trainer, "plan_step_graph", lambda *args: (True, "the whole step as one CUDA graph"))
    monkeypatch.setattr(trainer, "graph_fits", lambda estimate, device: (True, ""))
    monkeypatch.setattr(trainer, "StepGraph", Uncaptured)
    cfgs = [si.TrainConfig(epochs=2, batch_size=16, warmup_epochs=1, randaugment=None, hflip=False, amp="off",
                           cpu_chunks=1, seed=s) for s in (0, 1)]

    def train(checkpoint=None, cut=False):
        models = [small_vit(), small_vit()]
        for seed, m in enumerate(models):
            si.initialize(m, "impulse", seed=seed)

        def stop(i, metrics):
            if cut and metrics["epoch"] == 1:
                raise KeyboardInterrupt
        histories = si.train_models(models, digits, cfgs, device="cpu", train_indices=torch.arange(64),
                                    checkpoint_path=checkpoint, on_epoch_end=stop, progress=False)
        return models, histories

    whole, histories = train()
    assert len(made) == 1 and made[0].steps == 2 * 4                  # 2 epochs of 64 / 16 steps, through it
    assert [type(m["lr"]) for m in histories[0]] == [float, float]
    assert histories[0][0]["lr"] == lr_at(3, 8, 4, cfgs[0])           # the last step's lr, as the schedule gave it
    assert all("test_acc" in m for m in histories[0])
    with pytest.raises(KeyboardInterrupt):
        train(tmp_path / "checkpoint.pt", cut=True)
    resumed, _ = train(tmp_path / "checkpoint.pt")
    assert made[-1].steps == 4                                        # only the second epoch trained again
    for a, b in zip(whole, resumed):
        for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(p, q), name


def test_a_graph_whose_memory_would_pass_the_gpus_share_is_not_captured(monkeypatch):
    from structinit.training.memory import GPU_SHARE, MemoryEstimate, graph_fits

    card = type("Properties", (), {"total_memory": 100 * 2 ** 30})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: card)
    fits = MemoryEstimate(state_bytes=0, activation_bytes=int(GPU_SHARE * 100 * 2 ** 30), data_bytes=0,
                          images_per_pass=1, models=2)
    assert graph_fits(fits, CUDA) == (True, "")
    over = dataclasses.replace(fits, data_bytes=1)
    assert graph_fits(over, CUDA) == (False, "not captured as a CUDA graph: its memory (about 90.0 GiB, estimated) "
                                             "would pass 90 % of the GPU's 100.0 GiB")
