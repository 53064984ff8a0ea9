"""What both trainers share: trainer.py (on the device, stacked) and streamed.py (DataLoader
workers, DDP) train with one schedule, one parameter grouping, one precision rule, one error
for a diverged run and one checkpoint format.

    lr_at(step, total_steps, warmup_steps, cfg)   the learning rate of a step
    schedule_steps(cfg, steps_per_epoch)          (total_steps, warmup_steps) for lr_at
    param_groups(model, wd) / _decay_groups(...)  AdamW's groups: no weight decay on 1-D parameters
    resolve_amp(cfg, device, model)               amp='auto' decided once: (cfg, "bf16" | "fp32")
    compute_dtype(cfg, device, model) / autocast(cfg, device)
    NonFiniteLossError, default_device()
    checkpoint_fingerprint(...) / restore_checkpoint(...)   what a checkpoint must match; resuming
    code_fingerprint()                            the loaded structinit/stages sources, hashed

Optimizer steps per epoch are counted by steps.py's steps_per_epoch (torch-free: the params
schema uses it too); both trainers call it. Evaluation is not shared: each trainer sums the
test loss its own way (the stacked one per model in fp32 on the device, the streamed one in
fp64 over processes), and one loop for both would change the on-device trainer's floats.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Callable, TypeVar

import torch

from structinit import numerics
from structinit.errors import StructinitError
from structinit.io import CorruptFileError, load_checked
from structinit.training.config import TrainConfig

T = TypeVar("T")


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
    return _decay_groups([p for p in model.parameters() if p.requires_grad], weight_decay, 0)


def _decay_groups(params: list[torch.Tensor], weight_decay: float, stacked_dims: int) -> list[dict]:
    """stacked_dims: leading model dimensions (1 for a StackedModels' tensors)."""
    decay = [p for p in params if p.ndim - stacked_dims > 1]
    no_decay = [p for p in params if p.ndim - stacked_dims <= 1]
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# ---- precision ----------------------------------------------------------------------------

# The CPU's answer does not change within a process: asked once (compute_dtype is called for
# every autocast context of a run whose amp is not yet resolved).
cpu_has_native_bf16 = functools.cache(numerics.cpu_has_native_bf16)


def compute_dtype(cfg: TrainConfig, device: torch.device, model: torch.nn.Module | None = None) -> str:
    """What the step computes in: "bf16" (autocast) or "fp32". amp='auto': bf16 on CUDA cards
    from Ampere on (compute capability 8.0: the paper trains with mixed precision) and on CPUs
    with native bf16 instructions (AVX512-BF16 or AMX: 2x the digits trainer's fp32 rate on
    Zen 4, benchmarks/trainer_speed.py), unless `model` has BatchNorm (the CPU kernel takes no
    bf16 input with fp32 statistics); fp32 on older cards (V100, T4: no native bf16, emulated
    or refused by some kernels; fp16 would need a loss scaler the stacked step does not have)
    and on other CPUs, where bf16 is emulated and slower than fp32. 'bf16' everywhere; 'off':
    fp32. precision_note says why, for the log."""
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


def resolve_amp(cfg: TrainConfig, device: torch.device,
                model: torch.nn.Module | None = None) -> tuple[TrainConfig, str]:
    """(cfg with amp='auto' decided: 'bf16' or 'off', compute_dtype(cfg, device, model)): a
    run decides its precision once, and autocast(resolved cfg, device) asks nothing more."""
    dtype = compute_dtype(cfg, device, model)
    return dataclasses.replace(cfg, amp="bf16" if dtype == "bf16" else "off"), dtype


def autocast(cfg: TrainConfig, device: torch.device):
    """The autocast context of compute_dtype(cfg, device)."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=compute_dtype(cfg, device) == "bf16")


# ---- checkpoints ----------------------------------------------------------------------------

# One format number and one fingerprint key for both trainers' checkpoints; bump the number
# when what either trainer writes changes. The trainers' layouts differ (trainer.py: every
# stacked model in one file under "fingerprints"; streamed.py: one model under "fingerprint"),
# and each reads only its own files. Until this module, streamed.py wrote {"format": 1} into
# its fingerprints: a streamed checkpoint written before then is ignored ("written for a
# different configuration") and its run starts afresh; trainer.py's fingerprints, already
# {"checkpoint_format": 3}, are unchanged. Checkpoints live in .ckpt/, outside DVC's outputs.
# 4: trainer.py's optimizer moments in each model's own layout (3 wrote the batched Linear
# moments in the stack's transposed layout, which a plain run would misread; a format-3
# checkpoint is ignored and its cell trains afresh; so is a streamed one, which shares the
# number, though its layout did not change). 3: one file per call, every model's
# state (2: one file per model).
CHECKPOINT_FORMAT = 4
CHECKPOINT_FORMAT_KEY = "checkpoint_format"


def checkpoint_fingerprint(cfg: TrainConfig, dtype: str, extra: dict | None) -> dict:
    """What a run's checkpoint must match to be resumed: its recipe (as given, amp unresolved),
    the dtype it computes in, the checkpoint format and whatever the caller adds (e.g. the
    init); JSON-normalized, so that it compares equal to the copy read back from the file."""
    return json.loads(json.dumps({"config": dataclasses.asdict(cfg), "compute_dtype": dtype,
                                  CHECKPOINT_FORMAT_KEY: CHECKPOINT_FORMAT, **(extra or {})}, default=str))


def code_fingerprint(packages: tuple[str, ...] = ("structinit", "stages")) -> str:
    """The code a run trains with: SHA-256 (first 16 hex digits) of the source of every module
    of `packages` loaded in this process, by module name. Called once the cell's models are
    built, that is the stage script's import closure (what dvc.yaml lists as its code deps)
    plus the initializer's own file, which the registry imports by name. In the checkpoint
    fingerprint, it makes a cell whose code changed start afresh instead of resuming epochs
    that other code trained (while dvc.lock would record the new code's hash)."""
    import hashlib
    import sys

    h = hashlib.sha256()
    loaded = {}
    for name, module in list(sys.modules.items()):
        # the script run with `python -m stages.train` is __main__, its name in its __spec__
        spec = getattr(module, "__spec__", None)
        real = spec.name if name == "__main__" and spec is not None else name
        file = getattr(module, "__file__", None)
        if file and real.split(".")[0] in packages and file.endswith(".py"):
            loaded[real] = file
    for name in sorted(loaded):
        h.update(f"{name}\0".encode())
        h.update(Path(loaded[name]).read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _first_difference(written, wanted) -> str:
    """Which top-level fields of two fingerprints (dicts, or lists of dicts: one per stacked
    model) differ, for the log: e.g. "code", "config"."""
    if isinstance(written, list) and isinstance(wanted, list) and len(written) == len(wanted):
        return next((d for d in map(_first_difference, written, wanted) if d), "")
    if isinstance(written, dict) and isinstance(wanted, dict):
        return ", ".join(sorted(k for k in set(written) | set(wanted) if written.get(k) != wanted.get(k)))
    return "the number of models" if isinstance(written, list) and isinstance(wanted, list) else "its layout"


def _code_of(fingerprint) -> str | None:
    first = fingerprint[0] if isinstance(fingerprint, list) and fingerprint else fingerprint
    return first.get("code") if isinstance(first, dict) else None


def restore_checkpoint(path: str | Path | None, fingerprint_key: str, fingerprint, load: Callable[[dict], T], *,
                       modules: list[torch.nn.Module], device: torch.device, announce: bool,
                       epochs_done: Callable[[T], int], epochs: int) -> T | None:
    """Resume from `path` if it is a sound checkpoint written for exactly this run: load(state)
    puts its state into the run and returns what the caller keeps (None: start afresh).

    - no file: None, silently;
    - state[fingerprint_key] != fingerprint (another recipe, init or checkpoint format): the
      file is ignored (and later overwritten), None;
    - damaged (checksum, truncation, a pickled object) or not loadable into this run (load
      raises KeyError, RuntimeError, TypeError, ValueError or AttributeError): `modules` get
      their weights back as they were before load, the file is moved aside to *.corrupt and
      never resumed from, None.
    announce: say which of these happened (rank 0; the others read what it left, silently)."""
    say = print if announce else (lambda *_: None)
    if path is None or not Path(path).exists():
        return None
    path = Path(path)
    try:
        state = load_checked(path, "a training checkpoint", map_location=device)
        if not isinstance(state, dict) or state.get(fingerprint_key) != fingerprint:
            written = state.get(fingerprint_key) if isinstance(state, dict) else None
            say(f"ignoring {path}: it was written for a different configuration (differs in: "
                f"{_first_difference(written, fingerprint) or 'its layout'}); training starts from the first epoch")
            return None
        backups = [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]
        try:
            restored = load(state)
        except (KeyError, RuntimeError, TypeError, ValueError, AttributeError) as e:
            for m, backup in zip(modules, backups):
                m.load_state_dict(backup)
            raise CorruptFileError(f"{path} (a training checkpoint) is not a sound checkpoint of "
                                   f"this run: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except CorruptFileError as e:
        bad = path.with_name(path.name + ".corrupt")
        path.replace(bad)
        say(f"discarding an unusable checkpoint ({e}); moved to {bad}; training starts from the first epoch")
        return None
    code = _code_of(fingerprint)
    say(f"resuming from {path} after epoch {epochs_done(restored)}/{epochs}" + (f" (code {code})" if code else ""))
    return restored
