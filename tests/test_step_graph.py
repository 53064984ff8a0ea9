"""StepGraph: the whole training step as one CUDA graph. Its numbers are tested here on the CPU
through the same code with the graph switched off (capture=False); its capture and replay, which
need a GPU, with torch.cuda's graph calls stood in for by a fake that replays the captured ops
on the captured tensors (fake_graph), for their order (warm-up steps, one capture, then replays
only), their numbers and their fallback. On a GPU, the real graph against the same step
uncaptured: test_on_cuda_the_replayed_step_trains_as_the_eager_one."""
import copy
import dataclasses
import functools
import pytest
import torch

import structinit as si
from conftest import small_vit
from fake_graph import FakeCuda
from structinit.distributed import DistributedContext
from structinit.training import trainer as trainer_module
from structinit.training.trainer import BatchAugmentation, stacked_adamw, lr_at
from structinit.training.stacked import StackedModels, Objective, WholeBatchGradients
from structinit.training.trainer import WARMUP_STEPS, StepGraph, plan_step_graph, train_step

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


def test_warm_up_steps_then_one_capture_then_replays_that_train_as_the_eager_step(setup, monkeypatch):
    """The order (WARMUP_STEPS eager steps on the capture's own stream, then one capture and its
    replay, then replays only) and what the replays compute, with the graph faked as a CUDA graph
    behaves (fake_graph: a replay re-runs the captured ops on the captured tensors, not the Python
    step). Every step's results, the gradients it leaves and the final weights are, bit for bit,
    those of the same steps with the graph off. What a capture would get wrong, this catches:
    a batch or lr that the Python code puts anywhere but the captured tensors, state that the
    capture allocates (re-initialized at every replay), gradients rebound outside the graph."""
    models, cfg, batches, lrs = setup
    monkeypatch.setattr(trainer_module, "_FAILED_CAPTURE", False)
    fake = FakeCuda(monkeypatch)

    def steps(capture):
        stack, opt, gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
        step = StepGraph(stack, opt, gradients, max_norm=3.0, ctx=DistributedContext(), capture=capture)
        eager = step._eager

        def watched():                        # each Python run of the step, and the stream it ran on
            fake.events.append("eager")
            fake.streams.append(("eager", fake.current))
            return eager()
        step._eager = watched
        out = [(*(t.clone() for t in step(x, y, lr=lr)[:3]),
                [p.grad if p.grad is None else p.grad.clone() for p in stack.trainable().values()])
               for (x, y), lr in zip(batches, lrs)]
        return step, stack, out

    step, stack, graphed = steps(capture=True)
    assert fake.events == (["eager"] * WARMUP_STEPS + ["capture", "eager", "captured", "replay"]
                           + ["replay"] * (STEPS - WARMUP_STEPS - 1))
    # warm-up and capture on one side stream, the one the graph is given (not the default)
    assert {s for _, s in fake.streams} == {step.stream} and step.stream is not None
    assert all(o is t for o, t in zip(step(*batches[0], lr=lrs[0])[:3], step.out))   # the graph's own tensors

    ref_step, ref_stack, eager = steps(capture=False)
    for i, (a, b) in enumerate(zip(graphed, eager)):
        assert all(torch.equal(x, y) for x, y in zip(a[:3], b[:3])), f"step {i}"
        assert all(x is not None and torch.equal(x, y) for x, y in zip(a[3], b[3])), f"step {i}'s gradients"
    ref_step(*batches[0], lr=lrs[0])          # the step more the graphed stack took (the check above)
    for name, p in stack.trainable().items():
        assert torch.equal(p, ref_stack.trainable()[name]), name


def test_the_fake_graph_replays_what_was_captured_not_the_python(monkeypatch):
    """The fake is not blind to what a CUDA graph does differently from the Python it captured:
    a buffer rebound after the capture is not read, a host float stays the capture's, a tensor
    the capture allocated is filled anew at each replay, a capture computes nothing, and a host
    read in a capture raises."""
    fake = FakeCuda(monkeypatch)
    x, lr, total, seen = torch.ones(2), torch.tensor(0.5), torch.zeros(2), []
    host_lr = 2.0
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        count = torch.zeros(())               # allocated in the capture: zero again at each replay
        count.add_(1)
        total.add_(x * lr * host_lr)          # reads x's and lr's memory, and the float 2.0
        seen.append(x.sum())
    assert total.tolist() == [0, 0] and seen[0].isnan() and fake.events == ["capture", "captured"]
    x, host_lr = torch.full((2,), 10.0), 0.0  # rebound: the graph still reads the old tensor and 2.0
    lr.fill_(1.0)                             # written in place: the graph reads it
    g.replay()
    g.replay()
    assert total.tolist() == [4, 4] and count.item() == 1 and seen[0].item() == 2
    with pytest.raises(RuntimeError, match="not permitted when stream is capturing"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            total.sum().item()


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
    monkeypatch.setattr(trainer_module, "_FAILED_CAPTURE", False)
    stack, opt, gradients = stack_and_optimizer(copy.deepcopy(models), cfg, graphed=True)
    FakeCuda(monkeypatch, fail=True)
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
    from structinit.memory import simulated_peak_bytes

    models = [small_vit(), small_vit()]
    peak = functools.partial(simulated_peak_bytes, models, (1, 8, 8), images_per_pass=64, dtype="fp32")
    eager_small, eager_larger = peak(eval_batch=1), peak(eval_batch=16)
    graphed_small, graphed_larger = peak(eval_batch=1, graphed=True), peak(eval_batch=16, graphed=True)
    assert eager_small == eager_larger                       # the training pass is the peak
    assert graphed_small > eager_small and graphed_larger > graphed_small


# The GPU check: 240 steps, two epochs of the Fashion-MNIST schedule (117 steps of 512 of the
# 60,000 images each): the warm-up, where the graph's lr rises at every step, then the cosine.
CUDA_STEPS = 240
# Per step, each model's mean loss (nats per image), captured against uncaptured. The two runs
# launch the same kernels on the same numbers, so a right capture is off only where a kernel is
# not deterministic (atomics, e.g. in the attention's backward): about an ulp of bf16 (2^-8
# relative) here and there in a step, which training carries on. With AdamW's eps of 1e-3
# keeping each update linear in a small gradient, that should stay far below 0.02 nats (1 % of
# the starting loss, ln 10 = 2.3) over these steps; the test prints the gap it found, so a GPU
# run records the real margin. A wrong capture trains a different run: a frozen batch, a frozen
# lr (the capture's, 1/29 of the peak) or AdamW's moments reset at every replay move the loss
# about as far as training does, and the eager run's own loss must fall by 10 times this.
CUDA_LOSS_TOLERANCE = 0.02


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_on_cuda_the_replayed_step_trains_as_the_eager_one():
    """On a GPU, one command (a few minutes, most of them two compiles; -s prints the gap):

        python -m pytest -q -s tests/test_step_graph.py -k on_cuda

    The Fashion-MNIST recipe as train_models runs it on a GPU (params.yaml's ViT, batch, AdamW,
    schedule, clipping and label smoothing; compiled, in the card's dtype), two models stacked,
    CUDA_STEPS steps on synthetic images of its shape (a template per class in unit noise: a
    task the models learn), run twice: the step captured as one CUDA graph and replayed after its
    warm-up, and the same compiled step uncaptured. Only the capture differs: every step's
    losses agree within CUDA_LOSS_TOLERANCE, the graph was used, and the schedule reached it."""
    from structinit.data.specs import get_spec
    from structinit.pipeline.build import build_model
    from structinit.pipeline.load import load_params
    from structinit.training.stacked import compute_dtype
    from structinit.training.trainer import schedule_steps

    recipe, spec = load_params()["recipes"]["fashion_mnist"], get_spec("fashion_mnist")
    cfg = si.TrainConfig(**recipe["train"])
    torch.manual_seed(0)
    models = [build_model(recipe["model"], spec) for _ in range(2)]
    dtype = compute_dtype(cfg, CUDA, models[0])
    total, warmup = schedule_steps(cfg, 60_000 // cfg.batch_size)
    lrs = [lr_at(i, total, warmup, cfg) for i in range(CUDA_STEPS)]
    gen = torch.Generator(device=CUDA).manual_seed(0)
    templates = torch.randn(10, spec.channels, spec.image_size, spec.image_size, device=CUDA, generator=gen)

    def batches():                            # the same images in both runs, made on the device as needed
        for i in range(CUDA_STEPS):
            gen.manual_seed(i + 1)
            y = torch.randint(0, 10, (2, cfg.batch_size), device=CUDA, generator=gen)
            yield templates[y] + torch.randn(*y.shape, *templates.shape[1:], device=CUDA, generator=gen), y
    losses = {}
    for capture in (True, False):
        stack = StackedModels(copy.deepcopy(models)).to(CUDA).train()
        stack.choose_attention(CUDA, dtype)
        opt = stacked_adamw(stack, [None] * len(models), cfg, CUDA)
        objective = Objective(stack, cfg, CUDA, dtype, graphed=True)
        step = StepGraph(stack, opt, WholeBatchGradients(stack, objective), max_norm=cfg.grad_clip,
                         ctx=DistributedContext(), capture=capture)
        losses[capture] = torch.stack([out[0] for out in run(step, batches(), lrs)]) / cfg.batch_size
        assert objective.compiled is not None and not objective._failed      # the compiled step, both times
        assert (step.graph is not None) == capture and not step.failed
        assert step.lr.item() == torch.tensor(lrs[-1], dtype=torch.float32).item()
    gap = (losses[True] - losses[False]).abs()
    print(f"\nlargest per-step loss gap, captured vs uncaptured, over {CUDA_STEPS} steps: {gap.max().item():.2e} "
          f"nats (tolerance {CUDA_LOSS_TOLERANCE}); eager loss {losses[False][0].tolist()} -> "
          f"{losses[False][-1].tolist()}")
    bad = (gap > CUDA_LOSS_TOLERANCE).any(1).nonzero()
    assert not len(bad), f"step {bad[0].item()}: {losses[True][bad[0]].tolist()} vs {losses[False][bad[0]].tolist()}"
    fell = losses[False][:10].mean(0) - losses[False][-10:].mean(0)
    assert (fell > 10 * CUDA_LOSS_TOLERANCE).all(), f"the loss fell by only {fell.tolist()}: too little to test"


def test_the_trainer_trains_through_the_graphs_step_and_resumes_where_it_was_cut(digits, monkeypatch, tmp_path):
    """train_models with the step captured as a graph (the fake one, fake_graph): its epochs,
    evaluation, lr record and checkpoint with the optimizer's lr a tensor; a run cut after its
    first epoch resumes and ends, bit for bit, with the uncut run's weights, though the uncut
    run replayed the second epoch's steps that the resumed one ran in Python (its warm-up)."""
    from structinit.training import trainer

    made = []
    monkeypatch.setattr(trainer_module, "_FAILED_CAPTURE", False)
    FakeCuda(monkeypatch)
    monkeypatch.setattr(trainer, "plan_step_graph", lambda *args: (True, "the whole step as one CUDA graph"))
    monkeypatch.setattr(trainer, "graph_fits", lambda estimate, device: (True, ""))
    monkeypatch.setattr(trainer, "StepGraph", lambda *args, **kw: made.append(StepGraph(*args, **kw)) or made[-1])
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
    assert len(made) == 1 and made[0].steps == 2 * 4 and made[0].graph   # 2 epochs of 64 / 16 steps, through it
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
    from structinit.memory import GPU_SHARE, MemoryEstimate, graph_fits

    card = type("Properties", (), {"total_memory": 100 * 2 ** 30})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: card)
    fits = MemoryEstimate(state_bytes=0, activation_bytes=int(GPU_SHARE * 100 * 2 ** 30), data_bytes=0,
                          images_per_pass=1, models=2)
    assert graph_fits(fits, CUDA) == (True, "")
    over = dataclasses.replace(fits, data_bytes=1)
    assert graph_fits(over, CUDA) == (False, "not captured as a CUDA graph: its memory (about 90.0 GiB, estimated) "
                                             "would pass 90 % of the GPU's 100.0 GiB")
