"""The streamed trainer: one model fed by DataLoader workers, in one process or many (DDP).

    history = train_streamed(model, train_set, test_set, cfg, ctx=DistributedContext.from_env())

For data that does not fit on the device (ImageNet: imagenet.py). The recipe is the on-device trainer's (trainer.py:
AdamW without decay on 1-D parameters, warm-up then cosine by step, bf16 autocast on GPUs) plus the official ImageNet
command's Mixup/CutMix with label smoothing (timm) and an lr scaled by the global batch (TrainConfig.scaled_lr).

Under torchrun each process trains a DDP replica on its share of every global batch; averaged gradients make a step
the one-process step on the whole batch (to float noise; Mixup/CutMix mix within each share, as the official run did),
so the recipe is the global batch, not the process count. A share too big for memory runs as micro-batches
(STRUCTINIT_MICRO_BATCH). Rank 0 alone reports and checkpoints, every epoch; any process count resumes from it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from timm.loss import SoftTargetCrossEntropy
from tqdm.auto import tqdm

from structinit.data.imagenet import SeededAugmentation, test_loader, train_loader
from structinit.io import save_checked
from structinit.training.checkpoint import checkpoint_fingerprint, restore_checkpoint
from structinit.training.stacked import autocast, compute_dtype
from structinit.training.trainer import NonFiniteLossError, lr_at, param_groups, schedule_steps
from structinit.training.config import TrainConfig
from structinit.distributed import DistributedContext, refuse_batchnorm
from structinit.memory import memory_report
from structinit.training.config import steps_per_epoch


def _announce_memory(model, test_set, batch: int, micro_batch: int | None, dtype: str, device) -> None:
    """Print the on-device trainer's memory estimate for this process's share, with no data term (images stream from
    disk). Probed on test images: their transform draws no RNG and crops to the training size."""
    sample = torch.stack([test_set[i][0] for i in range(min(8, len(test_set)))])
    print(memory_report([model], sample, batch, micro_batch, dtype, device, data_bytes=0))


def default_workers() -> int:
    """DataLoader workers per process: the cores split among local processes, at most 10 (the official -j 10)."""
    import os

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return max(0, min(10, (os.cpu_count() or 1) // local - 1))


def train_streamed(model: torch.nn.Module, train_set: SeededAugmentation, test_set, cfg: TrainConfig, *,
                   ctx: DistributedContext | None = None, checkpoint_path: str | Path | None = None,
                   fingerprint: dict | None = None, workers: int | None = None, eval_batch: int = 256,
                   micro_batch: int | None = None, on_epoch_end=None, progress: bool = True,
                   dtype: str | None = None) -> list[dict]:
    """Train `model` in place; return one metrics dict per epoch (the on-device trainer's keys; same on all ranks).
    micro_batch: images per forward pass in each process, gradients accumulated (same step, less memory; None: all).
    dtype: the compute dtype as the caller decided it (stacked.compute_dtype); None: decided here, without the model.
    on_epoch_end(metrics) runs on rank 0 only, restored epochs first."""
    ctx = ctx or DistributedContext()
    if micro_batch is not None and micro_batch < 1:
        raise ValueError(f"micro_batch={micro_batch}: give a positive number of images, or None")
    refuse_batchnorm([model], ctx.world_size)
    num_classes = model.num_classes
    device = ctx.device()
    workers = default_workers() if workers is None else workers
    model.to(device)
    if cfg.batch_size > len(train_set):     # the loader's batches are whole: no smaller batch, as on the device
        raise ValueError(f"batch_size={cfg.batch_size} is larger than the {len(train_set)} training images")
    n_steps = steps_per_epoch(len(train_set), cfg.batch_size)
    lr_cfg = dataclasses.replace(cfg, lr=cfg.scaled_lr(cfg.batch_size))      # the global batch's lr
    total_steps, warmup_steps = schedule_steps(cfg, n_steps)
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=lr_cfg.lr, eps=cfg.adam_eps,
                            fused=device.type == "cuda")
    # without the model: BatchNorm models autocast here too (the on-device trainer keeps them fp32 on CPUs)
    dtype = dtype or compute_dtype(cfg, device)
    fingerprint = checkpoint_fingerprint(cfg, dtype, fingerprint)      # the recipe as given, amp unresolved
    # rank 0 first (it moves a damaged file aside), then the others read what it left: all start at one epoch
    history = (_restore(model, opt, checkpoint_path, fingerprint, cfg.epochs, device, announce=True)
               if ctx.is_main else [])
    ctx.barrier()
    if not ctx.is_main:
        history = _restore(model, opt, checkpoint_path, fingerprint, cfg.epochs, device, announce=False)
    ctx.barrier()                                 # every rank has read it before rank 0 writes again
    if ctx.is_main and on_epoch_end:
        for metrics in history:
            on_epoch_end(metrics)
    ddp = (torch.nn.parallel.DistributedDataParallel(model,
                                                     device_ids=[device.index] if device.type == "cuda" else None)
           if ctx.enabled else model)
    if ctx.is_main and len(history) < cfg.epochs:
        _announce_memory(model, test_set, cfg.batch_size // ctx.world_size, micro_batch, dtype, device)
    mixup = _mixup(cfg, num_classes, ctx)
    soft_target_loss = SoftTargetCrossEntropy()
    for epoch in range(len(history), cfg.epochs):
        t0 = time.perf_counter()
        loader = train_loader(train_set, cfg.batch_size, ctx, epoch, cfg.seed, workers)
        sums = torch.zeros(3, device=device, dtype=torch.float64)          # loss, correct, images
        first_bad = -1
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not (progress and ctx.is_main),
                   leave=False, mininterval=1.0)
        for i, (x, y) in enumerate(bar):
            step = epoch * n_steps + i
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total_steps, warmup_steps, lr_cfg)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            if mixup is not None:
                np.random.seed((cfg.seed * 1_000_003 + step) * 1_009 + ctx.rank)   # its lambda, its box
                x, target = mixup(x, y)
            else:
                target = y
            opt.zero_grad(set_to_none=True)
            parts = list(zip(*(t.split(micro_batch or len(y)) for t in (x, target, y))))
            loss = torch.zeros((), device=device)
            correct = torch.zeros((), device=device)
            for j, (xm, tm, ym) in enumerate(parts):
                # DDP averages gradients over processes on the last part's backward only
                last = j == len(parts) - 1
                with contextlib.nullcontext() if last or not ctx.enabled else ddp.no_sync():
                    with autocast(device, dtype):
                        logits = ddp(xm)
                    part_loss = (soft_target_loss(logits.float(), tm) if mixup is not None  # smoothing is in tm
                                 else F.cross_entropy(logits.float(), tm, label_smoothing=cfg.label_smoothing))
                    (part_loss * (len(ym) / len(y))).backward()
                loss += part_loss.detach() * (len(ym) / len(y))
                correct += (logits.argmax(-1) == ym).sum()
            norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                    if cfg.grad_clip else torch.zeros((), device=device))
            if first_bad < 0 and not (torch.isfinite(loss) and torch.isfinite(norm)):
                first_bad = i                     # one sync per step: negligible next to decoding
            opt.step()
            sums += torch.stack([loss.double() * len(y), correct.double(),
                                 torch.tensor(float(len(y)), device=device, dtype=torch.float64)])
        bad = ctx.sum(torch.tensor([first_bad >= 0], device=device, dtype=torch.float64))
        if bad.item():
            raise NonFiniteLossError(f"training loss or gradient of seed {cfg.seed} became NaN or inf in epoch "
                                     f"{epoch + 1}; this run has failed and nothing after its last finished "
                                     "epoch was written. Lower the lr or check the data.")
        loss_sum, correct, seen = ctx.sum(sums).tolist()
        train_seconds = time.perf_counter() - t0
        metrics = {"epoch": epoch + 1, "lr": opt.param_groups[0]["lr"], "train_loss": loss_sum / seen,
                   "train_acc": correct / seen, "seconds": train_seconds, "train_seconds": train_seconds,
                   "images_per_s": seen / train_seconds}
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            t = time.perf_counter()
            metrics.update(evaluate_streamed(model, test_set, ctx=ctx, device=device, dtype=dtype,
                                             batch_size=eval_batch, workers=workers))
            metrics["seconds"] += time.perf_counter() - t
        history.append(metrics)
        if ctx.is_main:
            if progress:
                test = f"  test acc {metrics['test_acc']:.4f}" if "test_acc" in metrics else ""
                tqdm.write(f"epoch {epoch + 1}/{cfg.epochs}  loss {metrics['train_loss']:.4f}{test}  "
                           f"({metrics['images_per_s']:.0f} img/s on {ctx.world_size} process(es))")
            if checkpoint_path is not None:
                save_checked(checkpoint_path, {"fingerprint": fingerprint, "history": history,
                                               "model": model.state_dict(), "optimizer": opt.state_dict()})
            if on_epoch_end:
                on_epoch_end(metrics)
        ctx.barrier()                             # no rank runs ahead of the checkpoint
    return history


@torch.no_grad()
def evaluate_streamed(model, test_set, *, ctx: DistributedContext, device, dtype: str,
                      batch_size: int, workers: int) -> dict:
    """Test loss and accuracy over the whole test set, each process taking its share."""
    model.eval()
    sums = torch.zeros(3, device=device, dtype=torch.float64)
    for x, y in test_loader(test_set, ctx, batch_size, workers):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with autocast(device, dtype):
            logits = model(x)
        sums += torch.stack([F.cross_entropy(logits.float(), y, reduction="sum").double(),
                             (logits.argmax(-1) == y).sum().double(),
                             torch.tensor(float(len(y)), device=device, dtype=torch.float64)])
    model.train()
    loss_sum, correct, n = ctx.sum(sums).tolist()
    return {"test_loss": loss_sum / n, "test_acc": correct / n}


def _mixup(cfg: TrainConfig, num_classes: int, ctx: DistributedContext):
    """timm's Mixup/CutMix (batch mode, the official command's), or None when both are off."""
    if not (cfg.mixup or cfg.cutmix):
        return None
    if (cfg.batch_size // ctx.world_size) % 2:
        raise ValueError(f"batch_size={cfg.batch_size} on {ctx.world_size} process(es): Mixup/CutMix pair each "
                         "image with its batch flipped and need an even batch in every process")
    from timm.data import Mixup

    return Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, label_smoothing=cfg.label_smoothing,
                 num_classes=num_classes)


def _restore(model, opt, path, fingerprint: dict, epochs: int, device, announce: bool) -> list[dict]:
    """The finished epochs' history, model and optimizer restored, from a sound checkpoint of this run; else []."""
    def load(state: dict) -> list[dict]:
        history = state["history"]
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])          # checks before it changes anything
        return history

    return restore_checkpoint(path, "fingerprint", fingerprint, load, modules=[model], device=device,
                              announce=announce, epochs_done=len, epochs=epochs) or []
