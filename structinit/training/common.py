"""What both trainers share: trainer.py (on the device, stacked) and streamed.py (DataLoader
workers, DDP) train with one schedule, one parameter grouping, one precision rule and one error
for a diverged run. Their checkpoints share checkpoint.py.

    lr_at(step, total_steps, warmup_steps, cfg)   the learning rate of a step
    schedule_steps(cfg, steps_per_epoch)          (total_steps, warmup_steps) for lr_at
    param_groups(model, wd) / decay_groups(...)   AdamW's groups: no weight decay on 1-D parameters
    compute_dtype(cfg, device, model)             what a run computes in: decided once per run
    autocast(device, dtype)                       the autocast context of that decision
    NonFiniteLossError, default_device()

Optimizer steps per epoch are counted by steps.py's steps_per_epoch (torch-free: the params
schema uses it too); both trainers call it. Evaluation is not shared: each trainer sums the
test loss its own way (the stacked one per model in fp32 on the device, the streamed one in
fp64 over processes), and one loop for both would change the on-device trainer's floats.
"""
from __future__ import annotations

import functools
import math

import torch

from structinit import numerics
from structinit.errors import StructinitError
from structinit.training.config import TrainConfig

class NonFiniteLossError(StructinitError, FloatingPointError):
    """A model's training loss became NaN or inf: the cell has failed (its last finished
    epoch's checkpoint is kept; nothing after it is written)."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---- the learning-rate schedule and AdamW's parameter groups -------------------------------

def lr_at(step: int, total_steps: int, warmup_steps: int, cfg: TrainConfig) -> float:
    """Linear warm-up from 0, then cosine to min_lr; a function of the step, so resumable.
    cfg.warmup_prefix: the cosine starts where warm-up ends; else (timm's default, the paper's
    runs) it runs over all steps from step 0 and warm-up replaces its start."""
    if step < warmup_steps:
        return cfg.lr * (step + 1) / warmup_steps
    t = ((step - warmup_steps) / max(1, total_steps - warmup_steps) if cfg.warmup_prefix
         else step / max(1, total_steps))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t))


def schedule_steps(cfg: TrainConfig, steps_per_epoch: int) -> tuple[int, int]:
    """lr_at's (total_steps, warmup_steps) for cfg.epochs epochs of steps_per_epoch steps
    (steps.py's match_steps counts warm-up steps the same way)."""
    return steps_per_epoch * cfg.epochs, round(cfg.warmup_epochs * steps_per_epoch)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on 1-D parameters (biases, norms); frozen ones are left out."""
    return decay_groups([p for p in model.parameters() if p.requires_grad], weight_decay, 0)


def decay_groups(params: list[torch.Tensor], weight_decay: float, stacked_dims: int) -> list[dict]:
    """stacked_dims: leading model dimensions (1 for a StackedModels' tensors)."""
    decay = [p for p in params if p.ndim - stacked_dims > 1]
    no_decay = [p for p in params if p.ndim - stacked_dims <= 1]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# ---- precision ----------------------------------------------------------------------------

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
