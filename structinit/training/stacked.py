"""Several models of one architecture run as one: every op does N models' work in one call.

    stack = StackedModels([model_a, model_b])    # same architecture, any weights
    logits = stack(x)                            # x (N, B, ...) -> (N, B, classes)
    stack.state_dict_of(1)                       # model_b's trained weights, model_b's keys

Why: the embedded default's ViT (width 48, 64 tokens, batch 64) is so small that a training
step is mostly per-op overhead (Python, dispatch, thread fork/join); five such models
stacked cost little more per step than one (benchmarks/stacked_throughput.py).

How, two ways behind one interface:
- batched (batched.py), where the architecture allows (the project's ViTs): timm's module
  runs unchanged on all N*B samples, its Linear/LayerNorm/Conv2d layers swapped for ones
  whose weights carry the model axis (batched matmuls over models), attention one fused
  `scaled_dot_product_attention` call over models x batch x heads; plain autograd.
- vmap, for the rest (BatchNorm: ConvMixer): `torch.func.stack_module_state` gives each
  parameter and buffer a leading model dimension, and `vmap(functional_call)` runs the
  unchanged timm module over it; gradients by `vmap(grad(one model's loss))` (functorch's
  model-ensembling recipe). Functional gradients, not `.backward()` on leaves that require
  grad: under vmap, autocast silently stays in fp32 for tensors that require grad (torch
  2.14). BatchNorm's running statistics are stacked buffers, updated in place per model.
Either way gradients are per model by construction, and per-model gradient clipping
(`clip_grad_norm_per_model`) and an elementwise optimizer (AdamW) keep every model's update
what it would be alone.
"""
from __future__ import annotations

import contextlib
import copy

import torch
from typing import Callable

from torch.func import functional_call, grad, stack_module_state, vmap

from structinit.training.batched import batched_module, is_batched_layer


def _signature(model: torch.nn.Module) -> list[tuple]:
    return ([(n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in model.named_parameters()]
            + [(n, tuple(b.shape), b.dtype) for n, b in model.named_buffers()])


class StackedModels:
    """N models of one architecture as stacked tensors (leading dim N) and one meta module."""

    def __init__(self, models: list[torch.nn.Module], batched: bool = True):
        """batched=False: the vmap way even where the batched one exists (tests, benchmarks)."""
        if not models:
            raise ValueError("StackedModels needs at least one model")
        first = _signature(models[0])
        for i, m in enumerate(models[1:], 1):
            if type(m) is not type(models[0]) or _signature(m) != first:
                raise ValueError(f"model {i} ({type(m).__name__}) differs from model 0 in its "
                                 "parameters or buffers; only models of one architecture stack")
        self.n = len(models)
        self.state_keys = list(models[0].state_dict())     # persistent entries, in module order
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

    def _collect_batched(self) -> None:
        """params/buffers: name -> (N, ...) tensor of the batched module (a shared one as an
        expanded view)."""
        batched_names = {n for n, m in self.batched.named_modules() if is_batched_layer(m)}

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
        the step at this model's shapes (head dim 16, 64 tokens: 61 % of a step; the whole step
        2.8x slower than with explicit attention on a Zen 4 with AVX512-BF16); in fp32 the fused
        kernel is the faster one (`python -m benchmarks.attention_kernels` measures all four)."""
        fused = device.type != "cpu" or (self.batched is not None and dtype != "bf16")
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
        if self.batched is not None:
            return self
        other = copy.copy(self)
        other.base = copy.deepcopy(self.base)
        return other

    def to(self, device: torch.device) -> "StackedModels":
        # Moving creates new leaves: done before an optimizer is built over them.
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
        if self.batched is not None:
            x = x.expand(self.n, *x.shape) if shared_input else x
            with torch.no_grad():
                out = self.batched(x.flatten(0, 1))
            return out.view(self.n, -1, *out.shape[1:])
        def one(params, buffers, xi):
            return functional_call(self.base, (params, buffers), (xi,))
        return vmap(one, in_dims=(0, 0, None if shared_input else 0))(self.params, self.buffers, x)

    def loss_and_grads(self, x: torch.Tensor, y: torch.Tensor,
                       loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                       context: Callable = contextlib.nullcontext):
        """x (N, B, ...), y (N, B) -> (each model's gradient of loss_fn(its logits, its y):
        {name: (N, *shape)} for the trainable parameters, losses (N,), logits (N, B, ...)).
        context() is entered around each forward (e.g. autocast)."""
        if self.batched is not None:
            trainable = self.trainable()
            with torch.enable_grad():
                with context():
                    out = self.batched(x.flatten(0, 1))
                logits = out.view(self.n, -1, *out.shape[1:])                     # (N, B, ...)
                losses = torch.stack([loss_fn(logits[i], y[i]) for i in range(self.n)])   # (N,)
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
        return {k: tensors[k][i].detach().clone() for k in self.state_keys}


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


@torch.no_grad()
def clip_grad_norm_per_model(stacked: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for each model of a stack: model i's gradients (slice i
    of every tensor) are scaled by min(1, max_norm / (||g_i|| + 1e-6)), its own total norm.
    Returns the N norms before clipping."""
    grads = [p.grad for p in stacked if p.grad is not None]
    if not grads:
        return torch.zeros(0)
    per_tensor = torch.stack([torch.linalg.vector_norm(g.float().reshape(len(g), -1), dim=1)
                              for g in grads])                              # (tensors, N)
    total = torch.linalg.vector_norm(per_tensor, dim=0)                     # (N,)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.ndim - 1)).to(g.dtype))
    return total
