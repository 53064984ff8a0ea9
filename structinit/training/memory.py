"""How much device memory a stacked cell needs, estimated before it trains (the trainer's log).

    estimate = estimate_training_memory(models, sample, batch=512, micro_batch=None, dtype="bf16")
    estimate.total_bytes, estimate.describe()

Three parts, each counted rather than guessed:
- state: every model's parameters as the trainer holds them (the models themselves, the stack's
  copy, its gradients and AdamW's two moments: 5 fp32 copies) and buffers;
- activations: what autograd saves for backward, measured by running one model's forward on a
  few images on the CPU (in the cell's compute dtype) with a saved-tensors hook, then scaled to
  the images in flight per pass (the micro-batch, or the batch) times the models stacked;
- data: the dataset, on the device as uint8 (the trainer keeps it there).
Transients of the backward pass (a block's gradient workspace) and the allocator's caching are
not counted: on a GPU the measured peak (torch.cuda.max_memory_allocated) is the check
(tests/test_memory.py, where a GPU exists).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

GiB = 2 ** 30
STATE_COPIES = 5       # the models' weights, the stack's, its gradients, AdamW's exp_avg and exp_avg_sq


@dataclass(frozen=True)
class MemoryEstimate:
    state_bytes: int
    activation_bytes: int
    data_bytes: int
    images_per_pass: int          # per model
    models: int

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.activation_bytes + self.data_bytes

    def describe(self) -> str:
        return (f"memory estimate {self.total_bytes / GiB:.2f} GiB: activations {self.activation_bytes / GiB:.2f} "
                f"({self.models} model(s) x {self.images_per_pass} images per pass), weights/gradients/AdamW "
                f"{self.state_bytes / GiB:.2f}, data {self.data_bytes / GiB:.2f}")

    def micro_batch_to_fit(self, available_bytes: int) -> int | None:
        """The largest micro-batch whose estimate fits `available_bytes`; None if even one
        image per pass does not."""
        per_image = self.activation_bytes / self.images_per_pass
        room = available_bytes - self.state_bytes - self.data_bytes
        fits = int(room // per_image) if per_image else self.images_per_pass
        return min(fits, self.images_per_pass) if fits >= 1 else None


def saved_activation_bytes(model: torch.nn.Module, sample: torch.Tensor, dtype: str,
                           fused_attention: bool | None = None) -> int:
    """Bytes autograd saves for backward in one training forward (+ cross-entropy) of `model`
    on `sample` (B, C, H, W), measured on the CPU on a copy (BatchNorm statistics of the real
    model stay untouched, and the random state is restored: a model with dropout trains the
    same whether or not it was probed); each storage counted once. fused_attention: the
    attention kernel the trainer runs (timm's fused_attn; stacked.choose_attention), None: the
    model's own setting."""
    probe = copy.deepcopy(model).cpu().train()
    if fused_attention is not None:
        for m in probe.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = fused_attention
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        logits = probe(sample.cpu().float())
        torch.nn.functional.cross_entropy(logits.float(), torch.zeros(len(sample), dtype=torch.long))
    params = {p.untyped_storage().data_ptr() for p in probe.parameters()}
    return sum(n for ptr, n in seen.items() if ptr not in params)     # weights are the state's


def estimate_training_memory(models: list[torch.nn.Module], sample: torch.Tensor, *, batch: int,
                             micro_batch: int | None, dtype: str, data_bytes: int = 0,
                             fused_attention: bool | None = None) -> MemoryEstimate:
    """models: the stack's (one architecture); sample: a few training images (B, C, H, W),
    float, normalized; batch: images per model per step in this process; fused_attention:
    the trainer's attention kernel (saved_activation_bytes)."""
    per_pass = min(batch, micro_batch) if micro_batch else batch
    probe_images = sample[: min(len(sample), 8)]
    per_image = saved_activation_bytes(models[0], probe_images, dtype, fused_attention) / len(probe_images)
    model = models[0]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return MemoryEstimate(state_bytes=len(models) * (STATE_COPIES * weights + 2 * buffers),
                          activation_bytes=int(per_image * per_pass * len(models)),
                          data_bytes=data_bytes, images_per_pass=per_pass, models=len(models))
