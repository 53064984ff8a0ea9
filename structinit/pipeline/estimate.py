"""How long a recipe takes to train on this machine, measured before it starts.

A GPU recipe started on a CPU (Fashion-MNIST's, the paper's CIFAR ones) would run for days; the
training stage says how long before it stops (or, forced, before it starts). The figure is
measured, not derived from FLOPs: the library's own trainer trains one model of the recipe's
shape for two one-batch epochs of synthetic images at the recipe's batch (at most 64), and the
second epoch's seconds per image, times the cell's images, epochs and models, is the estimate.
Stacked models cost a CPU about what they cost one after another; a larger batch costs a little
less per image (on 2 cores, Fashion-MNIST's model: 32 ms per image at batch 16, 10 at 64) and
evaluation is not counted, so the figure is the right order, not a promise.
"""
from __future__ import annotations

import time

import torch

from structinit.data.specs import DatasetSpec
from structinit.data.tensors import synthetic_data
from structinit.pipeline.build import build_model


def seconds_per_image(model_cfg: dict, spec: DatasetSpec, train: dict, device=None, batch: int | None = None,
                      batches: int = 1) -> float:
    """Training seconds per image and model of the recipe (its model, augmentation, optimizer,
    dtype) on `device` (default: the trainer's), timed on the second of two epochs of
    `batches` x `batch` synthetic images (batch: the recipe's, at most 64)."""
    from structinit.training.config import TrainConfig
    from structinit.training.trainer import train_models

    batch = batch or min(64, train["batch_size"])
    data = synthetic_data(spec, batch * batches, batch)
    cfg = TrainConfig(**{**train, "epochs": 2, "batch_size": batch, "warmup_epochs": 1, "eval_every": 2,
                         "seed": 0})
    history = train_models([build_model(model_cfg, spec)], data, [cfg], device=device, progress=False)[0]
    return history[1]["train_seconds"] / (batch * batches)


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def training_time_line(dataset: str, model_cfg: dict, spec: DatasetSpec, train: dict, images: int, models: int,
                       device=None) -> str:
    """One sentence: how long this cell's training takes here, and how that was measured."""
    t = time.perf_counter()
    per_image = seconds_per_image(model_cfg, spec, train, device)
    total = per_image * images * train["epochs"] * models
    where = f"this {'CPU' if (device is None or torch.device(device).type == 'cpu') else torch.device(device).type}"
    return (f"{dataset}'s recipe on {where} takes about {duration(total)} to train this cell ({models} model(s) x "
            f"{train['epochs']} epochs x {images:,} images at {per_image * 1e3:.1f} ms per image and model, "
            f"timed here in {time.perf_counter() - t:.0f} s; evaluation not counted)")
