"""Several models of one architecture run as one: every op does N models' work in one call.

    stack = StackedModels([model_a, model_b])    # same architecture, any weights
    logits = stack(x)                            # x (N, B, ...) -> (N, B, classes)
    stack.state_dict_of(1)                       # model_b's trained weights, model_b's keys

Why: the embedded default's ViT (width 48, 64 tokens, batch 64) is so small that a training
step is mostly per-op overhead (Python, dispatch, thread fork/join); five such models
stacked cost little more per step than one.

How, three ways behind one interface:
- plain, for one model: timm's own module trains as it is (its own parameters, foreach
  clipping as timm's train.py clips): a model that fills a GPU gains nothing from a stack of
  one, and every stacked layer costs kernels a plain one does not.
- batched (batched.py), where the architecture allows (the project's ViTs): timm's module
  runs unchanged on all N*B samples, its Linear/LayerNorm/Conv2d layers swapped for ones
  whose weights carry the model axis (batched matmuls over models), attention one fused
  `scaled_dot_product_attention` call over models x batch x heads; plain autograd.
- vmap, for the rest (BatchNorm: ConvMixer): `torch.func.stack_module_state` gives each
  parameter and buffer a leading model dimension, and `vmap(functional_call)` runs the
  unchanged timm module over it; gradients by `vmap(grad(one model's loss))` (functorch's
  model-ensembling recipe). Functional gradients, not `.backward()` on leaves that require
  grad: under vmap, autocast silently stays in fp32 for tensors that require grad.
  BatchNorm's running statistics are stacked buffers, updated in place per model.
Either way gradients are per model by construction, and per-model gradient clipping
(`clip_grad_norm_per_model`) and an elementwise optimizer (AdamW) keep every model's update
what it would be alone.

Here too, because every way of running the stack needs them: the batched layers (`batched_module`),
the precision a run computes in (`compute_dtype`, decided once per run, and its `autocast`), and
the pieces a step's forward and backward run in: `Objective` (eager or compiled by torch.compile,
with the guard that falls back to eager where compiling fails), `WholeBatchGradients` (the batch
in one pass or in micro-batches) and, on a CPU, `ChunkedGradients` (the batch as single-threaded
chunks on threads, gradients summed in a fixed order: an intra-op thread pool's fork/join inside
each of a small ViT's short ops costs more than the op). The pieces' losses are weighted by their
share of the batch, so their summed gradients are the full batch's; that holds only for models
whose forward treats samples independently (why_not_splittable: not BatchNorm, not active
dropout or drop-path).
"""
from __future__ import annotations

import contextlib
import copy
import functools
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import timm.layers
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from structinit import numerics
from structinit.training.config import TrainConfig


_SWAPS = {}                                        # module type -> its batched replacement


def _swaps(*kinds):
    """Register a batched layer for these exact module types (a subclass may compute
    something else: it is only swapped when listed)."""
    def register(cls):
        _SWAPS.update(dict.fromkeys(kinds, cls))
        return cls
    return register


def _stacked(models: list[nn.Module], attr: str) -> nn.Parameter | None:
    """The models' `attr` tensors stacked on a new leading axis, as one parameter (frozen if
    theirs is)."""
    tensors = [getattr(m, attr) for m in models]
    if tensors[0] is None:
        return None
    return nn.Parameter(torch.stack([t.detach() for t in tensors]), requires_grad=tensors[0].requires_grad)


@_swaps(nn.Linear)
class BatchedLinear(nn.Module):
    """N Linear layers: x (N*B, ..., in) -> (N*B, ..., out), model i on its rows.

    The weight is kept as the GEMM reads it, (N, in, out): model i's Linear weight is
    weight[i].T (StackedModels.state_dict_of transposes it back). Kept as (N, out, in), the
    product would read a transposed view, and autograd would return the weight's gradient as
    a transposed view too, which the fused AdamW kernel cannot pair with the weight
    element by element: one extra copy per Linear per step."""

    transposed = ("weight",)        # parameters held transposed relative to the models' own

    def __init__(self, layers: list[nn.Linear]):
        super().__init__()
        self.n = len(layers)
        self.weight = nn.Parameter(torch.stack([l.weight.detach().t() for l in layers]).contiguous(),
                                   requires_grad=layers[0].weight.requires_grad)   # (N, in, out)
        self.bias = _stacked(layers, "bias")                        # (N, out) or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x = x.reshape(self.n, -1, x.shape[-1])                      # (N, B*..., in)
        # baddbmm writes the broadcast bias into the output before the GEMM (one copy kernel);
        # bmm + add is the same two kernels, and under torch.compile the add fuses
        y = torch.bmm(x, self.weight) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), x, self.weight)
        return y.reshape(*lead, y.shape[-1])


@_swaps(nn.LayerNorm, timm.layers.LayerNorm)   # timm's: F.layer_norm (fast_norm: the same math)
class BatchedLayerNorm(nn.Module):
    """N LayerNorms over the last dimension: normalize, then model i's affine on its rows."""

    def __init__(self, layers: list[nn.LayerNorm]):
        super().__init__()
        self.n, self.normalized_shape, self.eps = len(layers), layers[0].normalized_shape, layers[0].eps
        self.weight = _stacked(layers, "weight")                    # (N, D)
        self.bias = _stacked(layers, "bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, self.normalized_shape, None, None, self.eps).reshape(self.n, -1, x.shape[-1])
        if self.weight is not None:
            y = y * self.weight.unsqueeze(1) if self.bias is None else \
                torch.addcmul(self.bias.unsqueeze(1), y, self.weight.unsqueeze(1))
        elif self.bias is not None:
            y = y + self.bias.unsqueeze(1)
        return y.reshape(x.shape)


@_swaps(nn.Conv2d)
class BatchedConv2d(nn.Module):
    """N Conv2d layers as one grouped convolution: the models' channels side by side."""

    def __init__(self, layers: list[nn.Conv2d]):
        super().__init__()
        c = layers[0]
        self.n, self.groups = len(layers), c.groups
        self.stride, self.padding, self.dilation = c.stride, c.padding, c.dilation
        self.weight = _stacked(layers, "weight")                    # (N, out, in / groups, kh, kw)
        self.bias = _stacked(layers, "bias")                        # (N, out) or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        nb, c, h, w = x.shape
        x = x.reshape(self.n, nb // self.n, c, h, w).transpose(0, 1).reshape(nb // self.n, self.n * c, h, w)
        y = F.conv2d(x, self.weight.flatten(0, 1), None if self.bias is None else self.bias.flatten(),
                     self.stride, self.padding, self.dilation, self.groups * self.n)   # (B, N*out, h', w')
        b, _, h2, w2 = y.shape
        return y.reshape(b, self.n, -1, h2, w2).transpose(0, 1).reshape(nb, -1, h2, w2)


# Modules whose output for one sample depends on the others in the batch, parameters or not.
_BATCH_COUPLING = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)


def is_batched_layer(m: nn.Module) -> bool:
    return type(m) in _SWAPS.values()


def why_not_batched(models: list[nn.Module]) -> str | None:
    """Why these models cannot run as one batched module (None: they can)."""
    first = models[0]
    for name, m in first.named_modules():
        if isinstance(m, _BATCH_COUPLING):        # statistics over the batch would mix the models
            return f"{name or 'model'} is {type(m).__name__} (batch statistics)"
        own = list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False))
        if not own:
            continue
        swap = _SWAPS.get(type(m))
        if swap is BatchedConv2d and m.padding_mode != "zeros":
            return f"{name} pads with {m.padding_mode}"
        if swap is BatchedLayerNorm and len(m.normalized_shape) != 1:
            return f"{name} normalizes over {m.normalized_shape}"
        if swap is not None:
            if list(m.named_buffers(recurse=False)):
                return f"{name} has buffers"
            continue
        others = [o.get_submodule(name) for o in models[1:]]
        for attr, t in own:
            if t.requires_grad:
                return f"{name or 'model'}.{attr} ({type(m).__name__}) trains and has no batched form"
            if any(getattr(o, attr) is not t and not torch.equal(getattr(o, attr), t) for o in others):
                return f"{name or 'model'}.{attr} is frozen but differs between the models"
    return None


def batched_module(models: list[nn.Module]) -> nn.Module | None:
    """One module that runs every model on its slice of an (N*B, ...) batch, or None when
    the architecture has a part with no batched form (see the module docstring)."""
    if why_not_batched(models):
        return None
    batched = copy.deepcopy(models[0])
    for name, m in list(batched.named_modules()):
        swap = _SWAPS.get(type(m))
        if swap is None or not name:
            continue
        parent, _, leaf = name.rpartition(".")
        setattr(batched.get_submodule(parent) if parent else batched, leaf,
                swap([o.get_submodule(name) for o in models]))
    return batched


def _signature(model: torch.nn.Module) -> list[tuple]:
    return ([(n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in model.named_parameters()]
            + [(n, tuple(b.shape), b.dtype) for n, b in model.named_buffers()])


class StackedModels:
    """N models of one architecture as stacked tensors (leading dim N) and one meta module."""

    def __init__(self, models: list[torch.nn.Module], batched: bool = True, plain: bool = True):
        """batched=False: the vmap way even where the batched one exists (tests, benchmarks).
        plain=False: one model stacked all the same (tests: a seed's numbers do not depend on
        the way it trains, beyond float noise)."""
        if not models:
            raise ValueError("StackedModels needs at least one model")
        first = _signature(models[0])
        for i, m in enumerate(models[1:], 1):
            if type(m) is not type(models[0]) or _signature(m) != first:
                raise ValueError(f"model {i} ({type(m).__name__}) differs from model 0 in its "
                                 "parameters or buffers; only models of one architecture stack")
        self.n = len(models)
        self.state_keys = list(models[0].state_dict())     # persistent entries, in module order
        self._transposed: set[str] = set()                  # batched weights held as (N, in, out)
        self.plain = models[0] if self.n == 1 and plain else None
        if self.plain is not None:
            self.batched = None
            self.base = self.plain
            self.trainable_names = [k for k, v in self.plain.named_parameters() if v.requires_grad]
            self._collect_plain()
            return
        self.batched = batched_module(models) if batched else None
        if self.batched is not None:
            # The module's own parameters, in the models' names; shared frozen tensors (the
            # position encoding) are kept once, broadcast as view (N, ...) for state_dict_of.
            self.base = self.batched
            self.trainable_names = [k for k, v in self.batched.named_parameters() if v.requires_grad]
            self._collect_batched()
            return
        params, self.buffers = stack_module_state(models)
        # Plain tensors: gradients come from torch.func.grad, and the optimizer sees .grad set
        # by hand. Frozen parameters (the fixed position encoding, frozen filters) get none.
        self.trainable_names = [k for k, v in params.items() if v.requires_grad]
        self.params = {k: v.detach() for k, v in params.items()}
        self.base = _meta_copy(models[0])                   # the architecture, without weights
        self.base.train(models[0].training)
        self.choose_attention(self.params[next(iter(self.params))].device)

    @property
    def way(self) -> str:
        """How the stack runs, for the log: "plain" (one model), "batched" or "by vmap"."""
        return "plain" if self.plain is not None else "batched" if self.batched is not None else "by vmap"

    @property
    def stacked_dims(self) -> int:
        """Leading model dimensions of the tensors trainable() returns: 0 plain, else 1."""
        return 0 if self.plain is not None else 1

    def _collect_plain(self) -> None:
        self.params = dict(self.plain.named_parameters())
        self.buffers = dict(self.plain.named_buffers())

    def _collect_batched(self) -> None:
        """params/buffers: name -> (N, ...) tensor of the batched module (a shared one as an
        expanded view)."""
        batched_names = {n for n, m in self.batched.named_modules() if is_batched_layer(m)}
        self._transposed = {f"{n}.{attr}" for n, m in self.batched.named_modules()
                            for attr in getattr(m, "transposed", ())}

        def per_model(name, t):
            owner = name.rpartition(".")[0]
            return t if owner in batched_names else t.unsqueeze(0).expand(self.n, *t.shape)
        self.params = {k: per_model(k, v) for k, v in self.batched.named_parameters()}
        self.buffers = {k: per_model(k, v) for k, v in self.batched.named_buffers()}

    def choose_attention(self, device: torch.device, dtype: str = "fp32") -> str:
        """Set the attention kernel the stack runs on `device` in `dtype` ("bf16" | "fp32");
        returns which, for the log. Both compute the same attention to float noise.

        vmap, on CPU: timm's explicit q @ k.T -> softmax -> @ v, which vmaps into batched
        matmuls; the fused kernel (_scaled_dot_product_flash_attention_for_cpu) has no batching
        rule there and would fall back to a per-model loop. CUDA's fused kernels have batching
        rules. Batched: fused, except on CPU in bf16, where the fused kernel's backward dominates
        the step at small head dims and token counts (the digits ViT's: head dim 16, 64
        tokens), making the step slower than with explicit attention; in fp32 the fused kernel
        is the faster one."""
        fused = device.type != "cpu" or (self.way != "by vmap" and dtype != "bf16")
        for m in self.base.modules():
            if hasattr(m, "fused_attn"):
                if not hasattr(m, "fused_attn_default"):
                    m.fused_attn_default = m.fused_attn          # timm's own choice
                m.fused_attn = fused and m.fused_attn_default
        return "fused attention" if fused else "explicit attention"

    def replica(self) -> "StackedModels":
        """The same tensors behind another module: functional_call swaps tensors into its
        module while it runs, so each thread that runs the stack needs its own. (The batched
        module holds its tensors and changes no state in a forward: threads share it.)"""
        if self.batched is not None or self.plain is not None:
            return self
        other = copy.copy(self)
        other.base = copy.deepcopy(self.base)
        return other

    def to(self, device: torch.device) -> "StackedModels":
        # Moving creates new leaves: done before an optimizer is built over them.
        if self.plain is not None:
            self.plain.to(device)
            self._collect_plain()
            return self
        if self.batched is not None:
            self.batched.to(device)
            self._collect_batched()
            return self
        self.params = {k: v.to(device) for k, v in self.params.items()}
        self.buffers = {k: v.to(device) for k, v in self.buffers.items()}
        self.choose_attention(torch.device(device))
        return self

    def train(self, mode: bool = True) -> "StackedModels":
        self.base.train(mode)
        return self

    def eval(self) -> "StackedModels":
        return self.train(False)

    def trainable(self) -> dict[str, torch.Tensor]:
        """name -> stacked tensor (N, *shape) of every parameter that trains."""
        return {k: self.params[k] for k in self.trainable_names}

    def __call__(self, x: torch.Tensor, shared_input: bool = False) -> torch.Tensor:
        """x: (N, B, ...) one batch per model, or (B, ...) seen by all with shared_input=True.
        Returns (N, B, ...) outputs. No gradients: see `loss_and_grads`."""
        if self.plain is not None:
            with torch.no_grad():
                return self.plain(x if shared_input else x[0]).unsqueeze(0)
        if self.batched is not None:
            x = x.expand(self.n, *x.shape) if shared_input else x
            with torch.no_grad():
                out = self.batched(x.flatten(0, 1))
            return out.view(self.n, -1, *out.shape[1:])
        def one(params, buffers, xi):
            return functional_call(self.base, (params, buffers), (xi,))
        return vmap(one, in_dims=(0, 0, None if shared_input else 0))(self.params, self.buffers, x)

    def forward_and_loss(self, x: torch.Tensor, y: torch.Tensor,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         context: Callable = contextlib.nullcontext) -> tuple[torch.Tensor, torch.Tensor]:
        """(each model's loss (N,), logits (N, B, ...)) of the plain or batched module on x
        (N, B, ...), with autograd recording: what torch.compile compiles (step.Objective)."""
        module = self.plain if self.plain is not None else self.batched
        with context():
            out = module(x.flatten(0, 1))
        logits = out.view(self.n, -1, *out.shape[1:])                         # (N, B, ...)
        return loss_fn(logits, y), logits                                     # (N,): one call

    def loss_and_grads(self, x: torch.Tensor, y: torch.Tensor,
                       loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                       context: Callable = contextlib.nullcontext, forward: Callable | None = None):
        """x (N, B, ...), y (N, B) -> (each model's gradient of its loss: {name: (N, *shape)}
        for the trainable parameters (plain: the parameter's own shape), losses (N,), logits
        (N, B, ...)). loss_fn(logits (..., B, classes), labels (..., B)) -> (...,): each
        model's mean loss, called once for every model (mean_cross_entropy), or, by vmap, once
        per model. context() is entered around each forward (e.g. autocast). forward:
        forward_and_loss or its compiled form (the plain and batched ways)."""
        if self.plain is not None or self.batched is not None:
            trainable = self.trainable()
            with torch.enable_grad():
                losses, logits = (forward or self.forward_and_loss)(x, y, loss_fn, context)
                # d(sum of the models' losses)/d(model i's weights) = d(model i's loss)/d(them)
                grads = torch.autograd.grad(losses.sum(), list(trainable.values()), allow_unused=True,
                                            materialize_grads=True)      # unused: zeros, as vmap's
            return dict(zip(trainable, grads)), losses.detach(), logits.detach()
        frozen = {k: v for k, v in self.params.items() if k not in self.trainable_names}

        def one(trainable, frozen, buffers, xi, yi):
            with context():
                logits = functional_call(self.base, ({**trainable, **frozen}, buffers), (xi,))
            loss = loss_fn(logits, yi)
            return loss, (loss.detach(), logits.detach())

        grads, (losses, logits) = vmap(grad(one, has_aux=True))(self.trainable(), frozen, self.buffers, x, y)
        return grads, losses, logits

    def state_dict_of(self, i: int) -> dict[str, torch.Tensor]:
        """Model i's state_dict (same keys as the module's), as copies: torch.save of a view
        would write the whole stacked storage."""
        tensors = {**self.params, **self.buffers}
        if self.plain is not None:
            assert i == 0, i
            return {k: tensors[k].detach().clone() for k in self.state_keys}
        return {k: self.in_model_layout(k, tensors[k][i]).detach().clone(memory_format=torch.contiguous_format)
                for k in self.state_keys}

    def in_model_layout(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """A tensor of parameter `name` in the stack's layout (a model's slice of it, its
        gradient, or its optimizer moment) as the model's own parameter is laid out: the batched
        Linear weights are held transposed (batched.BatchedLinear)."""
        return t.transpose(-1, -2) if name in self._transposed else t

    def model_slice(self, t: torch.Tensor, i: int) -> torch.Tensor:
        """Model i's part of a tensor shaped like a trainable() one (e.g. an optimizer moment),
        in the stack's layout (what stack_slices undoes)."""
        return t if self.plain is not None else t[i]

    def stack_slices(self, slices: list[torch.Tensor]) -> torch.Tensor:
        """The inverse of model_slice over every model."""
        return slices[0] if self.plain is not None else torch.stack(slices)

    def clip_grad_norms(self, max_norm: float) -> torch.Tensor:
        """Each model's gradients clipped to total norm max_norm (as timm's train.py clips one
        model): returns the N norms before clipping."""
        params = [p for p in self.trainable().values() if p.grad is not None]
        if self.plain is not None:
            # timm's own clip: two foreach kernels for all tensors
            return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True).view(1)
        return clip_grad_norm_per_model(params, max_norm)


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with every parameter and buffer on the meta device, made without
    copying their data (deepcopy-then-.to("meta") copies it first, and cannot move the fake
    tensors the memory estimate runs on)."""
    def meta(t):
        m = torch.empty_like(t, device="meta")
        return torch.nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else m
    memo = {id(t): meta(t) for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def set_grads(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
    """p.grad = grads[name], in the parameter's own memory layout: gradients from
    torch.func.grad may come as strided views (e.g. transposed), and the fused AdamW kernel
    pairs a parameter's elements with its gradient's by memory order."""
    for name, p in params.items():
        g = grads[name]
        p.grad = g if g.stride() == p.stride() else torch.empty_like(p).copy_(g)


def mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Each model's mean (label-smoothed) cross-entropy, in fp32, in one call for all models:
    logits (..., B, classes), labels (..., B) -> (...,). The per-image losses of every model
    come from one kernel sequence (a loss call per model cost ~25 kernels per model a step)."""
    per_image = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                reduction="none", label_smoothing=label_smoothing)
    return per_image.view(labels.shape).mean(-1)


@torch.no_grad()
def clip_grad_norm_per_model(stacked: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for each model of a stack: model i's gradients (slice i
    of every tensor) are scaled by min(1, max_norm / (||g_i|| + 1e-6)), its own total norm.
    Returns the N norms before clipping. The norms take two kernels for the whole stack (the
    gradients side by side as (N, total size), then one reduction), where a norm per tensor
    took one each; the scaling is one in-place multiply per tensor."""
    grads = [p.grad for p in stacked if p.grad is not None]
    if not grads:
        return torch.zeros(0)
    n = grads[0].shape[0]
    side_by_side = torch.cat([g.reshape(n, -1) for g in grads], dim=1)      # (N, total)
    total = torch.linalg.vector_norm(side_by_side, dim=1, dtype=torch.float32)   # (N,)
    del side_by_side
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.ndim - 1)).to(g.dtype))
    return total


# The CPU's answer does not change within a process: asked once.
cpu_has_native_bf16 = functools.cache(numerics.cpu_has_native_bf16)


def compute_dtype(cfg: TrainConfig, device: torch.device, model: torch.nn.Module | None = None) -> str:
    """What the step computes in: "bf16" (autocast) or "fp32"; a run asks once and passes the
    answer on (autocast, the checkpoint's fingerprint, the memory estimate). amp='auto': bf16
    on CUDA cards with native bf16 (compute capability 8.0 and newer: the paper trains with
    mixed precision) and on CPUs with native bf16 instructions (AVX512-BF16 or AMX, where bf16
    is the faster), unless `model` has BatchNorm (the CPU kernel takes no bf16 input with fp32
    statistics); fp32 on older cards (no native bf16: emulated or refused by some kernels, and
    fp16 would need a loss scaler the stacked step does not have) and on other CPUs, where
    bf16 is emulated and slower than fp32. 'bf16' everywhere; 'off': fp32. precision_note
    says why, for the log."""
    if cfg.amp == "auto":
        if device.type == "cuda":
            return "bf16" if cuda_has_native_bf16(device) else "fp32"
        has_batchnorm = model is not None and any(
            isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in model.modules())
        return "bf16" if device.type == "cpu" and cpu_has_native_bf16() and not has_batchnorm else "fp32"
    return "bf16" if cfg.amp == "bf16" else "fp32"


def cuda_has_native_bf16(device: torch.device) -> bool:
    """Compute capability 8.0 (Ampere) or newer: bf16 tensor cores."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def precision_note(cfg: TrainConfig, device: torch.device, dtype: str) -> str:
    """Why amp='auto' chose fp32 on this GPU ("" when it did not, and on the CPU, whose rule
    compute_dtype states): for the log and the run's record."""
    if cfg.amp != "auto" or dtype != "fp32" or device.type != "cuda":
        return ""
    major, minor = torch.cuda.get_device_capability(device)
    return (f"fp32: {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) has no native "
            "bf16 (Ampere, 8.0, and newer do)")


def autocast(device: torch.device, dtype: str, cache: bool = True):
    """The autocast context of a run that computes in `dtype` (compute_dtype's answer). cache:
    autocast's cache of each weight's cast within a forward (off inside a captured CUDA graph)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16", cache_enabled=cache)


# Compiling and capturing happen over the first calls (dynamo traces on the first; a CUDA graph
# tree warms up on the first and records on the second or third): a failure in any of them,
# forward or backward, falls back to eager. Past them a failure is a real error and is raised.
# Calls, not steps: a step split in pieces (micro-batches, the CPU's chunks) calls once a piece,
# and each call of the compiled function is what compiles, warms up or records.
GUARDED_CALLS = 3


# torch.compile functions that failed in this process: later cells (a cell's seeds trained one
# after another, each a call of train_models) do not try again and warn again. Keyed by the
# function itself, so a test that swaps in a broken torch.compile leaves the real one untried.
_FAILED_COMPILERS: "weakref.WeakSet" = weakref.WeakSet()


class Objective:
    """objective(replica, x, y) -> (gradients {trainable name: (N, ...)}, each model's mean
    label-smoothed loss (N,), logits (N, B, classes)): StackedModels.loss_and_grads with the
    recipe's loss, in autocast of the run's dtype, on a replica of the stack (a chunk's thread
    has its own).

    Compiled by torch.compile where cfg.compile says (auto: on CUDA; off on the CPU, where the
    committed bytes are eager's; never the vmap way, which does not trace), else eager; `how`
    says which, for the log. A host-bound stack on CUDA is compiled in reduce-overhead mode
    (its forward and backward replayed as CUDA graphs). A machine where compiling or capturing
    fails, in the forward or the backward, gets a one-line warning and the eager step (the
    failed call re-run eager, nothing lost; the compiled graphs dropped). An error that leaves
    the CUDA context unusable (an illegal memory access) fails the eager re-run as well: that
    one is raised. Inductor keeps what it compiled on disk (its FX graph cache), so a second
    process of the same recipe pays far less."""

    def __init__(self, stack: StackedModels, cfg: TrainConfig, device: torch.device, dtype: str,
                 graphed: bool = False):
        """graphed: the step around this objective is captured whole (StepGraph): compiled in
        default mode, whose kernels the step's graph holds (reduce-overhead's own graphs cannot
        nest in it), and with autocast's cast cache off, as PyTorch's CUDA-graph notes ask of
        autocast inside a capture."""
        self.loss = functools.partial(mean_cross_entropy, label_smoothing=cfg.label_smoothing)
        self.context = functools.partial(autocast, device, dtype, cache=not graphed)
        self.device = device
        self.compiled, self.how, self.host_bound = None, "", False
        self._calls, self._failed, self._trusted = 0, False, False   # trusted: the guarded calls all succeeded
        # the CPU's chunks call from threads: the guarded calls run one at a time (the first
        # compiles while the others wait), so one failure warns once and the rest run eager
        self._guard = threading.Lock()
        on = cfg.compile == "on" or (cfg.compile == "auto" and device.type == "cuda")
        if not on or stack.way == "by vmap":
            return
        if torch.compile in _FAILED_COMPILERS:
            self.how = "eager (torch.compile failed earlier in this process)"
            return
        self.host_bound = device.type == "cuda" and stack.way != "plain" and not graphed
        mode = "reduce-overhead" if self.host_bound else None
        self._compiler = torch.compile
        self.compiled = self._compiler(stack.forward_and_loss, mode=mode)
        self.how = f"compiled ({mode or 'default'} mode)"

    def eager(self, replica: StackedModels, x: torch.Tensor, y: torch.Tensor):
        return replica.loss_and_grads(x, y, self.loss, self.context)

    def __call__(self, replica: StackedModels, x: torch.Tensor, y: torch.Tensor):
        if self.compiled is None or self._failed:
            return self.eager(replica, x, y)
        if self._trusted:
            if self.host_bound:
                torch.compiler.cudagraph_mark_step_begin()     # the last step's graph outputs are done with
            return replica.loss_and_grads(x, y, self.loss, self.context, self.compiled)
        with self._guard:
            if self._failed or self._trusted:
                return self(replica, x, y)
            self._calls += 1
            try:
                if self.host_bound:
                    torch.compiler.cudagraph_mark_step_begin()
                out = replica.loss_and_grads(x, y, self.loss, self.context, self.compiled)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)        # a failed kernel surfaces here, not steps later
                self._trusted = self._calls >= GUARDED_CALLS
                return out
            except Exception as e:                         # noqa: BLE001 (any compiler failure: run eager)
                first = str(e).splitlines()[0][:200] if str(e) else ""
                print(f"warning: torch.compile failed ({type(e).__name__}: {first}); training eager "
                      "(compile: off in the recipe skips the attempt)")
                self._failed = True
                _FAILED_COMPILERS.add(self._compiler)
                torch.compiler.reset()                     # the graphs and any CUDA-graph memory pool
                return self.eager(replica, x, y)


MIN_CHUNK = 16          # below this, per-chunk Python overhead eats the gain


def why_not_splittable(model: torch.nn.Module) -> str | None:
    """Why a batch of this model cannot be split into pieces whose summed gradients are the
    whole batch's (None: it can)."""
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            return f"{name or 'model'} is {type(m).__name__} (batch statistics)"
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            p = m.p
        else:
            p = getattr(m, "drop_prob", 0.0)      # timm's DropPath
        if p:
            return f"{name} is {type(m).__name__}(p={p}) (random masks from a shared RNG)"
    return None


def plan_gradients(setting: str | int, stack: StackedModels, device: torch.device, batch_size: int,
                   objective: Callable, *, micro_batch: int | None = None
                   ) -> tuple["WholeBatchGradients | ChunkedGradients", str]:
    """How a step computes its gradients, and why (for the log): ChunkedGradients where
    plan_cpu_chunks splits the batch, WholeBatchGradients otherwise. objective(replica, x, y):
    an Objective. micro_batch (images per model per pass, smaller than the batch): the
    whole-batch way in pieces, one after another, on any device; it replaces the CPU's chunks
    (a memory limit comes first) and is refused where splitting a batch changes the step."""
    if micro_batch is not None and micro_batch < batch_size:
        if micro_batch < 1:
            raise ValueError(f"micro_batch={micro_batch}: give a positive number of images, or None")
        why = why_not_splittable(stack.base)
        if why:
            raise ValueError(f"micro-batches of {micro_batch} images are not the same step for this model: "
                             f"{why}; unset STRUCTINIT_MICRO_BATCH (or give it >= the batch, {batch_size})")
        pieces = -(-batch_size // micro_batch)
        return (WholeBatchGradients(stack, objective, micro_batch),
                f"{pieces} micro-batches of <= {micro_batch} images per model, one after another")
    chunks, how = plan_cpu_chunks(setting, stack.base, device, batch_size)
    gradients = ChunkedGradients(stack, chunks, objective) if chunks > 1 else WholeBatchGradients(stack, objective)
    return gradients, how


def plan_cpu_chunks(setting: str | int, model: torch.nn.Module, device: torch.device,
                    batch_size: int) -> tuple[int, str]:
    """How many chunks a step runs as, and why. setting: "auto" (one per intra-op thread: more
    chunks than threads only queue on them) or a positive int (1 = off), as validated by
    TrainConfig."""
    explicit = setting != "auto"
    wanted = setting if explicit else min(torch.get_num_threads(), batch_size // MIN_CHUNK)
    if wanted <= 1:
        return 1, "one chunk"
    if device.type != "cpu":                      # the same params.yaml runs on CPU and GPU
        return 1, f"one chunk (cpu_chunks applies to CPU only, this is {device.type})"
    why = (f"more chunks than the batch has images ({batch_size})" if wanted > batch_size
           else why_not_splittable(model))
    if why is None:
        return wanted, f"{wanted} chunks of ~{batch_size // wanted} images per model, one thread each"
    if explicit:
        raise ValueError(f"cpu_chunks={setting} is not possible here: {why}; use cpu_chunks=1")
    return 1, f"one chunk ({why})"


def _sums(losses: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's (sum of per-image losses, n correct) from its mean loss (N,), logits
    (N, B, classes) and labels (N, B)."""
    return losses * y.shape[1], (logits.argmax(-1) == y).sum(1)


class WholeBatchGradients:
    """The batch's gradients with the process's intra-op threads: in one pass, or in pieces of
    `micro_batch` images per model, one after another, each piece's gradients weighted by its
    share of the batch and summed in order (the one-pass step's, to float noise).
    submit(x, y) computes; collect(pending) sets .grad and returns (loss_sum, correct)."""

    def __init__(self, stack: StackedModels, objective: Callable, micro_batch: int | None = None):
        self.stack, self.objective, self.micro_batch = stack, objective, micro_batch

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def all_threads(self):
        return contextlib.nullcontext()

    def submit(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
        n = y.shape[1]
        if not self.micro_batch or self.micro_batch >= n:
            grads, losses, logits = self.objective(self.stack, x, y)
            return grads, _sums(losses, logits, y)
        total, loss_sum, correct = None, 0, 0
        for xc, yc in zip(x.split(self.micro_batch, 1), y.split(self.micro_batch, 1)):
            grads, losses, logits = self.objective(self.stack, xc, yc)   # (N, b, ...) pieces
            weight = yc.shape[1] / n
            total = ({k: g * weight for k, g in grads.items()} if total is None
                     else {k: total[k] + g * weight for k, g in grads.items()})
            s_loss, s_correct = _sums(losses, logits, yc)
            loss_sum, correct = loss_sum + s_loss, correct + s_correct
        return total, (loss_sum, correct)

    def collect(self, pending: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        grads, sums = pending
        set_grads(self.stack.trainable(), grads)
        return sums


class ChunkedGradients:
    """A stacked batch's gradients as `chunks` single-threaded pieces in parallel.

    Inside `with`, torch runs one intra-op thread per Python thread (process-wide:
    torch.set_num_threads), restored on exit; all_threads() gives them back meanwhile (the
    evaluation).
    """

    def __init__(self, stack: StackedModels, chunks: int, objective: Callable):
        """objective runs on each chunk's thread (so whatever it enters, e.g. autocast, which
        is per thread, applies there) with that thread's replica."""
        self.chunks, self.objective = chunks, objective
        # functional_call swaps tensors into its module while it runs: one module per thread.
        self.replicas = [stack] + [stack.replica() for _ in range(chunks - 1)]
        self.params = stack.trainable()
        self._pool: ThreadPoolExecutor | None = None
        self._threads = None

    def __enter__(self):
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        # One worker per intra-op thread there was; more chunks than that queue up on them.
        self._pool = ThreadPoolExecutor(min(self.chunks, self._threads), thread_name_prefix="structinit-chunk")
        return self

    def __exit__(self, *exc):
        self._pool.shutdown()
        torch.set_num_threads(self._threads)

    @contextlib.contextmanager
    def all_threads(self):
        """Give the main thread its intra-op threads back, e.g. for evaluation."""
        torch.set_num_threads(self._threads)
        try:
            yield
        finally:
            torch.set_num_threads(1)

    def _one_chunk(self, replica, x, y, weight):
        grads, losses, logits = self.objective(replica, x, y)
        return {k: g * weight for k, g in grads.items()}, _sums(losses, logits, y)

    def submit(self, x: torch.Tensor, y: torch.Tensor) -> list:
        """Start the chunks (slices of B) on the pool; the caller may work meanwhile."""
        n = y.shape[1]
        return [self._pool.submit(self._one_chunk, replica, xc, yc, yc.shape[1] / n)
                for replica, xc, yc in zip(self.replicas, x.tensor_split(self.chunks, 1),
                                           y.tensor_split(self.chunks, 1))]

    def collect(self, pending: list) -> tuple[torch.Tensor, torch.Tensor]:
        results = [f.result() for f in pending]   # fixed order: deterministic sums
        set_grads(self.params, {k: functools.reduce(torch.add, [g[k] for g, _ in results])
                                for k in self.params})
        return sum(s[0] for _, s in results), sum(s[1] for _, s in results)
