"""The reference trainer: one model, the textbook loop, nothing stacked, chunked or vmapped.

    history = train_plain(model, data, cfg)      # one dict per epoch: train_loss, images_per_s, ...
    loss = plain_step(model, opt, x, y, cfg, device, dtype)

What the stacked trainer (structinit/training/trainer.py) is checked against: the
equivalence test (tests/test_stacked.py: the trainer on one model == this loop, to float
noise) uses this one loop. It runs the timm module as timm runs
it (its own attention choice), torch's own clip_grad_norm_ and AdamW, with the trainer's
batches: the same per-(seed, epoch) generator draws the same order and augmentation, so the
two differ only in how the step is computed. No checkpoints, no evaluation, no
multi-process: it is a yardstick, not a trainer.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from structinit.data.tensors import ImageData
from structinit.training.trainer import BatchAugmentation, lr_at, param_groups, schedule_steps
from structinit.training.stacked import autocast, compute_dtype
from structinit.training.config import TrainConfig, steps_per_epoch


def plain_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               cfg: TrainConfig, device: torch.device, dtype: str) -> torch.Tensor:
    """One textbook training step: forward (autocast in `dtype`, stacked.compute_dtype's answer
    for the recipe), label-smoothed loss, backward, clip, AdamW. Returns the (detached) mean
    loss of the batch."""
    with autocast(device, dtype):
        logits = model(x)
    loss = F.cross_entropy(logits.float(), y, label_smoothing=cfg.label_smoothing)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if cfg.grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return loss.detach()


def train_plain(model: torch.nn.Module, data: ImageData, cfg: TrainConfig, *,
                device: torch.device | str = "cpu", train_indices: torch.Tensor | None = None) -> list[dict]:
    """Train `model` in place with cfg's recipe; one {"epoch", "lr", "train_loss",
    "train_seconds", "images_per_s"} per epoch. The batches are the trainer's: same order,
    same augmentation, same drop-last step count."""
    device = torch.device(device)
    dtype = compute_dtype(cfg, device)
    augmentation = BatchAugmentation(data, cfg, device)
    idx = train_indices if train_indices is not None else torch.arange(len(data.train_labels))
    train_x, train_y = data.train_images[idx].to(device), data.train_labels[idx].to(device)
    model.to(device).train()
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, eps=cfg.adam_eps,
                            fused=device.type in ("cuda", "cpu"))
    batch = min(cfg.batch_size, len(train_y))
    n_steps = steps_per_epoch(len(train_y), batch)
    total_steps, warmup_steps = schedule_steps(cfg, n_steps)
    history = []
    for epoch in range(cfg.epochs):
        t = time.perf_counter()
        # restated, not imported from the trainer: the equivalence test then also checks its seeding
        gen = torch.Generator(device=device).manual_seed(cfg.seed * 1_000_003 + epoch)
        order = torch.randperm(len(train_y), device=device, generator=gen)
        loss_sum = torch.zeros((), device=device)
        for i in range(n_steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(epoch * n_steps + i, total_steps, warmup_steps, cfg)
            rows = order[i * batch:(i + 1) * batch]
            x = augmentation.augment(train_x[rows], [gen])
            loss_sum += plain_step(model, opt, x, train_y[rows], cfg, device, dtype)
        loss = loss_sum.item() / n_steps                    # the epoch's one host sync
        seconds = time.perf_counter() - t
        history.append({"epoch": epoch + 1, "lr": opt.param_groups[0]["lr"], "train_loss": loss,
                        "train_seconds": seconds, "images_per_s": n_steps * batch / seconds})
    return history
