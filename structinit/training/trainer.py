"""The trainer: the paper's recipe, device-agnostic, resumable, no host sync in the step loop.

    train_models([model_a, model_b], data, [cfg_a, cfg_b]) -> one list of epoch metrics per model
    train_model(model, data, cfg)                          -> the same for one model

Several models of one architecture and one recipe (they may differ in weights and seed) train
as one stacked model (stacked.py): each op runs all of them at once, and each model's result
is what it would be trained alone, to float noise.

Here: what a caller calls and the epoch loop. Elsewhere, one concern each: the step
(step.py: forward and loss, backward, clipping, the optimizer step), the batches and their
augmentation (batches.py), the evaluation (evaluation.py), checkpoints and the optimizer's
state (checkpoint.py), whether the seeds stack and how much memory they need (memory.py).

The whole dataset lives on the training device as one uint8 tensor; each batch is gathered,
augmented and normalized there. Each model has its own data order (its seed's) and its own
metrics; the checkpoint holds every model's state in one file, written atomically, so a kill
can never leave the models at different epochs.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from structinit.data.tensors import ImageData
from structinit.distributed import DistributedContext, refuse_batchnorm
from structinit.training.batches import BatchAugmentation, EpochBatches, epoch_generator
from structinit.training.checkpoint import checkpoint_fingerprint, restore_stack, save_stack, stacked_adamw
from structinit.training.common import (NonFiniteLossError, compute_dtype, default_device, lr_at, precision_note,
                                        schedule_steps)
from structinit.training.config import TrainConfig
from structinit.training.evaluation import evaluate_stack
from structinit.training.memory import estimate_training_memory, graph_fits, memory_report, plan_stacking
from structinit.training.stacked import StackedModels
from structinit.training.step import Objective, StepGraph, plan_gradients, plan_step_graph, train_step


def train_model(model: torch.nn.Module, data: ImageData, cfg: TrainConfig, *,
                device: torch.device | str | None = None, train_indices: torch.Tensor | None = None,
                checkpoint_path: str | Path | None = None, fingerprint: dict | None = None,
                on_epoch_end=None, progress: bool = True, dtype: str | None = None) -> list[dict]:
    """Train one model in place; returns one metrics dict per epoch (see train_models).
    on_epoch_end(metrics), as the streamed trainer's (streamed.train_streamed)."""
    report = (lambda i, metrics: on_epoch_end(metrics)) if on_epoch_end else None
    return train_models([model], data, [cfg], device=device, train_indices=train_indices,
                        checkpoint_path=checkpoint_path, fingerprints=[fingerprint],
                        on_epoch_end=report, progress=progress, dtype=dtype)[0]


def train_models(models: list[torch.nn.Module], data: ImageData, cfgs: list[TrainConfig], *,
                 device: torch.device | str | None = None, train_indices: torch.Tensor | None = None,
                 checkpoint_path: str | Path | None = None, fingerprints: list | None = None,
                 on_epoch_end: Callable[[int, dict], None] | None = None, progress: bool = True,
                 ctx: DistributedContext | None = None, checkpoint_every_s: float = 0.0,
                 micro_batch: int | None = None, dtype: str | None = None) -> list[list[dict]]:
    """Train models of one architecture in place, stacked (on a GPU, one after another where
    memory.plan_stacking says so, each as a call of its own); returns each one's epoch metrics.

    cfgs: one per model, equal except for `seed` (each model's data order and augmentation).
    dtype: what the run computes in, "bf16" or "fp32", as the caller decided it with
    common.compute_dtype (a stage logs it); None: decided here, by the same rule.
    checkpoint_path: one file with every model's weights, optimizer state and history, written
    atomically after every epoch (models trained one after another: one file each,
    checkpoint-model<i>.pt beside it), and resumed from when it exists and its fingerprints
    (each model's config + whatever the caller adds in `fingerprints[i]`, e.g. the init) all
    match; a mismatching checkpoint is ignored and overwritten, a damaged one moved aside (all
    models then start afresh). on_epoch_end(i, metrics) is called for every epoch of model i,
    including (first) the epochs restored from the checkpoint.
    checkpoint_every_s: write the checkpoint at the end of an epoch only once this many seconds
    have passed since the last write (and after the last epoch); 0, every epoch. A run of many
    short epochs otherwise spends much of its time re-writing a history that grows every
    epoch; a kill then loses at most this many seconds of finished epochs.
    micro_batch: images per model per forward pass (gradients summed over the pieces, each
    weighted by its share): a batch too large for the device's memory trains as the same
    step, to float noise. None: the whole batch (or the CPU's chunks: step.py).

    ctx: several processes (torchrun, distributed.py) train the stack together. Every process
    draws and augments the whole global batch (the same generators), keeps its own slice of
    it, and the gradients are averaged over processes before clipping: each step is the
    one-process step, to float noise. Rank 0 alone writes checkpoints and calls on_epoch_end.
    """
    # ---- what trains, where, in which precision ----
    cfg = _one_recipe(cfgs, len(models))
    ctx = ctx or DistributedContext()
    if cfg.batch_size % ctx.world_size:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by the {ctx.world_size} processes; "
                         "the global batch must split evenly")
    refuse_batchnorm(models, ctx.world_size)         # before the device plan: the model's own refusal first
    device = torch.device(device) if device is not None else ctx.device() if ctx.enabled else default_device()
    dtype = dtype or compute_dtype(cfg, device, models[0])
    fingerprints = fingerprints or [None] * len(models)
    why = ""
    if len(models) > 1:
        together, why = plan_stacking(models, data, cfg, device, dtype, processes=ctx.world_size,
                                      train_size=None if train_indices is None else len(train_indices),
                                      micro_batch=micro_batch)
        if not together:
            if progress and ctx.is_main:
                print(f"training the {len(models)} models one after another: {why}")
            return [train_models([m], data, [c], device=device, train_indices=train_indices,
                                 checkpoint_path=_one_of(checkpoint_path, i), fingerprints=[fingerprints[i]],
                                 on_epoch_end=(lambda _, m, i=i: on_epoch_end(i, m)) if on_epoch_end else None,
                                 progress=progress, ctx=ctx, checkpoint_every_s=checkpoint_every_s,
                                 micro_batch=micro_batch, dtype=dtype)[0]
                    for i, (m, c) in enumerate(zip(models, cfgs))]
    seeds = [c.seed for c in cfgs]
    models = [m.to(device) for m in models]
    fingerprints = [checkpoint_fingerprint(c, dtype, f) for c, f in zip(cfgs, fingerprints)]
    report = on_epoch_end if on_epoch_end and ctx.is_main else None
    show = progress and ctx.is_main

    # ---- resume: every model's history and optimizer state, from one file ----
    checkpoint = Path(checkpoint_path) if checkpoint_path else None
    restored = _resume(models, fingerprints, checkpoint, device, cfg.epochs, ctx)
    histories = [history for history, _ in restored] if restored else [[] for _ in models]
    for i, history in enumerate(histories):
        for metrics in history:
            if report:
                report(i, metrics)
    start = len(histories[0])                         # every model's: restored from one file
    if start >= cfg.epochs:
        return histories

    # ---- the data on the device, the stack, its optimizer and how its gradients are computed ----
    idx = train_indices if train_indices is not None else torch.arange(len(data.train_labels))
    train_x = data.train_images[idx].to(device)                        # uint8 (n, C, H, W)
    train_y = data.train_labels[idx].to(device)                        # (n,)
    test_x, test_y = data.test_images.to(device), data.test_labels.to(device)
    batch_size = min(cfg.batch_size, len(train_y))    # the global batch; each process trains its slice
    augmentation = BatchAugmentation(data, cfg, device)
    stack = StackedModels(models).to(device).train()
    attention = stack.choose_attention(device, dtype)
    opt = stacked_adamw(stack, [state for _, state in restored] if restored else [None] * len(models), cfg, device)
    per_process = batch_size // ctx.world_size
    graphed, graph_why = plan_step_graph(cfg.cuda_graph, stack.way, device, ctx.world_size, micro_batch, per_process)
    fused = next((m.fused_attn for m in stack.base.modules() if hasattr(m, "fused_attn")), None)
    memory = dict(sample=augmentation.normalize(train_x[:8]), batch=per_process, micro_batch=micro_batch, dtype=dtype,
                  data_bytes=train_x.nbytes + test_x.nbytes, fused_attention=fused, test_images=len(test_y))
    estimate = None
    if graphed:          # the graph keeps the training pass's memory beside the evaluation's
        estimate = estimate_training_memory(models, **memory, device_type=device.type, graphed=True)
        fits, why_not = graph_fits(estimate, device)
        if not fits:     # trained uncaptured (the log's estimate is then the uncaptured step's)
            graphed, graph_why, estimate = False, why_not, None
    objective = Objective(stack, cfg, device, dtype, graphed=graphed)
    gradients, how = plan_gradients(cfg.cpu_chunks, stack, device, per_process, objective, micro_batch=micro_batch)
    max_norm = cfg.grad_clip or math.inf
    step = (StepGraph(stack, opt, gradients, max_norm=max_norm, ctx=ctx, capture=True) if graphed
            else functools.partial(train_step, stack, opt, gradients, max_norm=max_norm, ctx=ctx))
    if show:
        note = precision_note(cfg, device, dtype)
        where = f"{device} x {ctx.world_size} processes" if ctx.enabled else device
        way = "timm's own module" if stack.way == "plain" else f"stacked ({stack.way})"
        print(f"training {len(models)} model(s) {way} on {where} in {dtype}, "
              f"epochs {start + 1}-{cfg.epochs}: {how}" + (f", {objective.how}" if objective.how else "")
              + f" per step, {attention}" + (f", {graph_why}" if device.type == "cuda" else "")
              + (f" ({note})" if note else "")
              + (f"; {why}" if device.type == "cuda" and len(models) > 1 else ""))
        print(memory_report(models, device=device, graphed=graphed, estimate=estimate, **memory))

    # ---- the epochs: train, evaluate when due, log, checkpoint, report ----
    last_write = time.monotonic()
    with gradients:
        for epoch in range(start, cfg.epochs):
            gens = [epoch_generator(seed, epoch, device) for seed in seeds]
            batches = EpochBatches(train_x, train_y, augmentation, gens, batch_size, ctx)
            per_model = train_epoch(step, batches, seeds, epoch, cfg=cfg, device=device, ctx=ctx, progress=show)
            if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
                t = time.perf_counter()
                with gradients.all_threads():
                    tests = evaluate_stack(stack, test_x, test_y, augmentation=augmentation, device=device,
                                           dtype=dtype)
                seconds = time.perf_counter() - t
                for metrics, test in zip(per_model, tests):
                    metrics.update(test)
                    metrics["seconds"] += seconds
            if show:
                accs = [m["test_acc"] for m in per_model if "test_acc" in m]
                test = f"test acc {' '.join(f'{a:.4f}' for a in accs)}  " if accs else ""
                losses = " ".join(f"{m['train_loss']:.4f}" for m in per_model)
                tqdm.write(f"epoch {epoch + 1}/{cfg.epochs}  loss {losses}  {test}"
                           f"({per_model[0]['images_per_s'] * len(models):.0f} model-img/s)")
            for history, metrics in zip(histories, per_model):
                history.append(metrics)
            due = time.monotonic() - last_write >= checkpoint_every_s or epoch + 1 == cfg.epochs
            if checkpoint is not None and ctx.is_main and due:
                last_write = time.monotonic()
                save_stack(checkpoint, fingerprints, epoch, histories, stack, opt)
            for i, metrics in enumerate(per_model):
                if report:
                    report(i, metrics)
    for i, model in enumerate(models):
        model.load_state_dict(stack.state_dict_of(i))
    return histories


def _one_recipe(cfgs: list[TrainConfig], n_models: int) -> TrainConfig:
    """The recipe every model trains with (their configs may differ in seed alone)."""
    if len(cfgs) != n_models:
        raise ValueError(f"{n_models} models but {len(cfgs)} configs: give one config per model")
    for i, c in enumerate(cfgs[1:], 1):
        differ = [f.name for f in dataclasses.fields(c)
                  if f.name != "seed" and getattr(c, f.name) != getattr(cfgs[0], f.name)]
        if differ:
            raise ValueError(f"configs 0 and {i} differ in {differ}: models train together only "
                             "with one recipe (they may differ in seed)")
    if cfgs[0].streamed_only:
        raise ValueError(f"{cfgs[0].streamed_only}: the on-device trainer does not implement these; they are "
                         "the streamed trainer's (structinit/training/streamed.py, datasets read from a directory)")
    return cfgs[0]


def _resume(models: list[torch.nn.Module], fingerprints: list[dict], checkpoint: Path | None,
            device: torch.device, epochs: int, ctx: DistributedContext) -> list[tuple[list, dict]] | None:
    """checkpoint.restore_stack on every process: rank 0 restores first (and moves a damaged
    checkpoint aside), then the others read what it left, so that every process starts from
    the same epoch with rank 0's weights."""
    if ctx.is_main:
        restored = restore_stack(models, fingerprints, checkpoint, device, epochs, announce=True)
    ctx.barrier()
    if not ctx.is_main:
        restored = restore_stack(models, fingerprints, checkpoint, device, epochs, announce=False)
    for model in models:
        # every process builds the models itself; should a build differ (a solve that is not
        # bitwise reproducible on a GPU), rank 0's weights, the ones written out, are trained
        ctx.broadcast_from_main([*model.parameters(), *model.buffers()])
    return restored


def _one_of(checkpoint_path, i: int):
    """Model i's own checkpoint file when models train one after another."""
    if not checkpoint_path:
        return None
    path = Path(checkpoint_path)
    return path.with_name(f"{path.stem}-model{i}{path.suffix}")


def train_epoch(step: Callable, batches: EpochBatches, seeds: list[int], epoch: int, *, cfg: TrainConfig,
                device: torch.device, ctx: DistributedContext, progress: bool) -> list[dict]:
    """One pass of every stacked model over its (shuffled) training set; each model's metrics.
    No host sync until its end (epoch_steps runs on the device, its sums are read once after)."""
    t0 = time.perf_counter()
    sums = epoch_steps(step, batches, seeds, epoch, cfg=cfg, device=device, progress=progress)
    _stop_if_nonfinite(sums["first_bad_step"], seeds, epoch, batches.steps_per_epoch)
    loss_sum, correct = sums["loss_sum"], sums["correct"]
    if ctx.enabled:
        loss_sum, correct = ctx.sum(loss_sum), ctx.sum(correct)
    if device.type == "cuda":
        torch.cuda.synchronize()                      # so train_seconds is the real time
    seen = batches.steps_per_epoch * batches.batch_size
    lr = sums["lr"]
    train_seconds = time.perf_counter() - t0
    return [{"epoch": epoch + 1, "lr": lr, "train_loss": loss / seen, "train_acc": c / seen,
             "seconds": train_seconds, "train_seconds": train_seconds,
             "images_per_s": seen / train_seconds}
            for loss, c in zip(loss_sum.tolist(), correct.tolist())]


def epoch_steps(step: Callable, batches: EpochBatches, seeds: list[int], epoch: int, *, cfg: TrainConfig,
                device: torch.device, progress: bool) -> dict:
    """The device work of an epoch (or of its first batches.steps steps): every step, each
    step(x, y, lr=..., meanwhile=...) -> step.StepResult (train_step with the run's stack,
    optimizer and gradients, or its StepGraph). Returns per-model sums on the device
    (loss_sum, correct, first_bad_step: -1 or the first step whose loss or gradient was not
    finite), read by the caller after the loop: on a GPU a read inside it would be a host sync
    per step; and lr, the last step's (a float)."""
    n_steps, n = batches.steps_per_epoch, len(seeds)
    total_steps, warmup_steps = schedule_steps(cfg, n_steps)
    loss_sum = torch.zeros(n, device=device)
    correct = torch.zeros(n, device=device, dtype=torch.long)
    first_bad_step = torch.full((n,), -1, device=device, dtype=torch.long)  # per model
    # A NaN/inf loss ends the cell. On CPU a check per step costs nothing (and stops a
    # diverged run at once); on a GPU it would be a host sync per step, so there the
    # device-side record is read at the end of the epoch (train_epoch).
    check_each_step = device.type == "cpu"
    upcoming, lr = batches.batch(0), None
    for i in tqdm(range(len(batches)), desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not progress, leave=False,
                  mininterval=1.0):
        lr = lr_at(epoch * n_steps + i, total_steps, warmup_steps, cfg)
        out = step(*upcoming, lr=lr, meanwhile=functools.partial(batches.batch, i + 1))  # the next batch, meanwhile
        upcoming = out.meanwhile
        first_bad_step = torch.where((first_bad_step < 0) & out.nonfinite, i, first_bad_step)
        if check_each_step:
            _stop_if_nonfinite(first_bad_step, seeds, epoch, n_steps)
        loss_sum += out.loss_sum
        correct += out.correct
    return {"loss_sum": loss_sum, "correct": correct, "first_bad_step": first_bad_step, "lr": lr}


def _stop_if_nonfinite(first_bad_step: torch.Tensor, seeds: list[int], epoch: int, n_steps: int) -> None:
    bad = [(seed, step) for seed, step in zip(seeds, first_bad_step.tolist()) if step >= 0]
    if bad:
        seed, step = bad[0]
        raise NonFiniteLossError(
            f"training loss or gradient of seed {seed} became NaN or inf at epoch {epoch + 1}, step {step + 1} of "
            f"{n_steps} (global step {epoch * n_steps + step + 1}); this cell has "
            f"failed{' (also seeds ' + str([s for s, _ in bad[1:]]) + ')' if len(bad) > 1 else ''}"
            " and nothing after its last finished epoch was written. Lower the lr or check the data.")
