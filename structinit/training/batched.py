"""N models of one architecture as one module whose weights carry a leading model axis.

    module = batched_module(models)     # None where an architecture is not supported
    logits = module(x.flatten(0, 1))    # x (N, B, ...) -> (N*B, classes): model i sees rows i*B..
    module.qkv.weight.shape             # (N, in, out): model i's weight is [i].T

Why: the stack's other way (stacked.py, `vmap` over timm's module) pays functorch's per-op
dispatch, and on CPU it cannot use the fused attention kernel (no batching rule), so attention
runs as explicit batched matmuls plus a softmax. Here the timm module itself runs, unchanged,
on a batch of N*B samples; only its parametrized layers are swapped for ones that know the
model axis: a Linear becomes one batched matmul over models (`baddbmm`: (N, B*T, in) @ (N, in,
out)), a LayerNorm a normalization plus one per-model affine, a Conv2d one grouped
convolution over the models' channels. Everything else (attention as one
`scaled_dot_product_attention` call over models x batch x heads, GELU, residuals, pooling)
is timm's own code on a bigger batch. Gradients come from plain autograd on the stacked
leaves, so autocast behaves as on any module.

Supported: models whose parametrized modules are Linear, LayerNorm (1-D) and Conv2d (zero
padding), and whose other parameters and buffers are frozen and the same in every model (the
fixed position encoding). Anything else (BatchNorm's per-model statistics, a learned class
token) is left to the vmap stack: `batched_module` returns None and says nothing.
"""
from __future__ import annotations

import copy

import timm.layers
import torch
import torch.nn.functional as F
from torch import nn

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
