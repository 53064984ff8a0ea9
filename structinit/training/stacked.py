"""Several models of one architecture run as one: every op does N models' work in one call.

    stack = StackedModels([model_a, model_b])    # same architecture, any weights
    logits = stack(x)                            # x (N, B, ...) -> (N, B, classes)
    stack.state_dict_of(1)                       # model_b's trained weights, model_b's keys

The default ViT (width 48, 64 tokens, batch 64) is so small that a step is mostly per-op overhead, so five
stacked models cost little more than one. Three ways run a stack: plain (one model: timm's module as is, as a
stack of one only adds kernels); batched (ViTs: Linear/LayerNorm/Conv2d swapped for layers with a model axis,
attention one fused SDPA call; plain autograd); vmap (the rest, e.g. ConvMixer's BatchNorm: stack_module_state
and vmap(grad(functional_call)); functional, as under vmap autocast silently stays fp32 for tensors that require
grad; running stats are stacked buffers). Gradients are per model by construction, so per-model clipping and
AdamW keep each model's update what it would be alone. A step's batch may be split (micro-batches; on CPU,
single-threaded chunks on threads, as intra-op fork/join costs more than a small ViT's ops), pieces weighted by
batch share: exact only if the forward treats samples independently (why_not_splittable).
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
    """Register a batched layer for these exact types (a subclass may compute something else)."""
    def register(cls):
        _SWAPS.update(dict.fromkeys(kinds, cls))
        return cls
    return register


def _stacked(models: list[nn.Module], attr: str) -> nn.Parameter | None:
    """The models' `attr` tensors stacked on a new leading axis, one parameter (frozen if theirs is)."""
    tensors = [getattr(m, attr) for m in models]
    if tensors[0] is None:
        return None
    return nn.Parameter(torch.stack([t.detach() for t in tensors]), requires_grad=tensors[0].requires_grad)


@_swaps(nn.Linear)
class BatchedLinear(nn.Module):
    """N Linear layers: x (N*B, ..., in) -> (N*B, ..., out), model i on its rows. The weight is held as the
    GEMM reads it, (N, in, out): as (N, out, in) its gradient would be a transposed view that fused AdamW copies."""

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
        # baddbmm is a bias copy + GEMM, the same two kernels as bmm + add (whose add fuses when compiled)
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


# Modules whose output for one sample depends on the rest of the batch, parameters or not.
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
    """One module running each model on its slice of an (N*B, ...) batch; None if a part has no batched form."""
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
        """batched=False: vmap even where batching works; plain=False: stack one model anyway (tests compare ways)."""
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
            # shared frozen tensors (the position encoding) are kept once, seen as (N, ...) views
            self.base = self.batched
            self.trainable_names = [k for k, v in self.batched.named_parameters() if v.requires_grad]
            self._collect_batched()
            return
        params, self.buffers = stack_module_state(models)
        # Plain tensors: torch.func.grad gives the gradients, .grad is set by hand; frozen ones get none.
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
        """params/buffers: name -> (N, ...) tensor of the batched module (a shared one as an expanded view)."""
        batched_names = {n for n, m in self.batched.named_modules() if is_batched_layer(m)}
        self._transposed = {f"{n}.{attr}" for n, m in self.batched.named_modules()
                            for attr in getattr(m, "transposed", ())}

        def per_model(name, t):
            owner = name.rpartition(".")[0]
            return t if owner in batched_names else t.unsqueeze(0).expand(self.n, *t.shape)
        self.params = {k: per_model(k, v) for k, v in self.batched.named_parameters()}
        self.buffers = {k: per_model(k, v) for k, v in self.batched.named_buffers()}

    def choose_attention(self, device: torch.device, dtype: str = "fp32") -> str:
        """Set fused or explicit attention (equal to float noise) for `device`, `dtype`; returns which. Explicit
        on CPU under vmap (the fused kernel has no batching rule: a per-model loop) and on CPU in bf16, where the
        fused backward dominates at the digits ViT's head dim 16 and 64 tokens."""
        fused = device.type != "cpu" or (self.way != "by vmap" and dtype != "bf16")
        for m in self.base.modules():
            if hasattr(m, "fused_attn"):
                if not hasattr(m, "fused_attn_default"):
                    m.fused_attn_default = m.fused_attn          # timm's own choice
                m.fused_attn = fused and m.fused_attn_default
        return "fused attention" if fused else "explicit attention"

    def replica(self) -> "StackedModels":
        """The same tensors behind another module, for another thread: functional_call swaps tensors
        into its module. Batched and plain modules change no state in a forward: threads share them."""
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
        """x (N, B, ...), or (B, ...) for all with shared_input -> (N, B, ...); no grad (see loss_and_grads)."""
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
        """(losses (N,), logits (N, B, ...)) of the plain or batched module, with autograd: what Objective compiles."""
        module = self.plain if self.plain is not None else self.batched
        with context():
            out = module(x.flatten(0, 1))
        logits = out.view(self.n, -1, *out.shape[1:])                         # (N, B, ...)
        return loss_fn(logits, y), logits                                     # (N,): one call

    def loss_and_grads(self, x: torch.Tensor, y: torch.Tensor,
                       loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                       context: Callable = contextlib.nullcontext, forward: Callable | None = None):
        """x (N, B, ...), y (N, B) -> ({name: gradient (N, *shape), plain: own shape}, losses (N,), logits).
        loss_fn(logits (..., B, classes), labels (..., B)) -> (...,) mean losses, one call for all models (per
        model under vmap). context() wraps each forward (autocast); forward: forward_and_loss or its compiled form."""
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
        """Model i's state_dict, as copies: torch.save of a view would write the whole stacked storage."""
        tensors = {**self.params, **self.buffers}
        if self.plain is not None:
            assert i == 0, i
            return {k: tensors[k].detach().clone() for k in self.state_keys}
        return {k: self.in_model_layout(k, tensors[k][i]).detach().clone(memory_format=torch.contiguous_format)
                for k in self.state_keys}

    def in_model_layout(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """Parameter `name`'s tensor (a slice, gradient or moment) in the model's layout (BatchedLinear transposes)."""
        return t.transpose(-1, -2) if name in self._transposed else t

    def model_slice(self, t: torch.Tensor, i: int) -> torch.Tensor:
        """Model i's part of a trainable()-shaped tensor (e.g. an optimizer moment), in the stack's layout."""
        return t if self.plain is not None else t[i]

    def stack_slices(self, slices: list[torch.Tensor]) -> torch.Tensor:
        """The inverse of model_slice over every model."""
        return slices[0] if self.plain is not None else torch.stack(slices)

    def clip_grad_norms(self, max_norm: float) -> torch.Tensor:
        """Clip each model's gradients to total norm max_norm, as timm's train.py; returns the N norms before."""
        params = [p for p in self.trainable().values() if p.grad is not None]
        if self.plain is not None:
            # timm's own clip: two foreach kernels for all tensors
            return torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True).view(1)
        return clip_grad_norm_per_model(params, max_norm)


def _meta_copy(model: torch.nn.Module) -> torch.nn.Module:
    """`model` on the meta device, no data copied (deepcopy + .to("meta") copies, and can't move fake tensors)."""
    def meta(t):
        m = torch.empty_like(t, device="meta")
        return torch.nn.Parameter(m, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else m
    memo = {id(t): meta(t) for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


def set_grads(params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> None:
    """p.grad = grads[name] in p's layout: func.grad may give strided views; fused AdamW pairs them by memory order."""
    for name, p in params.items():
        g = grads[name]
        p.grad = g if g.stride() == p.stride() else torch.empty_like(p).copy_(g)


def mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Each model's mean label-smoothed cross-entropy in fp32: logits (..., B, classes), labels (..., B)
    -> (...,). One call for all models: a call per model cost ~25 kernels per model a step."""
    per_image = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                reduction="none", label_smoothing=label_smoothing)
    return per_image.view(labels.shape).mean(-1)


@torch.no_grad()
def clip_grad_norm_per_model(stacked: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """clip_grad_norm_ per model: slice i of every gradient scaled by min(1, max_norm / (||g_i|| + 1e-6));
    returns the N norms before. The norms take two kernels for the stack, not one per tensor."""
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
    """"bf16" (autocast) or "fp32", decided once per run and passed on (autocast, checkpoint fingerprint, memory
    estimate). amp='auto': bf16 on CUDA with compute capability 8.0+ (the paper trains in mixed precision) and on
    CPUs with native bf16 (AVX512-BF16, AMX) unless `model` has BatchNorm (no CPU kernel for bf16 input with fp32
    statistics); else fp32, as bf16 is emulated, slow or refused and fp16 would need a loss scaler the step lacks."""
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
    """Why amp='auto' chose fp32 on this GPU, for the log and run record ("" otherwise, and on CPU)."""
    if cfg.amp != "auto" or dtype != "fp32" or device.type != "cuda":
        return ""
    major, minor = torch.cuda.get_device_capability(device)
    return (f"fp32: {torch.cuda.get_device_name(device)} (compute capability {major}.{minor}) has no native "
            "bf16 (Ampere, 8.0, and newer do)")


def autocast(device: torch.device, dtype: str, cache: bool = True):
    """Autocast for a run computing in `dtype`; cache: the per-forward weight-cast cache (off in a CUDA graph)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16", cache_enabled=cache)


# Compiling spans the first calls (dynamo traces on the 1st; a CUDA graph tree warms up on the 1st, records on the
# 2nd/3rd): failures there, forward or backward, fall back to eager; later ones raise. Calls: one per step piece.
GUARDED_CALLS = 3


# torch.compile functions that failed in this process, so later cells neither retry nor warn again.
# Keyed by the function, so a test's broken stand-in leaves the real torch.compile untried.
_FAILED_COMPILERS: "weakref.WeakSet" = weakref.WeakSet()


class Objective:
    """objective(replica, x, y) -> (grads {name: (N, ...)}, mean label-smoothed losses (N,), logits (N, B, C)),
    under the run's autocast, on a replica (one per chunk thread). Compiled where cfg.compile says (auto: CUDA
    only, as the CPU's committed numbers are eager's; never vmap, which does not trace); `how` says which.
    Host-bound CUDA stacks use reduce-overhead (CUDA graphs). A failure to compile or capture warns once and
    re-runs the call eager, graphs dropped; one that breaks the CUDA context fails the re-run too and is raised.
    Inductor's FX graph cache makes a second process of the same recipe much cheaper."""

    def __init__(self, stack: StackedModels, cfg: TrainConfig, device: torch.device, dtype: str,
                 graphed: bool = False):
        """graphed: the whole step is captured (StepGraph), so default mode (reduce-overhead's graphs
        cannot nest in it) and no autocast cast cache, as PyTorch's CUDA-graph notes ask."""
        self.loss = functools.partial(mean_cross_entropy, label_smoothing=cfg.label_smoothing)
        self.context = functools.partial(autocast, device, dtype, cache=not graphed)
        self.device = device
        self.compiled, self.how, self.host_bound = None, "", False
        self._calls, self._failed, self._trusted = 0, False, False   # trusted: the guarded calls all succeeded
        # CPU chunks call from threads: guarded calls run one at a time, so a failure warns once
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
    """Why this model's batch cannot be split into pieces whose summed gradients are the whole's (None: it can)."""
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
    """(gradients, why, for the log): ChunkedGradients where plan_cpu_chunks splits the batch, else
    WholeBatchGradients. micro_batch (images per model per pass, < batch) runs the batch in sequential pieces
    on any device, overrides CPU chunks (memory first), and is refused where splitting changes the step."""
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
    """(chunks, why). setting: "auto" (one per intra-op thread; more would only queue) or an int (1 = off)."""
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
    """Each model's (loss sum, n correct) from mean losses (N,), logits (N, B, classes), labels (N, B)."""
    return losses * y.shape[1], (logits.argmax(-1) == y).sum(1)


class WholeBatchGradients:
    """The batch's gradients on the intra-op threads, in one pass or in sequential micro-batches weighted by
    batch share (the one-pass result, to float noise). submit(x, y) computes; collect(pending) sets .grad."""

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
    """The batch's gradients as `chunks` single-threaded pieces in parallel. Inside `with`, torch has one intra-op
    thread per Python thread (process-wide), restored on exit; all_threads() restores it meanwhile (evaluation)."""

    def __init__(self, stack: StackedModels, chunks: int, objective: Callable):
        """objective runs on each chunk's thread (so per-thread state such as autocast applies there)."""
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
