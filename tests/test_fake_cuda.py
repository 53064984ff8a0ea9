"""The device work of every stage that can meet a GPU, run on fake CUDA tensors on the CPU.

torch's FakeTensorMode makes tensors that carry a device, shape and dtype but no data: ops on
them check devices as CUDA would, so a CPU tensor meeting a CUDA one fails here, in CI, on a
machine without a GPU (the attention analysis did that on the project's first GPU run). What
FakeTensorMode cannot do is injected: CUDA generators (a CPU generator draws for the fake
CUDA tensors), autograd's backward (the CUDA engine needs a real device: torch.autograd.grad
returns zeros of each input's shape), autocast (CUDA's is off without a GPU), and host reads
(`.item()`, `.tolist()`: no values), which the stages keep at the end of their work, outside
these calls. The same mode counts the host<->device copies of one training step: each is a
stream sync on a GPU, so the step must make none.
"""
import contextlib
import functools

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import structinit as si
from conftest import small_vit
from structinit.analysis.attention import attention_maps
from structinit.analysis.cka import cka_matrix, layer_representations
from structinit.analysis.model import analyze_model
from structinit.data.specs import get_spec
from structinit.data.tensors import ImageData
from structinit.distributed import DistributedContext
from structinit.pipeline.build import build_model
from structinit.pipeline.load import load_params
from structinit.training import trainer
from structinit.training.trainer import BatchAugmentation, EpochBatches, stacked_adamw, evaluation_sums
from structinit.memory import deepcopied_as_fake, estimate_training_memory
from structinit.training.stacked import Objective, plan_gradients, StackedModels
from structinit.training.trainer import StepGraph, train_step

pytestmark = pytest.mark.filterwarnings("error:Accessing the data pointer of FakeTensor")
CUDA = torch.device("cuda", 0)


class HostDeviceCopies(TorchDispatchMode):
    """Records every op that moves data between the host and a device (a copy between CPU and
    CUDA tensors, or a read of a device value into Python): what a GPU would wait on. Python
    numbers passed to ops travel as kernel arguments, not copies, and are not counted."""

    def __init__(self):
        super().__init__()
        self.copies = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name == "_local_scalar_dense":                  # .item(), float(), .tolist(), bool(t)
            self.copies.append(f"{name} (device -> host read)")   # before: a fake tensor cannot answer
        out = func(*args, **(kwargs or {}))
        if name in ("lift_fresh", "lift_fresh_copy") and isinstance(out, torch.Tensor) and out.device.type != "cpu":
            # torch.tensor(data, device=cuda) where torch sees a GPU: the constructor copies the
            # data to the device beneath the dispatcher, so only the lift of the device tensor
            # shows. (Without a GPU, FakeTensorMode builds it on the host and moves it with a
            # dispatched _to_copy instead: counted below.)
            self.copies.append(f"{name} ['{out.device.type}'] (host data -> device)")
        elif name in ("_to_copy", "copy_", "copy"):
            devices = {t.device.type for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)}
            if len(devices) > 1:
                self.copies.append(f"{name} {sorted(devices)}")
        return out


def fake_cuda(module: torch.nn.Module, mode: FakeTensorMode, frozen_from: torch.nn.Module | None = None
              ) -> torch.nn.Module:
    """`module` with every parameter and buffer a fake CUDA tensor of its shape and dtype.
    frozen_from: a model already faked whose frozen tensors (the position encoding) this one's
    equal: they become the same tensor, as the stack needs them equal and a fake tensor has no
    values to compare."""
    shared = dict(frozen_from.named_parameters()) if frozen_from is not None else {}
    for prefix, m in module.named_modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            key = f"{prefix}.{name}" if prefix else name
            if not p.requires_grad and key in shared:
                m._parameters[name] = shared[key]
                continue
            m._parameters[name] = torch.nn.Parameter(mode.from_tensor(p.detach()).to(CUDA),
                                                     requires_grad=p.requires_grad)
        for name, b in list(m._buffers.items()):
            if b is not None:
                m._buffers[name] = mode.from_tensor(b).to(CUDA)
    # the stack deep-copies a model: copied as the memory estimate copies its fake models, with
    # no data pointer read (torch's "Accessing the data pointer of FakeTensor is deprecated")
    for t in (*module.parameters(), *module.buffers()):
        deepcopied_as_fake(t)
    return module


@contextlib.contextmanager
def zero_gradients():
    """autograd.grad on fake CUDA tensors needs a CUDA context: each input's gradient is
    injected as zeros of its shape, dtype and device (the forward and loss still run)."""
    real = torch.autograd.grad

    def grad(outputs, inputs, *args, **kwargs):
        return tuple(torch.zeros_like(t) for t in inputs)
    torch.autograd.grad = grad
    try:
        yield
    finally:
        torch.autograd.grad = real


@pytest.fixture
def mode():
    return FakeTensorMode(allow_non_fake_inputs=True)


@contextlib.contextmanager
def shape_only_fused_adamw_with_a_tensor_lr():
    """FakeTensorMode has no kernel for fused AdamW's tensor-lr overload (StepGraph's: the lr a
    graph reads from the device). It updates in place and returns nothing, so on tensors
    without data its shape-level behaviour is to do nothing: registered as its Meta kernel
    while the block runs. The Python around it (where a host lr would be copied) still runs."""
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_fused_adamw_.tensor_lr", lambda *args, **kwargs: None, "Meta")
    try:
        yield
    finally:
        lib._destroy()


def structured_vit():
    model = small_vit()
    record = si.initialize(model, "impulse", kernel=3, seed=0, target_mass=0.9)
    return model, record.offsets


def test_attention_analysis_and_cka_run_where_the_model_is(mode):
    """analyze_model's maps, offset profiles, distances and target masses, and CKA between
    layers, for a model on CUDA and images on CUDA (a CPU index meeting CUDA maps failed)."""
    model, offsets = structured_vit()
    with mode:
        fake_cuda(model, mode)
        images = torch.empty(6, 1, 8, 8, device=CUDA)
        pseudo = attention_maps(model, offsets=offsets)
        assert pseudo.maps.device == CUDA
        assert pseudo.offset_mass().shape == (3, 3, 15, 15) and pseudo.offset_mass().device == CUDA
        assert pseudo.mean_distance().device == CUDA
        assert pseudo.target_mass().shape == (3, 3) and pseudo.target_mass().device == CUDA
        analysis = analyze_model(model, images, offsets=offsets, batch_size=4)
        assert analysis.profile_images.device == CUDA and analysis.target_images.shape == (3, 3)
        reps = layer_representations(model, images)
        cka = cka_matrix(reps, reps)
        assert cka.shape == (3, 3) and cka.device == CUDA


def synthetic(name: str, n: int, mode: FakeTensorMode) -> ImageData:
    spec = get_spec(name)
    shape = (spec.channels, spec.image_size, spec.image_size)
    with mode:
        return ImageData(spec, torch.empty(n, *shape, dtype=torch.uint8, device=CUDA),
                         torch.zeros(n, dtype=torch.long, device=CUDA),
                         torch.empty(n, *shape, dtype=torch.uint8, device=CUDA),
                         torch.zeros(n, dtype=torch.long, device=CUDA))


@pytest.mark.parametrize("recipe, n_models, graphed", [("digits", 2, False), ("digits", 2, True), ("cifar10", 1, False),
                                                       ("cifar10", 2, False)])
def test_a_training_step_and_the_evaluation_run_on_cuda_with_no_host_copies(mode, recipe, n_models, graphed):
    """The on-device trainer's epoch loop (epoch_steps: the batches gathered, augmented with
    the recipe's RandAugment and flips, each model's draws from its own generator put side by
    side, forward, loss, clip, fused AdamW; the eager forward, as on the CPU or with compile
    off) and its evaluation, on fake CUDA tensors: no device mismatch, and not one
    host<->device copy in the step (RandAugment made 6 per model per step, each a stream sync).
    graphed: the step a StepGraph captures (its input copies and lr fill included), run as it
    runs with the graph switched off (FakeTensorMode cannot capture)."""
    p = load_params()
    spec = get_spec(recipe)
    train = {**p["recipes"][recipe]["train"], "batch_size": 8, "epochs": 2}
    # amp resolved as train_models resolves it on a card with bf16 (asking the card needs one)
    train["amp"] = "bf16"
    cfg = si.TrainConfig(**train)
    cfgs = [si.TrainConfig(**{**train, "seed": s}) for s in range(n_models)]
    if recipe == "cifar10":
        assert cfg.randaugment and cfg.hflip          # the recipe whose augmentation copied
        model_cfg = {**p["recipes"][recipe]["model"], "depth": 2}   # the shape, fewer blocks
    else:
        model_cfg = p["recipes"][recipe]["model"]
    models = [build_model(model_cfg, spec) for _ in cfgs]
    frozen = [(k, v) for k, v in models[0].named_parameters() if not v.requires_grad]
    assert all(torch.equal(v, dict(m.named_parameters())[k]) for m in models for k, v in frozen)
    data = synthetic(recipe, 16, mode)
    with mode:
        for m in models:
            fake_cuda(m, mode, frozen_from=models[0] if m is not models[0] else None)
        dtype = "bf16"
        stack = StackedModels(models).train()              # built from CUDA models: on CUDA
        stack.choose_attention(CUDA, dtype)
        augmentation = BatchAugmentation(data, cfg, CUDA)
        opt = stacked_adamw(stack, [None] * n_models, cfg, CUDA)
        gradients, _ = plan_gradients(cfg.cpu_chunks, stack, CUDA, 8, Objective(stack, cfg, CUDA, dtype, graphed))
        step = (StepGraph(stack, opt, gradients, max_norm=3.0, ctx=DistributedContext(), capture=False) if graphed
                else functools.partial(train_step, stack, opt, gradients, max_norm=3.0, ctx=DistributedContext()))
        gens = [torch.Generator().manual_seed(s) for s in range(n_models)]   # a CPU generator stands in
        adamw = shape_only_fused_adamw_with_a_tensor_lr() if graphed else contextlib.nullcontext()
        with zero_gradients(), adamw, HostDeviceCopies() as copies:
            batches = EpochBatches(data.train_images, data.train_labels, augmentation, gens, 8, DistributedContext(),
                                   steps=1)
            sums = trainer.epoch_steps(step, batches, [c.seed for c in cfgs], 0, cfg=cfg, device=CUDA,
                                       progress=False)
        assert copies.copies == [], copies.copies
        assert {t.device for t in sums.values() if isinstance(t, torch.Tensor)} == {CUDA}
        assert next(iter(opt.state.values()))["exp_avg"].device == CUDA       # the step ran
        if graphed:       # the lr a graph reads: one device tensor (a host one would be baked in at capture)
            assert all(g["lr"] is step.lr and g["capturable"] for g in opt.param_groups) and step.lr.device == CUDA
        with HostDeviceCopies() as copies:
            loss_sum, correct = evaluation_sums(stack, data.test_images, data.test_labels,
                                                augmentation=augmentation, device=CUDA, dtype=dtype)
        assert copies.copies == [], copies.copies
        assert loss_sum.shape == correct.shape == (n_models,) and loss_sum.device == CUDA


def test_the_copy_counter_sees_a_copy_from_the_host(mode):
    """The counter above is not blind: a tensor built from a list on the device, a host tensor
    moved there and a read of a device value are each counted once, on a machine with or
    without a GPU. The constructor's copy reaches a dispatch mode by a different op on each:
    without a GPU FakeTensorMode builds the tensor on the host and moves it (_to_copy); with
    one, torch copies beneath the dispatcher and only lift_fresh of the device tensor shows
    (the counter missed that, and this test failed, on the first CUDA machine)."""
    with mode:
        x = torch.empty(4, device=CUDA)
        host = torch.ones(4)
    for copy in (lambda: torch.tensor([1.0, 2.0, 3.0, 4.0], device=CUDA),
                 lambda: host.to(CUDA),
                 lambda: x.sum().item()):
        with mode, HostDeviceCopies() as copies:
            try:
                copy()
            except Exception:       # .item() of a fake tensor has no value to give: it was still asked
                pass
        assert len(copies.copies) == 1, copies.copies


def test_the_copy_counter_counts_the_lift_of_a_device_tensor(mode):
    """What a CUDA machine's torch.tensor(data, device=cuda) dispatches (the copy below the
    dispatcher, then lift_fresh of the device tensor) is counted: the counter is not blind
    there either. Called directly, since a CPU-only machine's constructor takes the other path."""
    with mode:
        on_device = torch.empty(4, device=CUDA)
        with HostDeviceCopies() as copies:
            torch.ops.aten.lift_fresh(on_device)
    assert copies.copies == ["lift_fresh ['cuda'] (host data -> device)"], copies.copies
    with mode:
        on_host = torch.empty(4)
        with HostDeviceCopies() as copies:
            torch.ops.aten.lift_fresh(on_host)          # a host tensor lifted: no copy
    assert copies.copies == [], copies.copies


def test_the_memory_estimate_of_models_on_cuda(mode):
    """The estimate the trainer prints before a cell, for models and a sample on CUDA: it
    simulates the step on fake CPU tensors of the same shapes, whatever device they are on."""
    models = [small_vit() for _ in range(2)]
    expected = estimate_training_memory(models, torch.randn(8, 1, 8, 8), batch=64, micro_batch=None,
                                        dtype="bf16", test_images=100)
    with mode:
        for m in models:
            fake_cuda(m, mode)
        sample = torch.empty(8, 1, 8, 8, device=CUDA)
    on_cuda = estimate_training_memory(models, sample, batch=64, micro_batch=None, dtype="bf16", test_images=100)
    assert on_cuda == expected and on_cuda.workspace_bytes > 0
