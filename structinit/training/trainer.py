"""The trainer: the paper's recipe, device-agnostic, resumable, no host sync in the step loop.

    train_models([model_a, model_b], data, [cfg_a, cfg_b]) -> one list of epoch metrics per model
    train_model(model, data, cfg)                          -> the same for one model

Models of one architecture and recipe (differing in weights and seed) train as one stack (stacked.py), each
ending as it would trained alone, to float noise. Top to bottom: the epoch loop; the step (`train_step`:
forward, backward, per-model clipping, one AdamW step over the stack) and its lr schedule; the step as one
CUDA graph (`StepGraph`); the batches, gathered, augmented and normalized on the device from one uint8 copy
of the dataset; the evaluation. Each model's data order comes from a generator seeded by (seed, epoch), so a
resumed run continues exactly as the uninterrupted one. checkpoint.py keeps every model in one file, written
atomically, so a kill never leaves them at different epochs; structinit/memory.py plans stacking and memory.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from pathlib import Path
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from structinit.config import RandAugmentPolicy
from structinit.data.augment import apply_hflip, apply_rand_augment, draw_hflip, draw_rand_augment
from structinit.data.tensors import ImageData
from structinit.distributed import DistributedContext, refuse_batchnorm
from structinit.errors import StructinitError
from structinit.memory import estimate_training_memory, graph_fits, memory_report, plan_stacking
from structinit.training.checkpoint import checkpoint_fingerprint, restore_stack, save_stack
from structinit.training.config import TrainConfig, steps_per_epoch
from structinit.training.stacked import (GUARDED_CALLS, ChunkedGradients, Objective, StackedModels, WholeBatchGradients,
                                         autocast, compute_dtype, plan_gradients, precision_note)


def train_model(model: torch.nn.Module, data: ImageData, cfg: TrainConfig, *,
                device: torch.device | str | None = None, train_indices: torch.Tensor | None = None,
                checkpoint_path: str | Path | None = None, fingerprint: dict | None = None,
                on_epoch_end=None, progress: bool = True, dtype: str | None = None) -> list[dict]:
    """Train one model in place (see train_models); on_epoch_end(metrics) as in streamed.train_streamed."""
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
    """Train models of one architecture in place, stacked, or one after another (a call each) where
    memory.plan_stacking says so; returns each model's epoch metrics.

    cfgs: one per model, equal but for `seed`. dtype: "bf16" or "fp32", as stacked.compute_dtype decides (None: here).
    checkpoint_path: every model's weights, optimizer state and history in one file (one after another: one file
    each, checkpoint-model<i>.pt), resumed when every fingerprint (config + `fingerprints[i]`, e.g. the init)
    matches; a mismatch is overwritten, a damaged file moved aside and all start afresh. on_epoch_end(i, metrics)
    runs for every epoch of model i, restored ones first. checkpoint_every_s: write only once this long has passed
    since the last write (and after the last epoch), as rewriting a growing history every short epoch is costly;
    a kill loses at most this much. 0: every epoch. micro_batch: images per model per forward pass, gradients
    summed by share, so a batch too big for memory trains as the same step; None: whole batch (or the CPU's chunks).
    ctx: processes (torchrun) sharing the stack each draw and augment the whole global batch, keep their slice and
    average gradients before clipping: the one-process step, to float noise. Rank 0 alone checkpoints and reports.
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
    """restore_stack on every process: rank 0 first (moving a damaged file aside), then the rest read what it
    left, so all start at the same epoch with rank 0's weights."""
    if ctx.is_main:
        restored = restore_stack(models, fingerprints, checkpoint, device, epochs, announce=True)
    ctx.barrier()
    if not ctx.is_main:
        restored = restore_stack(models, fingerprints, checkpoint, device, epochs, announce=False)
    for model in models:
        # builds may differ by process (a solve not bitwise reproducible on GPU): train rank 0's, the saved ones
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
    """One epoch of every stacked model; each one's metrics. No host sync until the end, where the sums are read."""
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
    """An epoch's steps (or batches.steps of them) on the device; step(x, y, lr=, meanwhile=) -> StepResult is
    train_step or a StepGraph. Returns per-model device sums (loss_sum, correct, first_bad_step: -1 or the first
    non-finite step), read after the loop as a read per step is a GPU host sync, and the last step's lr."""
    n_steps, n = batches.steps_per_epoch, len(seeds)
    total_steps, warmup_steps = schedule_steps(cfg, n_steps)
    loss_sum = torch.zeros(n, device=device)
    correct = torch.zeros(n, device=device, dtype=torch.long)
    first_bad_step = torch.full((n,), -1, device=device, dtype=torch.long)  # per model
    # A NaN/inf ends the cell. On CPU a per-step check is free and stops a diverged run at once; on a GPU
    # it is a host sync per step, so there train_epoch reads the device-side record after the epoch.
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


class StepResult(NamedTuple):
    loss_sum: torch.Tensor      # (N,) each model's summed per-image loss over its batch
    correct: torch.Tensor       # (N,) each model's correct predictions
    nonfinite: torch.Tensor     # (N,) bool: the model's loss or gradient norm was NaN or inf
    meanwhile: object           # what the caller's `meanwhile()` returned


def train_step(stack: StackedModels, opt: torch.optim.Optimizer, gradients: "WholeBatchGradients | ChunkedGradients",
               x: torch.Tensor, y: torch.Tensor, *, lr: float | None, max_norm: float, ctx: DistributedContext,
               meanwhile: Callable[[], object] | None = None) -> StepResult:
    """One step of every stacked model on x (N, B, ...), y (N, B); results stay on the device. meanwhile(): the
    caller's work (the next batch), run between submitting and collecting the gradients, so the CPU's chunks
    overlap it. lr None: keep the optimizer's (StepGraph fills its device tensor)."""
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    # (1)-(2) forward, loss and backward of every piece of the batch
    pending = gradients.submit(x, y)
    upcoming = meanwhile() if meanwhile is not None else None
    loss_sum, correct = gradients.collect(pending)                     # sets each parameter's .grad
    if ctx.enabled:                               # what DDP does: the global batch's mean gradient,
        ctx.average_gradients(list(stack.trainable().values()))        # in a few bucketed collectives
    # (3) each model's gradients clipped to its own total norm (inf: not clipped)
    norms = stack.clip_grad_norms(max_norm)                            # (N,)
    nonfinite = ~torch.isfinite(loss_sum) | ~torch.isfinite(norms)
    # (4) the update
    opt.step()
    return StepResult(loss_sum, correct, nonfinite, upcoming)


def stacked_adamw(stack: StackedModels, states: list[dict | None], cfg: TrainConfig,
                  device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the stack, each model's restored state (optimizer_state_of's) in its slice. AdamW is elementwise,
    so this updates each model as its own would. fused: one kernel for all parameters, not a few per tensor."""
    named = stack.trainable()
    opt = torch.optim.AdamW(decay_groups(list(named.values()), cfg.weight_decay, stack.stacked_dims), lr=cfg.lr,
                            eps=cfg.adam_eps, fused=device.type in ("cuda", "cpu"))
    if states[0] is not None:                 # one checkpoint: all restored, or none
        steps = {s["step"] if s else None for s in states}
        assert len(steps) == 1, f"stacked runs at different optimizer steps {steps}"
        for name, p in named.items():
            opt.state[p] = {
                "step": torch.tensor(float(states[0]["step"]), dtype=torch.float32, device=device),
                **{k: stack.stack_slices([stack.in_model_layout(name, s[k][name]) for s in states]).to(device)
                   for k in ("exp_avg", "exp_avg_sq")}}
    return opt


def lr_at(step: int, total_steps: int, warmup_steps: int, cfg: TrainConfig) -> float:
    """Linear warm-up from 0, then cosine to min_lr; a function of the step, so resumable. cfg.warmup_prefix: the
    cosine starts after warm-up; else (timm's default, the paper's runs) it spans all steps, warm-up over its start."""
    if step < warmup_steps:
        return cfg.lr * (step + 1) / warmup_steps
    t = ((step - warmup_steps) / max(1, total_steps - warmup_steps) if cfg.warmup_prefix
         else step / max(1, total_steps))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t))


def schedule_steps(cfg: TrainConfig, steps_per_epoch: int) -> tuple[int, int]:
    """lr_at's (total_steps, warmup_steps); config.py's match_steps counts warm-up steps the same way."""
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


# Eager steps before capture, real steps of the run: the objective's guarded calls (a compile and checks that
# synchronize, so cannot be captured), AdamW's state (made at its first step), cuBLAS's workspace on the stream.
WARMUP_STEPS = GUARDED_CALLS


# Set when a capture fails, so later cells in this process neither retry nor warn again.
_FAILED_CAPTURE = False


def plan_step_graph(setting: str, way: str, device: torch.device, processes: int,
                    micro_batch: int | None, batch: int) -> tuple[bool, str]:
    """Whether the step is captured as one CUDA graph (StepGraph), and why, for the log. setting: TrainConfig's
    cuda_graph; batch: images per model per step here. auto: on CUDA for a stack, whose small kernels leave the host
    setting the pace (one plain model fills the card by itself)."""
    if setting == "off":
        return False, "cuda_graph: off"
    if _FAILED_CAPTURE:
        return False, "capturing failed earlier in this process"
    if device.type != "cuda":
        return False, f"no CUDA graph on {device.type}"
    if way == "plain":
        return False, "one model: its kernels, not the host, set its pace"
    if way == "by vmap":
        return False, "the vmap way does not capture"
    if processes > 1:
        return False, "several processes: the gradients' collectives stay outside a graph"
    if micro_batch is not None and micro_batch < batch:
        return False, "micro-batches: the step is several passes"
    return True, "the whole step as one CUDA graph"


class StepGraph:
    """train_step captured once as a CUDA graph and replayed: a step is then a copy of batch and lr into the graph's
    inputs and one launch, not hundreds of launches that each cost the host more than a small model's kernel costs.

        step = StepGraph(stack, opt, gradients, max_norm=3.0, ctx=ctx, capture=True)
        out = step(x, y, lr=lr, meanwhile=next_batch)        # a StepResult, as train_step's

    WARMUP_STEPS steps run eager on the capture stream, the next is captured, the rest replay. Results are the
    graph's tensors, overwritten by the next step. lr is a device tensor the capturable AdamW reads, so the schedule
    moves inside the graph; the optimizer must stay this one's. capture=False: the same steps eager, same tensors
    (CPU, tests). A failed capture warns once and re-runs that step eager (capturing computes nothing)."""

    def __init__(self, stack: StackedModels, opt: torch.optim.Optimizer, gradients: "WholeBatchGradients",
                 *, max_norm: float, ctx: DistributedContext, capture: bool):
        self.step = functools.partial(train_step, stack, opt, gradients, lr=None, max_norm=max_norm, ctx=ctx)
        device = next(iter(stack.trainable().values())).device
        # One float32 lr for all groups on the parameters' device: fused AdamW reads a host tensor on the host,
        # so a capture would bake it in.
        self.lr = torch.tensor(float(opt.param_groups[0]["lr"]), dtype=torch.float32, device=device)
        for group in opt.param_groups:
            group["lr"], group["capturable"] = self.lr, True
        # skip AdamW's warning that an uncaptured capturable step is slow: the warm-up steps are so on purpose
        opt._warned_capturable_if_run_uncaptured = True
        self.capture, self.device = capture, device
        self.x = self.y = self.out = self.graph = self.stream = None
        self.steps, self.failed = 0, False

    def _inputs(self, x: torch.Tensor, y: torch.Tensor, lr: float) -> None:
        if self.x is None:
            self.x, self.y = torch.empty_like(x), torch.empty_like(y)
        elif x.shape != self.x.shape or y.shape != self.y.shape:
            raise ValueError(f"a captured step takes one shape: batch {tuple(x.shape)}, {tuple(y.shape)} where it "
                             f"was captured with {tuple(self.x.shape)}, {tuple(self.y.shape)}")
        self.x.copy_(x)
        self.y.copy_(y)
        self.lr.fill_(lr)

    def _eager(self) -> tuple:
        out = self.step(self.x, self.y)
        return out.loss_sum, out.correct, out.nonfinite

    def __call__(self, x: torch.Tensor, y: torch.Tensor, *, lr: float,
                 meanwhile: Callable[[], object] | None = None) -> StepResult:
        self._inputs(x, y, lr)
        if self.graph is not None:
            self.graph.replay()
            out = self.out
        elif not self.capture or self.failed:
            out = self._eager()
        elif self.steps < WARMUP_STEPS:
            out = self._on_capture_stream(self._eager)
        else:
            out = self._capture()
        self.steps += 1
        return StepResult(*out, meanwhile() if meanwhile is not None else None)

    def _on_capture_stream(self, fn: Callable[[], tuple]) -> tuple:
        """fn() on the capture stream, after work queued before it, before work queued after (sums, next batch)."""
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            out = fn()
        torch.cuda.current_stream(self.device).wait_stream(self.stream)
        return out

    def _capture(self) -> tuple:
        graph = torch.cuda.CUDAGraph()
        try:
            def capture():
                with torch.cuda.graph(graph, stream=self.stream):
                    return self._eager()
            out = self._on_capture_stream(capture)
            graph.replay()                           # the captured step: capturing ran nothing
            torch.cuda.synchronize(self.device)      # a failed replay surfaces here, not steps later
        except Exception as e:                       # noqa: BLE001 (any capture failure: go on eager)
            first = str(e).splitlines()[0][:200] if str(e) else ""
            print(f"warning: capturing the step as a CUDA graph failed ({type(e).__name__}: {first}); "
                  "training eager (cuda_graph: off in the recipe skips the attempt)")
            global _FAILED_CAPTURE
            self.failed = _FAILED_CAPTURE = True
            return self._eager()
        self.graph, self.out = graph, out
        return out


# ---- each model's batches: its order and augmentation, drawn on the device -------------------


class BatchAugmentation:
    """Per-batch image transforms on the device, uint8 in, float out. augment(x, gens): len(gens) models' batches
    (model i's B images are rows i*B..), RandAugment and flips drawn from each model's generator in the order it
    would draw alone, applied in one pass over all, then normalized. normalize(x): a test batch, normalized only."""

    def __init__(self, data: ImageData, cfg: TrainConfig, device: torch.device):
        spec = data.spec
        self.mean = torch.tensor(spec.mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(spec.std, device=device).view(1, -1, 1, 1) * 255
        self.policy = RandAugmentPolicy.parse(cfg.randaugment) if cfg.randaugment else None
        self.hflip = cfg.hflip

    def normalize(self, x_uint8: torch.Tensor) -> torch.Tensor:
        return (x_uint8.float() - self.mean) / self.std

    def augment(self, x_uint8: torch.Tensor, gens: list[torch.Generator]) -> torch.Tensor:
        x = x_uint8.float()
        b, device = len(x) // len(gens), x.device
        draws = [(draw_rand_augment(b, self.policy, g, device) if self.policy is not None else None,
                  draw_hflip(b, g, device) if self.hflip else None) for g in gens]
        if self.policy is not None:
            layers = [{k: torch.cat([d[0][i][k] for d in draws]) for k in ("op", "mag", "sign")}
                      for i in range(self.policy.num_layers)]
            x = apply_rand_augment(x, layers, fill=self.mean)
        if self.hflip:
            x = apply_hflip(x, torch.cat([d[1] for d in draws]))
        return (x - self.mean) / self.std


def epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    """The generator of one model's epoch: its data order, then its augmentation draws."""
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + epoch)


class EpochBatches:
    """Each model's batches of one epoch, from its own generator as it would draw alone. batch(i): step i's
    (x (N, B, ...), y (N, B)), this process's rows under torchrun; None past the end. The ragged tail is dropped
    (static shapes); `steps` stops the epoch early (tests)."""

    def __init__(self, train_x: torch.Tensor, train_y: torch.Tensor, augmentation: BatchAugmentation,
                 gens: list[torch.Generator], batch_size: int, ctx: DistributedContext, steps: int | None = None):
        self.train_x, self.train_y, self.augmentation, self.gens = train_x, train_y, augmentation, gens
        self.batch_size, self.ctx = batch_size, ctx
        self.steps_per_epoch = steps_per_epoch(len(train_y), batch_size)
        self.steps = self.steps_per_epoch if steps is None else min(steps, self.steps_per_epoch)
        # side by side: one gather per step for every model, not one per model
        self.orders = torch.stack([torch.randperm(len(train_y), device=train_y.device, generator=g)
                                   for g in gens])                                        # (N, n)
        local = batch_size // ctx.world_size
        self.local_rows = slice(ctx.rank * local, (ctx.rank + 1) * local)

    def __len__(self) -> int:
        return self.steps

    def batch(self, i: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        if i == self.steps:
            return None
        b = self.batch_size
        rows = self.orders[:, i * b:(i + 1) * b]                                         # (N, B)
        x = self.augmentation.augment(self.train_x[rows.flatten()], self.gens)          # (N*B, C, H, W)
        x, y = x.view(len(self.gens), b, *x.shape[1:]), self.train_y[rows]              # (N, B, ...), (N, B)
        if self.ctx.enabled:                          # this process's rows of the global batch
            x, y = x[:, self.local_rows], y[:, self.local_rows]
        return x, y


# ---- test loss and accuracy of every model, summed on the device -----------------------------


@torch.no_grad()
def evaluate_stack(stack: StackedModels, images: torch.Tensor, labels: torch.Tensor, *,
                   augmentation: BatchAugmentation, device: torch.device, dtype: str,
                   batch_size: int = 1024) -> list[dict]:
    """Each stacked model's {"test_loss", "test_acc"}."""
    loss_sum, correct = evaluation_sums(stack, images, labels, augmentation=augmentation, device=device,
                                        dtype=dtype, batch_size=batch_size)
    n = len(labels)
    return [{"test_loss": loss / n, "test_acc": c / n}          # the one host read, after the loop
            for loss, c in zip(loss_sum.tolist(), correct.tolist())]


@torch.no_grad()
def evaluation_sums(stack: StackedModels, images: torch.Tensor, labels: torch.Tensor, *,
                    augmentation: BatchAugmentation, device: torch.device, dtype: str,
                    batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's summed test loss (N,) and correct count (N,), on the device."""
    stack.eval()
    loss_sum = torch.zeros(stack.n, device=device)
    correct = torch.zeros(stack.n, device=device, dtype=torch.long)
    for i in range(0, len(labels), batch_size):
        x, y = augmentation.normalize(images[i:i + batch_size]), labels[i:i + batch_size]
        with autocast(device, dtype):
            logits = stack(x, shared_input=True)                   # (N, B, classes)
        y = y.expand(stack.n, -1)
        loss_sum += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                    reduction="none").view(y.shape).sum(1)
        correct += (logits.argmax(-1) == y).sum(1)
    stack.train()
    return loss_sum, correct


class NonFiniteLossError(StructinitError, FloatingPointError):
    """A training loss went NaN or inf: the cell failed; nothing after its last finished epoch is written."""


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
