"""How much device memory a stacked cell needs, estimated before it trains, and whether a
cell's seeds train stacked at all (the stacking plan, which weighs that estimate).

    estimate = estimate_training_memory(models, sample, batch=512, micro_batch=None, dtype="bf16",
                                        eval_batch=1024, data_bytes=..., device_type="cuda")
    estimate.total_bytes, estimate.describe()
    together, why = plan_stacking(models, data, cfg, device, dtype)
    print(memory_report(models, sample, ...))        # the estimate, and on a GPU whether it fits

Counted, not guessed: the module that trains (the models stacked, StackedModels) runs one
training pass (forward, loss, gradients, per-model clip, fused AdamW step) and one evaluation
pass on *fake* tensors (torch's FakeTensorMode: shapes and dtypes, no data, no arithmetic, on
the CPU in well under a second even for ViT-T/2 at batch 512), while a dispatch mode follows
every storage from its creation to its release. The peak of the live bytes is what the
caching allocator's torch.cuda.max_memory_allocated measures (each block rounded up to 512
bytes), up to what runs outside autograd's view. Added to it:
- data: the dataset, on the device as uint8 (the trainer keeps it there);
- workspace: on CUDA, the cuBLAS/cuBLASLt workspaces PyTorch allocates through its caching
  allocator on the first matrix product: counted by max_memory_allocated, invisible to a CPU
  simulation;
- a margin of 10 % on the activations for the kernels' scratch (TRANSIENT_MARGIN).
Probing one plain model for the tensors autograd saves is not enough: it misses the batched
module's own tensors, the evaluation pass (the peak on digits), the backward's transients
and the workspace. tests/test_memory.py holds the bound on a GPU: never below the measured
peak, at most 1.25x above it.
"""
from __future__ import annotations

import contextlib
import copy
import copyreg
import math
import weakref
from dataclasses import dataclass
from itertools import chain

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

GiB = 2 ** 30
STATE_COPIES = 5       # the models' weights, the stack's, its gradients, AdamW's exp_avg and exp_avg_sq
CUDA_BLOCK = 512       # the caching allocator rounds every block up to this many bytes
CUDA_WORKSPACE_BYTES = 2 * 32 * 2 ** 20   # cuBLAS + cuBLASLt workspaces at the largest default size
# What a CPU simulation cannot see, as a share of the simulated activations: CUDA kernels'
# scratch (flash attention's backward accumulators), autocast's cached weight casts, the
# augmentation's temporaries. Without it the estimate falls just short of the measured peak;
# 10 % keeps it near the middle of the 1.00-1.25x band tests/test_memory.py holds on a GPU.
TRANSIENT_MARGIN = 0.10
# The share of a GPU's memory an estimate may take (the stacking plan, the graph's check, the
# log's warning): the rest is for what no estimate sees (the CUDA context, fragmentation).
GPU_SHARE = 0.9


@dataclass(frozen=True)
class MemoryEstimate:
    state_bytes: int              # weights, the stack's copy, gradients, AdamW moments, buffers
    activation_bytes: int         # the rest of the training step's (or the evaluation's) peak
    data_bytes: int
    images_per_pass: int          # per model
    models: int
    workspace_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes + self.data_bytes + self.workspace_bytes

    def describe(self) -> str:
        workspace = f", workspace {self.workspace_bytes / GiB:.2f}" if self.workspace_bytes else ""
        return (f"memory estimate {self.total_bytes / GiB:.2f} GiB: activations {self.activation_bytes / GiB:.2f} "
                f"({self.models} model(s) x {self.images_per_pass} images per pass), weights/gradients/AdamW "
                f"{self.state_bytes / GiB:.2f}, data {self.data_bytes / GiB:.2f}{workspace}")

    def micro_batch_to_fit(self, available_bytes: int) -> int | None:
        """The largest micro-batch whose estimate fits `available_bytes`; None if even one
        image per pass does not (activations taken as proportional to the images per pass)."""
        per_image = self.activation_bytes / self.images_per_pass
        room = available_bytes - self.state_bytes - self.data_bytes - self.workspace_bytes
        fits = int(room // per_image) if per_image else self.images_per_pass
        return min(fits, self.images_per_pass) if fits >= 1 else None


class PeakBytes(TorchDispatchMode):
    """Live and peak bytes of every storage created under it, each counted once (views share
    their base's) and released when its last tensor dies; `block` rounds each up as the CUDA
    caching allocator does. Works on real and on fake tensors. Tensors made before it are not
    counted: add them with `hold`."""

    def __init__(self, block: int = 1):
        super().__init__()
        self.block = block
        self.live = 0
        self.peak = 0
        self._seen: dict[int, weakref.ref] = {}

    def _size(self, nbytes: int) -> int:
        return math.ceil(nbytes / self.block) * self.block

    def hold(self, tensors) -> None:
        for t in tensors:
            self._track(t)

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self._seen:
            return
        size = self._size(storage.nbytes())
        self.live += size
        self.peak = max(self.peak, self.live)

        def release(_, key=key, size=size):
            self.live -= size
            self._seen.pop(key, None)
        self._seen[key] = weakref.ref(storage, release)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t)
        return out


def _fake_copies(model: torch.nn.Module, n: int) -> list[torch.nn.Module]:
    """n copies of `model` whose parameters and buffers are fake CPU tensors of their shapes
    and dtypes (call under a FakeTensorMode): no weight is copied, wherever the model lives.
    Frozen tensors (the position encoding) are one tensor shared by all copies: the stack
    keeps them once when the models' are equal, and a fake tensor has no values to compare."""
    def fake(t):
        return torch.empty(t.shape, dtype=t.dtype)
    frozen = {id(p): torch.nn.Parameter(fake(p), requires_grad=False)
              for p in model.parameters() if not p.requires_grad}
    frozen.update({id(b): fake(b) for b in model.buffers()})
    copies = []
    for _ in range(n):
        memo = {id(p): torch.nn.Parameter(fake(p)) for p in model.parameters() if p.requires_grad}
        copies.append(copy.deepcopy(model, {**memo, **frozen}))
    for t in chain(*(m.parameters() for m in copies), *(m.buffers() for m in copies)):
        deepcopied_as_fake(t)
    return copies


def deepcopied_as_fake(t: torch.Tensor) -> None:
    """Give the fake tensor `t` the deepcopy that Tensor.__deepcopy__ gives a tensor subclass
    without storage, minus its test `t.data_ptr() == 0`: a FakeTensor answers that with torch's
    "Accessing the data pointer of FakeTensor is deprecated" warning, printed by every training
    stage while the stack (StackedModels -> batched_module) deep-copies a fake model. The copy
    itself is torch's (a clone, requires_grad, grad, attributes), so the estimate is unchanged;
    deepcopy finds an instance's own __deepcopy__ before its class's. Real tensors never get one:
    their copy is torch's."""
    ref = weakref.ref(t)              # not `t` itself: a cycle would keep every copy alive until gc

    def deepcopy(memo):
        t = ref()
        with torch.no_grad():
            new = t.clone()
            if t.requires_grad:
                new.requires_grad_()
            if t.grad is not None:
                new.grad = copy.deepcopy(t.grad, memo)
            for slot in copyreg._slotnames(type(t)):
                if hasattr(t, slot):
                    setattr(new, slot, copy.deepcopy(getattr(t, slot), memo))
            t._clear_non_serializable_cached_data()
            new.__dict__ = copy.deepcopy({k: v for k, v in t.__dict__.items() if k != "__deepcopy__"}, memo)
        deepcopied_as_fake(new)
        memo[id(t)] = new
        return new
    t.__deepcopy__ = deepcopy


def simulated_peak_bytes(models: list[torch.nn.Module], image_shape: tuple[int, ...], *,
                         images_per_pass: int, eval_batch: int, dtype: str, fused_attention: bool | None = None,
                         accumulate: bool = False, block: int = CUDA_BLOCK, graphed: bool = False) -> int:
    """Peak live bytes of the models (as the caller holds them), the stack built from them, one
    training pass of `images_per_pass` images per model with its gradients, clip and fused
    AdamW step (whose moments stay), then one evaluation pass of `eval_batch` images seen by
    every model: run on fake tensors on the CPU. accumulate: micro-batches, whose gradients are
    summed into a second buffer. graphed: the step is a captured CUDA graph (step.StepGraph),
    whose private memory keeps the training pass's peak while the evaluation runs beside it."""
    from structinit.training.stacked import StackedModels, mean_cross_entropy, set_grads

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    cast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == "bf16" else contextlib.nullcontext
    tracker = PeakBytes(block)
    # fork_rng: a model with dropout draws its masks from the global generator; the estimate
    # must leave it where it was, so a run is the same whether or not it printed one
    with torch.random.fork_rng(devices=[]), mode:
        fakes = _fake_copies(models[0], len(models))
        for m in fakes:
            tracker.hold([*m.parameters(), *m.buffers()])
        with tracker:
            stack = StackedModels(fakes).train()
            if fused_attention is not None:
                for m in stack.base.modules():
                    if hasattr(m, "fused_attn"):
                        m.fused_attn = fused_attention
            n = stack.n
            x = torch.empty(n, images_per_pass, *image_shape)
            y = torch.zeros(n, images_per_pass, dtype=torch.long)
            grads, losses, logits = stack.loss_and_grads(x, y, lambda out, t: mean_cross_entropy(out, t, 0.1), cast)
            params = stack.trainable()
            set_grads(params, grads)
            del grads, losses, logits
            if accumulate:
                extra = [torch.empty_like(p) for p in params.values()]
            stack.clip_grad_norms(1.0)
            opt = torch.optim.AdamW(list(params.values()), lr=1e-3, fused=True)
            opt.step()
            train_peak, held = tracker.peak, tracker.live
            tracker.peak = tracker.live                 # the evaluation's own peak, from here
            stack.eval()
            with torch.no_grad(), cast():
                test = torch.empty(eval_batch, *image_shape)
                out = stack(test, shared_input=True)
                F.cross_entropy(out.float().flatten(0, 1), torch.zeros(n * eval_batch, dtype=torch.long),
                                reduction="none")
            del opt, params, stack, out, test
            if accumulate:
                del extra
    if graphed:
        return train_peak + tracker.peak - held
    return max(train_peak, tracker.peak)


def estimate_training_memory(models: list[torch.nn.Module], sample: torch.Tensor, *, batch: int,
                             micro_batch: int | None, dtype: str, data_bytes: int = 0,
                             fused_attention: bool | None = None, eval_batch: int = 1024,
                             test_images: int | None = None, device_type: str = "cuda",
                             graphed: bool = False) -> MemoryEstimate:
    """models: the stack's (one architecture); sample: a few training images (B, C, H, W), for
    their shape; batch: images per model per step in this process; eval_batch / test_images:
    the evaluation's batch and how many test images there are (the pass holds the smaller);
    fused_attention: the trainer's attention kernel (StackedModels.choose_attention);
    device_type: "cuda" counts the allocator's rounding and the cuBLAS workspace; graphed: the
    step is captured as a CUDA graph (its training pass's peak stays held)."""
    per_pass = min(batch, micro_batch) if micro_batch else batch
    cuda = device_type == "cuda"
    peak = simulated_peak_bytes(models, tuple(sample.shape[1:]), images_per_pass=per_pass,
                                eval_batch=min(eval_batch, test_images or eval_batch), dtype=dtype,
                                fused_attention=fused_attention, accumulate=per_pass < batch,
                                block=CUDA_BLOCK if cuda else 1, graphed=graphed)
    model = models[0]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    state = len(models) * (STATE_COPIES * weights + 2 * buffers)
    activations = max(0, peak - state) * (1 + TRANSIENT_MARGIN)
    return MemoryEstimate(state_bytes=state, activation_bytes=int(activations), data_bytes=data_bytes,
                          images_per_pass=per_pass, models=len(models),
                          workspace_bytes=CUDA_WORKSPACE_BYTES if cuda else 0)


def training_flops_per_image(model: torch.nn.Module, image_shape: tuple[int, ...]) -> float:
    """FLOPs of one image's training step (forward + backward ~ 3x the forward's matrix
    products and convolutions), counted by torch's FlopCounterMode on fake tensors: no
    arithmetic runs, wherever the model lives."""
    from torch.utils.flop_counter import FlopCounterMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with torch.random.fork_rng(devices=[]), mode:
        fake = _fake_copies(model, 1)[0]
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            fake(torch.empty(1, *image_shape))
    return 3.0 * counter.get_total_flops()



# ---- the stacking plan -----------------------------------------------------------------------

# One model's training step at least this many FLOPs fills a GPU: stacking seeds then buys
# little throughput and multiplies the memory. Below it (a small model at a small batch) the
# host sets the pace, and a stack costs about what one model costs.
FILLS_A_GPU_FLOPS = 1e12


def plan_stacking(models: list[torch.nn.Module], data, cfg, device: torch.device, dtype: str,
                  processes: int = 1, train_size: int | None = None,
                  micro_batch: int | None = None) -> tuple[bool, str]:
    """(whether the models train stacked, why): on a GPU, one after another when one model's
    step fills it (FILLS_A_GPU_FLOPS) or the stack's memory estimate passes 90 % of the GPU's
    memory; on a CPU, always stacked (host-bound: a stack costs little more than one model).
    data: the ImageData; cfg: the TrainConfig; dtype: what the run computes in; processes: how
    many share each step's batch (torchrun); train_size: the training images used (a subset's
    size; None: all); micro_batch: images per model per pass, which the estimate counts as the
    step does. The estimate is the uncaptured step's: where a captured one (step.StepGraph)
    would not fit, the trainer trains the stack uncaptured (graph_fits) rather than unstacked."""
    if device.type != "cuda":
        return True, "stacked on the CPU"
    flops = training_flops_per_image(models[0], tuple(data.train_images.shape[1:])) * cfg.batch_size
    if flops >= FILLS_A_GPU_FLOPS:
        return False, (f"one model's step is {flops / 1e12:.1f} TFLOP, enough to fill the GPU: stacking would "
                       "multiply the memory and buy little")
    total = torch.cuda.get_device_properties(device).total_memory
    n_train = len(data.train_labels) if train_size is None else train_size
    batch = min(cfg.batch_size, n_train) // processes
    per_image = data.train_images[:1].nbytes
    estimate = estimate_training_memory(models, data.train_images[:1], batch=batch, micro_batch=micro_batch,
                                        dtype=dtype, data_bytes=n_train * per_image + data.test_images.nbytes,
                                        test_images=len(data.test_labels), device_type="cuda")
    if estimate.total_bytes > GPU_SHARE * total:
        return False, (f"the stack of {len(models)} needs about {estimate.total_bytes / 2 ** 30:.1f} GiB (estimated), "
                       f"more than {GPU_SHARE * 100:.0f} % of the GPU's {total / 2 ** 30:.1f} GiB")
    return True, f"one model's step is {flops / 1e9:.0f} GFLOP: the host sets the pace, so the seeds stack"


def graph_fits(estimate: MemoryEstimate, device: torch.device) -> tuple[bool, str]:
    """Whether a step captured as a CUDA graph fits the GPU (its estimate, graphed=True, under
    90 % of the card's memory), and if not why, for the log."""
    total = torch.cuda.get_device_properties(device).total_memory
    if estimate.total_bytes > GPU_SHARE * total:
        return False, (f"not captured as a CUDA graph: its memory (about {estimate.total_bytes / GiB:.1f} GiB, "
                       f"estimated) would pass {GPU_SHARE * 100:.0f} % of the GPU's {total / GiB:.1f} GiB")
    return True, ""


def memory_report(models: list[torch.nn.Module], sample: torch.Tensor, batch: int, micro_batch: int | None,
                  dtype: str, device: torch.device, data_bytes: int, fused_attention: bool | None = None,
                  test_images: int | None = None, graphed: bool = False,
                  estimate: MemoryEstimate | None = None) -> str:
    """The cell's memory estimate as one line for the log; on a GPU, whether it fits and which
    STRUCTINIT_MICRO_BATCH would (where micro-batches are the same step). estimate: one the
    caller made already with these arguments."""
    from structinit.training.stacked import why_not_splittable

    estimate = estimate or estimate_training_memory(
        models, sample, batch=batch, micro_batch=micro_batch, dtype=dtype, data_bytes=data_bytes,
        fused_attention=fused_attention, test_images=test_images, device_type=device.type, graphed=graphed)
    line = estimate.describe()
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        line += f"; the GPU has {total / 2 ** 30:.1f} GiB"
        if estimate.total_bytes > GPU_SHARE * total:
            fit = None if why_not_splittable(models[0]) else estimate.micro_batch_to_fit(int(0.8 * total))
            line += (f": it may not fit; try STRUCTINIT_MICRO_BATCH={fit} (the same step, in pieces)" if fit
                     else ": it may not fit, and micro-batches cannot help (one image per pass is too much, or the "
                          "model has BatchNorm or dropout); stack fewer seeds (grid.seeds) or use more GPUs")
    return line
