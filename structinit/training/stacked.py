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
"""
from __future__ import annotations

import contextlib
import copy

import torch
from typing import Callable

import torch.nn.functional as F
from torch.func import functional_call, grad, stack_module_state, vmap

from structinit.training.batched import batched_module, is_batched_layer


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
