"""The trainer: the paper's recipe, device-agnostic, resumable, no host sync in the step loop.

    train_models([model_a, model_b], data, [cfg_a, cfg_b]) -> one list of epoch metrics per model
    train_model(model, data, cfg)                          -> the same for one model

Several models of one architecture and one recipe (they may differ in weights and seed) train
as one stacked model (stacked.py): each op runs all of them at once, and each model's result
is what it would be trained alone, to float noise.

The whole dataset lives on the training device as one uint8 tensor; each batch is gathered,
augmented (augment.py) and normalized there. Per-epoch randomness (shuffle, augmentation)
comes from a generator seeded by (seed, epoch), so a run resumed from its end-of-epoch
checkpoint continues exactly as the uninterrupted run would have. Each model has its own
data order (its seed's) and its own metrics; the checkpoint holds every model's state in one
file, written atomically, so a kill can never leave the models at different epochs.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import threading
import time
import weakref
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from structinit.data.augment import apply_hflip, apply_rand_augment, draw_hflip, draw_rand_augment
from structinit.data.tensors import ImageData
from structinit.io import save_checked
from structinit.training.common import (NonFiniteLossError, _decay_groups, autocast, checkpoint_fingerprint,
                                        default_device, lr_at, precision_note, resolve_amp, restore_checkpoint,
                                        schedule_steps)
from structinit.training.common import compute_dtype as compute_dtype   # re-exported: stages/train.py
from structinit.config import RandAugmentPolicy
from structinit.training.config import TrainConfig
from structinit.training.gradient_step import _why_not_splittable, plan_gradient_step
from structinit.training.memory import estimate_training_memory, training_flops_per_image
from structinit.distributed import DistributedContext, refuse_batchnorm
from structinit.training.stacked import StackedModels, mean_cross_entropy
from structinit.training.steps import steps_per_epoch

# What both trainers share (the schedule, parameter groups, precision, NonFiniteLossError,
# default_device, the checkpoint format) is in common.py; compute_dtype and default_device
# stay importable from here (stages/train.py, structinit.default_device).


class BatchAugmentation:
    """The trainer's per-batch image transforms, on the device: uint8 images in, float out.

    augment(x, gens): the training batches of len(gens) models side by side (model i's B images
    are rows i*B..), randomly augmented (the config's RandAugment policy and horizontal flips,
    each model's drawn from its own generator, in the order one model alone draws them; the
    transforms then run once over every model's images), then normalized by the dataset's
    mean and std.
    normalize(x): a test batch, normalized only.
    """

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


def _epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + epoch)


@torch.no_grad()
def evaluate(model, images: torch.Tensor, labels: torch.Tensor, *, augmentation: BatchAugmentation,
             cfg: TrainConfig, device: torch.device, batch_size: int = 1024) -> dict:
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for i in range(0, len(labels), batch_size):
        x, y = augmentation.normalize(images[i:i + batch_size]), labels[i:i + batch_size]
        with autocast(cfg, device):
            logits = model(x)
        loss_sum += F.cross_entropy(logits.float(), y, reduction="sum")
        correct += (logits.argmax(-1) == y).sum()
    model.train()
    n = len(labels)
    return {"test_loss": loss_sum.item() / n, "test_acc": correct.item() / n}


def train_model(model: torch.nn.Module, data: ImageData, cfg: TrainConfig, *,
                device: torch.device | str | None = None, train_indices: torch.Tensor | None = None,
                checkpoint_path: str | Path | None = None, fingerprint: dict | None = None,
                on_epoch_end=None, progress: bool = True) -> list[dict]:
    """Train one model in place; returns one metrics dict per epoch (see train_models).
    on_epoch_end(metrics), as the streamed trainer's (streamed.train)."""
    report = (lambda i, metrics: on_epoch_end(metrics)) if on_epoch_end else None
    return train_models([model], data, [cfg], device=device, train_indices=train_indices,
                        checkpoint_path=checkpoint_path, fingerprints=[fingerprint],
                        on_epoch_end=report, progress=progress)[0]


def train_models(models: list[torch.nn.Module], data: ImageData, cfgs: list[TrainConfig], *,
                 device: torch.device | str | None = None, train_indices: torch.Tensor | None = None,
                 checkpoint_path: str | Path | None = None, fingerprints: list | None = None,
                 on_epoch_end: Callable[[int, dict], None] | None = None, progress: bool = True,
                 ctx: DistributedContext | None = None, checkpoint_every_s: float = 0.0,
                 micro_batch: int | None = None) -> list[list[dict]]:
    """Train models of one architecture in place, stacked (on a GPU, one after another where
    plan_stacking says so, each as a call of its own); returns each one's epoch metrics.

    cfgs: one per model, equal except for `seed` (each model's data order and augmentation).
    checkpoint_path: one file with every model's weights, optimizer state and history, written
    atomically (a temporary file, then a rename) after every epoch (models trained one after
    another: one file each, checkpoint-model<i>.pt beside it), and resumed from when it
    exists and its fingerprints (each model's config + whatever the caller adds in
    `fingerprints[i]`, e.g. the init) all match; a mismatching checkpoint is ignored and
    overwritten, a damaged one moved aside (all models then start afresh). One file, not one
    per model: a kill between two models' writes would leave them at different epochs, and
    no catch-up of one model alone is bitwise the stacked step. on_epoch_end(i, metrics) is
    called for every epoch of model i, including (first) the epochs restored from the checkpoint.
    checkpoint_every_s: write the checkpoint at the end of an epoch only once this many seconds
    have passed since the last write (and after the last epoch); 0, every epoch. A run of many
    short epochs (the data-size study: 1,760 epochs of 2 steps) otherwise spends a third of
    its time re-writing a history that grows every epoch; a kill then loses at most this
    many seconds of finished epochs.
    micro_batch: images per model per forward pass (gradients summed over the pieces, each
    weighted by its share): a batch too large for the device's memory trains as the same
    step, to float noise. None: the whole batch (or the CPU's chunks: gradient_step.py).

    ctx: several processes (torchrun, distributed.py) train the stack together. Every process
    draws and augments the whole global batch (the same generators), keeps its own slice of
    it, and the gradients are averaged over processes before clipping: each step is the
    one-process step, to float noise. Rank 0 alone writes checkpoints and calls on_epoch_end.
    """
    # ---- what trains, where, in which precision ----
    if len(cfgs) != len(models):
        raise ValueError(f"{len(models)} models but {len(cfgs)} configs: give one config per model")
    for i, c in enumerate(cfgs[1:], 1):
        differ = [f.name for f in dataclasses.fields(c)
                  if f.name != "seed" and getattr(c, f.name) != getattr(cfgs[0], f.name)]
        if differ:
            raise ValueError(f"configs 0 and {i} differ in {differ}: models train together only "
                             "with one recipe (they may differ in seed)")
    cfg = cfgs[0]
    if cfg.streamed_only:
        raise ValueError(f"{cfg.streamed_only}: the on-device trainer does not implement these; they are "
                         "the streamed trainer's (structinit/training/streamed.py, datasets read from a directory)")
    ctx = ctx or DistributedContext()
    if cfg.batch_size % ctx.world_size:
        raise ValueError(f"batch_size={cfg.batch_size} is not divisible by the {ctx.world_size} processes; "
                         "the global batch must split evenly")
    refuse_batchnorm(models, ctx.world_size)         # before the device plan: the model's own refusal first
    device = torch.device(device) if device is not None else ctx.device() if ctx.enabled else default_device()
    if len(models) > 1:
        together, why = plan_stacking(models, data, cfg, device, processes=ctx.world_size,
                                      train_size=None if train_indices is None else len(train_indices),
                                      micro_batch=micro_batch)
        if not together:
            # one after another, each on timm's own module; each its own checkpoint file
            if progress and ctx.is_main:
                print(f"training the {len(models)} models one after another: {why}")
            return [train_models([m], data, [c], device=device, train_indices=train_indices,
                                 checkpoint_path=_one_of(checkpoint_path, i),
                                 fingerprints=[(fingerprints or [None] * len(models))[i]],
                                 on_epoch_end=(lambda _, m, i=i: on_epoch_end(i, m)) if on_epoch_end else None,
                                 progress=progress, ctx=ctx, checkpoint_every_s=checkpoint_every_s,
                                 micro_batch=micro_batch)[0]
                    for i, (m, c) in enumerate(zip(models, cfgs))]
    note = precision_note(cfg, device, compute_dtype(cfg, device, models[0]))
    cfg, dtype = resolve_amp(cfg, device, models[0])                          # amp='auto' resolved, once
    seeds = [c.seed for c in cfgs]
    models = [m.to(device) for m in models]
    fingerprints = [checkpoint_fingerprint(c, dtype, f) for c, f in zip(cfgs, fingerprints or [None] * len(models))]
    report = on_epoch_end if on_epoch_end and ctx.is_main else None
    show = progress and ctx.is_main

    # ---- resume: every model's history and optimizer state, from one file ----
    # Rank 0 restores first (and moves a damaged checkpoint aside), then the others read what
    # it left, so that every process starts from the same epoch.
    checkpoint = Path(checkpoint_path) if checkpoint_path else None
    if ctx.is_main:
        restored = _restore(models, fingerprints, checkpoint, device, cfg.epochs, announce=True)
    ctx.barrier()
    if not ctx.is_main:
        restored = _restore(models, fingerprints, checkpoint, device, cfg.epochs, announce=False)
    histories = [history for history, _ in restored] if restored else [[] for _ in models]
    for model in models:
        # every process builds the models itself; should a build differ (a solve that is not
        # bitwise reproducible on a GPU), rank 0's weights, the ones written out, are trained
        ctx.broadcast_from_main([*model.parameters(), *model.buffers()])
    for i, history in enumerate(histories):
        for metrics in history:
            if report:
                report(i, metrics)
    start = len(histories[0])                         # every model's: restored from one file
    if start >= cfg.epochs:
        return histories

    # ---- the data on the device, the stack, its optimizer and its gradient step ----
    idx = train_indices if train_indices is not None else torch.arange(len(data.train_labels))
    train_x = data.train_images[idx].to(device)                        # uint8 (n, C, H, W)
    train_y = data.train_labels[idx].to(device)                        # (n,)
    test_x, test_y = data.test_images.to(device), data.test_labels.to(device)
    batch_size = min(cfg.batch_size, len(train_y))    # the global batch; each process trains its slice
    augmentation = BatchAugmentation(data, cfg, device)
    stack = StackedModels(models).to(device).train()
    attention = stack.choose_attention(device, dtype)
    opt = _stacked_adamw(stack, [state for _, state in restored] if restored else [None] * len(models), cfg, device)
    objective, compiled = step_objective(stack, cfg, device)
    step, how = plan_gradient_step(cfg.cpu_chunks, stack, device, batch_size // ctx.world_size, objective,
                                   micro_batch=micro_batch)
    if compiled:
        how += f", {compiled}"
    if show:
        where = f"{device} x {ctx.world_size} processes" if ctx.enabled else device
        way = "timm's own module" if stack.way == "plain" else f"stacked ({stack.way})"
        print(f"training {len(models)} model(s) {way} on {where} in {dtype}, "
              f"epochs {start + 1}-{cfg.epochs}: {how} per step, {attention}" + (f" ({note})" if note else "")
              + (f"; {why}" if device.type == "cuda" and len(models) > 1 else ""))
        fused = next((m.fused_attn for m in stack.base.modules() if hasattr(m, "fused_attn")), None)
        _announce_memory(models, augmentation.normalize(train_x[:8]), batch_size // ctx.world_size,
                         micro_batch, dtype, device, data_bytes=train_x.nbytes + test_x.nbytes, fused_attention=fused,
                         test_images=len(test_y))

    # ---- the epochs: train, evaluate when due, log, checkpoint, report ----
    last_write = time.monotonic()
    with step:
        for epoch in range(start, cfg.epochs):
            per_model = _train_epoch(stack, opt, step, train_x, train_y, augmentation, seeds, epoch,
                                     cfg=cfg, batch_size=batch_size, device=device, ctx=ctx, progress=show)
            if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
                t = time.perf_counter()
                with step.all_threads():
                    tests = _evaluate_stacked(stack, test_x, test_y, augmentation=augmentation,
                                              cfg=cfg, device=device)
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
                save_checked(checkpoint, {
                    "fingerprints": fingerprints, "epoch": epoch,
                    "models": [{"history": history, "model": stack.state_dict_of(i),
                                "optimizer": _optimizer_state_of(opt, stack, i)}
                               for i, history in enumerate(histories)]})
            for i, metrics in enumerate(per_model):
                if report:
                    report(i, metrics)
    for i, model in enumerate(models):
        model.load_state_dict(stack.state_dict_of(i))
    return histories


def _announce_memory(models, sample, batch: int, micro_batch: int | None, dtype: str, device: torch.device,
                     data_bytes: int, fused_attention: bool | None = None, test_images: int | None = None) -> None:
    """Print the cell's memory estimate (memory.py) before it trains; on a GPU, say whether it
    fits and which STRUCTINIT_MICRO_BATCH would (where micro-batches are the same step)."""
    estimate = estimate_training_memory(models, sample, batch=batch, micro_batch=micro_batch, dtype=dtype,
                                        data_bytes=data_bytes, fused_attention=fused_attention,
                                        test_images=test_images, device_type=device.type)
    line = estimate.describe()
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        line += f"; the GPU has {total / 2 ** 30:.1f} GiB"
        if estimate.total_bytes > 0.9 * total:
            fit = None if _why_not_splittable(models[0]) else estimate.micro_batch_to_fit(int(0.8 * total))
            line += (f": it may not fit; try STRUCTINIT_MICRO_BATCH={fit} (the same step, in pieces)" if fit
                     else ": it may not fit, and micro-batches cannot help (one image per pass is too much, or the "
                          "model has BatchNorm or dropout); stack fewer seeds (grid.seeds) or use more GPUs")
    print(line)


def _restore(models: list[torch.nn.Module], fingerprints: list[dict], checkpoint: Path | None,
             device: torch.device, epochs: int, announce: bool) -> list[tuple[list, dict]] | None:
    """Each model's (history, optimizer state), its weights loaded, from `checkpoint` if it is
    sound and was written for exactly these fingerprints (common.restore_checkpoint); None:
    every model starts afresh. announce: say which (rank 0)."""
    def load(state: dict) -> list[tuple[list, dict]]:
        restored = []
        for model, saved in zip(models, state["models"], strict=True):
            model.load_state_dict(saved["model"])
            if len(saved["history"]) != state["epoch"] + 1 or not isinstance(saved["optimizer"], dict):
                raise KeyError("history/epoch/optimizer")
            restored.append((saved["history"], saved["optimizer"]))
        return restored

    return restore_checkpoint(checkpoint, "fingerprints", fingerprints, load, modules=models, device=device,
                              announce=announce, epochs_done=lambda restored: len(restored[0][0]), epochs=epochs)


def _stacked_adamw(stack: StackedModels, states: list[dict | None], cfg: TrainConfig,
                   device: torch.device) -> torch.optim.Optimizer:
    """AdamW over the stacked parameters, with each model's restored state in its slice.
    AdamW is elementwise, so one optimizer over the stack updates each model as its own would.
    fused: one kernel for all parameters instead of a handful per tensor."""
    named = stack.trainable()
    opt = torch.optim.AdamW(_decay_groups(list(named.values()), cfg.weight_decay, stack.stacked_dims), lr=cfg.lr,
                            eps=cfg.adam_eps, fused=device.type in ("cuda", "cpu"))
    if states[0] is not None:                 # one checkpoint: all restored, or none
        steps = {s["step"] if s else None for s in states}
        assert len(steps) == 1, f"stacked runs at different optimizer steps {steps}"
        for name, p in named.items():
            opt.state[p] = {
                "step": torch.tensor(float(states[0]["step"]), dtype=torch.float32, device=device),
                # saved in each model's own layout (_optimizer_state_of): back to the stack's
                **{k: stack.stack_slices([stack.in_model_layout(name, s[k][name]) for s in states]).to(device)
                   for k in ("exp_avg", "exp_avg_sq")}}
    return opt


def _optimizer_state_of(opt: torch.optim.Optimizer, stack: StackedModels, i: int) -> dict | None:
    named = stack.trainable()
    first = opt.state.get(next(iter(named.values())))
    if not first:
        return None
    return {"step": float(first["step"]),
            # in the model's own layout, as its weights are saved: a checkpoint does not depend on
            # whether its models trained stacked (batched Linear weights are held transposed)
            **{k: {name: stack.in_model_layout(name, stack.model_slice(opt.state[p][k], i))
                   .detach().clone(memory_format=torch.contiguous_format) for name, p in named.items()}
               for k in ("exp_avg", "exp_avg_sq")}}


def loss_and_grads(stack: StackedModels, x: torch.Tensor, y: torch.Tensor, cfg: TrainConfig,
                   device: torch.device, forward=None) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The training objective of model i on x[i] (N, B, ...), y[i] (N, B) -> (gradients
    {trainable name: (N, ...)}, mean label-smoothed loss (N,), logits (N, B, classes));
    what gradient_step's steps run (on each chunk, on CPU). forward: the compiled forward_and_loss
    (step_objective's), or None: eager."""
    return stack.loss_and_grads(x, y, functools.partial(mean_cross_entropy, label_smoothing=cfg.label_smoothing),
                                functools.partial(autocast, cfg, device), forward)


# One model's training step at least this many FLOPs fills a GPU: stacking seeds then buys
# little (ViT-T/2, 5.1 TFLOP a step at batch 512, on an H100: a stack of 2 ran 5,535
# model-img/s against 5,032 for one model) and multiplies the memory (a CIFAR cell's stack
# of 5: ~65 GiB). Below it (the digits ViT: ~2 GFLOP a stack's step) the host sets the pace
# and a stack costs about what one model costs.
FILLS_A_GPU_FLOPS = 1e12


def plan_stacking(models: list[torch.nn.Module], data: ImageData, cfg: TrainConfig, device: torch.device,
                  processes: int = 1, train_size: int | None = None,
                  micro_batch: int | None = None) -> tuple[bool, str]:
    """(whether the models train stacked, why): on a GPU, one after another when one model's
    step fills it (FILLS_A_GPU_FLOPS) or the stack's memory estimate (memory.py) passes 90 %
    of the GPU's memory; on a CPU, stacked (the committed runs' way: a stack of 5 digits ViTs
    costs ~1.3x one). processes: how many share each step's batch (torchrun); train_size: the
    training images used (a subset's size; None: all); micro_batch: images per model per pass
    (STRUCTINIT_MICRO_BATCH), which the estimate counts as the step does."""
    if device.type != "cuda":
        return True, "stacked on the CPU"
    flops = training_flops_per_image(models[0], tuple(data.train_images.shape[1:])) * cfg.batch_size
    if flops >= FILLS_A_GPU_FLOPS:
        return False, (f"one model's step is {flops / 1e12:.1f} TFLOP, enough to fill the GPU: stacking would "
                       "multiply the memory and buy little")
    total = torch.cuda.get_device_properties(device).total_memory
    n_train = len(data.train_labels) if train_size is None else train_size
    batch = min(cfg.batch_size, n_train) // processes
    per_image = data.train_images[:1].nbytes
    estimate = estimate_training_memory(models, data.train_images[:1], batch=batch, micro_batch=micro_batch,
                                        dtype=compute_dtype(cfg, device, models[0]),
                                        data_bytes=n_train * per_image + data.test_images.nbytes,
                                        test_images=len(data.test_labels), device_type="cuda")
    if estimate.total_bytes > 0.9 * total:
        return False, (f"the stack of {len(models)} needs about {estimate.total_bytes / 2 ** 30:.1f} GiB (estimated), "
                       f"more than 90 % of the GPU's {total / 2 ** 30:.1f} GiB")
    return True, f"one model's step is {flops / 1e9:.0f} GFLOP: the host sets the pace, so the seeds stack"


def _one_of(checkpoint_path, i: int):
    """Model i's own checkpoint file when models train one after another."""
    if not checkpoint_path:
        return None
    path = Path(checkpoint_path)
    return path.with_name(f"{path.stem}-model{i}{path.suffix}")


# Compiling and capturing happen over the first calls (dynamo traces on the first; a CUDA graph
# tree warms up on the first and records on the second or third): a failure in any of them,
# forward or backward, falls back to eager. Past them a failure is a real error and is raised.
# Calls, not steps: a step split in pieces (micro-batches, the CPU's chunks) calls once a piece,
# and each call of the compiled function is what compiles, warms up or records.
GUARDED_CALLS = 3
# torch.compile functions that failed in this process: later cells (a cell's seeds trained one
# after another, each a call of train_models) do not try again and warn again. Keyed by the
# function itself, so a test that swaps in a broken torch.compile leaves the real one untried.
_FAILED_COMPILERS: "weakref.WeakSet" = weakref.WeakSet()


def step_objective(stack: StackedModels, cfg: TrainConfig, device: torch.device):
    """(objective(replica, x, y) -> loss_and_grads's result, how it runs): the step's forward
    and loss compiled by torch.compile where cfg.compile says (auto: on CUDA; off on the CPU,
    where the committed bytes are eager's), else eager and "". A host-bound stack on CUDA is
    compiled in reduce-overhead mode (its forward and backward replayed as CUDA graphs). A
    machine where compiling or capturing fails, in the forward or the backward, gets a
    one-line warning and the eager step (the failed call re-run eager, nothing lost; the
    compiled graphs dropped). An error that leaves the CUDA context unusable (an illegal memory
    access) fails the eager re-run as well: that one is raised. Inductor keeps what it
    compiled on disk (its FX graph cache), so a second process of the same recipe pays far less."""
    def eager(replica, x, y):
        return loss_and_grads(replica, x, y, cfg, device)
    on = cfg.compile == "on" or (cfg.compile == "auto" and device.type == "cuda")
    if not on or stack.way == "by vmap":
        return eager, ""
    if torch.compile in _FAILED_COMPILERS:
        return eager, "eager (torch.compile failed earlier in this process)"
    host_bound = device.type == "cuda" and stack.way != "plain"
    mode = "reduce-overhead" if host_bound else None
    compiler = torch.compile
    compiled = compiler(stack.forward_and_loss, mode=mode)
    state = {"calls": 0, "failed": False, "trusted": False}   # trusted: the guarded calls all succeeded
    # the CPU's chunks call from threads: the guarded calls run one at a time (the first
    # compiles while the others wait), so one failure warns once and the rest run eager
    guard = threading.Lock()

    def objective(replica, x, y):
        if state["trusted"]:
            if host_bound:
                torch.compiler.cudagraph_mark_step_begin()     # the last step's graph outputs are done with
            return loss_and_grads(replica, x, y, cfg, device, compiled)
        if state["failed"]:
            return eager(replica, x, y)
        with guard:
            if state["failed"]:
                return eager(replica, x, y)
            if state["trusted"]:
                return objective(replica, x, y)
            state["calls"] += 1
            try:
                if host_bound:
                    torch.compiler.cudagraph_mark_step_begin()
                out = loss_and_grads(replica, x, y, cfg, device, compiled)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)             # a failed kernel surfaces here, not steps later
                state["trusted"] = state["calls"] >= GUARDED_CALLS
                return out
            except Exception as e:                         # noqa: BLE001 (any compiler failure: run eager)
                first = str(e).splitlines()[0][:200] if str(e) else ""
                print(f"warning: torch.compile failed ({type(e).__name__}: {first}); training eager "
                      "(compile: off in the recipe skips the attempt)")
                state["failed"] = True
                _FAILED_COMPILERS.add(compiler)
                torch.compiler.reset()                     # the graphs and any CUDA-graph memory pool
                return eager(replica, x, y)
    return objective, f"compiled ({mode or 'default'} mode)"


def _evaluate_stacked(stack: StackedModels, images, labels, *, augmentation: BatchAugmentation,
                      cfg: TrainConfig, device: torch.device, batch_size: int = 1024) -> list[dict]:
    loss_sum, correct = _evaluation_sums(stack, images, labels, augmentation=augmentation, cfg=cfg,
                                         device=device, batch_size=batch_size)
    n = len(labels)
    return [{"test_loss": loss / n, "test_acc": c / n}          # the one host read, after the loop
            for loss, c in zip(loss_sum.tolist(), correct.tolist())]


@torch.no_grad()
def _evaluation_sums(stack: StackedModels, images, labels, *, augmentation: BatchAugmentation, cfg: TrainConfig,
                     device: torch.device, batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's summed test loss (N,) and correct count (N,), on the device."""
    stack.eval()
    loss_sum = torch.zeros(stack.n, device=device)
    correct = torch.zeros(stack.n, device=device, dtype=torch.long)
    for i in range(0, len(labels), batch_size):
        x, y = augmentation.normalize(images[i:i + batch_size]), labels[i:i + batch_size]
        with autocast(cfg, device):
            logits = stack(x, shared_input=True)                   # (N, B, classes)
        y = y.expand(stack.n, -1)
        loss_sum += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                    reduction="none").view(y.shape).sum(1)
        correct += (logits.argmax(-1) == y).sum(1)
    stack.train()
    return loss_sum, correct


def _stop_if_nonfinite(first_bad_step: torch.Tensor, seeds: list[int], epoch: int,
                       n_steps: int) -> None:
    bad = [(seed, step) for seed, step in zip(seeds, first_bad_step.tolist()) if step >= 0]
    if bad:
        seed, step = bad[0]
        raise NonFiniteLossError(
            f"training loss or gradient of seed {seed} became NaN or inf at epoch {epoch + 1}, step {step + 1} of "
            f"{n_steps} (global step {epoch * n_steps + step + 1}); this cell has "
            f"failed{' (also seeds ' + str([s for s, _ in bad[1:]]) + ')' if len(bad) > 1 else ''}"
            " and nothing after its last finished epoch was written. Lower the lr or check the data.")


def _train_epoch(stack: StackedModels, opt: torch.optim.Optimizer, step, train_x: torch.Tensor,
                 train_y: torch.Tensor, augmentation: BatchAugmentation, seeds: list[int], epoch: int, *,
                 cfg: TrainConfig, batch_size: int, device: torch.device, ctx: DistributedContext,
                 progress: bool) -> list[dict]:
    """One pass of every stacked model over the (shuffled) training set, each in its own
    seed's order; no host sync until its end (_epoch_steps runs on the device, the metrics
    are read once after it). step: gradient_step's (submit/collect)."""
    t0 = time.perf_counter()
    gens = [_epoch_generator(seed, epoch, device) for seed in seeds]
    sums = _epoch_steps(stack, opt, step, train_x, train_y, augmentation, gens, seeds, epoch, cfg=cfg,
                        batch_size=batch_size, device=device, ctx=ctx, progress=progress)
    n_steps = steps_per_epoch(len(train_y), batch_size)
    _stop_if_nonfinite(sums["first_bad_step"], seeds, epoch, n_steps)
    loss_sum, correct = sums["loss_sum"], sums["correct"]
    if ctx.enabled:
        loss_sum, correct = ctx.sum(loss_sum), ctx.sum(correct)
    if device.type == "cuda":
        torch.cuda.synchronize()                      # so train_seconds is the real time
    seen = n_steps * batch_size
    lr = opt.param_groups[0]["lr"]
    train_seconds = time.perf_counter() - t0
    return [{"epoch": epoch + 1, "lr": lr, "train_loss": loss / seen, "train_acc": c / seen,
             "seconds": train_seconds, "train_seconds": train_seconds,
             "images_per_s": seen / train_seconds}
            for loss, c in zip(loss_sum.tolist(), correct.tolist())]


def _epoch_steps(stack: StackedModels, opt: torch.optim.Optimizer, step, train_x: torch.Tensor,
                 train_y: torch.Tensor, augmentation: BatchAugmentation, gens: list[torch.Generator],
                 seeds: list[int], epoch: int, *, cfg: TrainConfig, batch_size: int, device: torch.device,
                 ctx: DistributedContext, progress: bool, steps: int | None = None) -> dict[str, torch.Tensor]:
    """The device work of an epoch (or of its first `steps` steps): each model's batches drawn
    from its generator in `gens`, augmented, stepped. Returns per-model sums on the device
    (loss_sum, correct, first_bad_step: -1 or the first step whose loss or gradient was not
    finite), read by the caller after the loop: on a GPU a read inside it would be a host sync
    per step (tests/test_fake_cuda.py runs this on fake CUDA tensors)."""
    n_steps = steps_per_epoch(len(train_y), batch_size)      # drop the ragged tail: static shapes
    total_steps, warmup_steps = schedule_steps(cfg, n_steps)
    # each model's order from its own generator; side by side, so that a step gathers every
    # model's batch with one index (a gather per model cost kernels per model)
    orders = torch.stack([torch.randperm(len(train_y), device=device, generator=g) for g in gens])   # (N, n)
    local_batch = batch_size // ctx.world_size
    local_rows = slice(ctx.rank * local_batch, (ctx.rank + 1) * local_batch)
    run = n_steps if steps is None else min(steps, n_steps)

    def batch(i):
        """Each model's batch i, drawn from its own generator, in order, as it would be alone."""
        if i == run:
            return None
        rows = orders[:, i * batch_size:(i + 1) * batch_size]                  # (N, B)
        x = augmentation.augment(train_x[rows.flatten()], gens)               # (N*B, C, H, W)
        x, y = x.view(len(gens), batch_size, *x.shape[1:]), train_y[rows]     # (N, B, ...), (N, B)
        if ctx.enabled:                               # this process's rows of the global batch
            x, y = x[:, local_rows], y[:, local_rows]
        return x, y

    loss_sum = torch.zeros(stack.n, device=device)
    correct = torch.zeros(stack.n, device=device, dtype=torch.long)
    first_bad_step = torch.full((stack.n,), -1, device=device, dtype=torch.long)  # per model
    # A NaN/inf loss ends the cell. On CPU a check per step costs nothing (and stops a
    # diverged run at once); on a GPU it would be a host sync per step, so there the
    # device-side record is read at the end of the epoch (_train_epoch).
    check_each_step = device.type == "cpu"
    params = list(stack.trainable().values())
    upcoming = batch(0)
    for i in tqdm(range(run), desc=f"epoch {epoch + 1}/{cfg.epochs}", disable=not progress, leave=False,
                  mininterval=1.0):
        for group in opt.param_groups:
            group["lr"] = lr_at(epoch * n_steps + i, total_steps, warmup_steps, cfg)
        pending = step.submit(*upcoming)              # on CPU chunks, this runs on the pool threads...
        upcoming = batch(i + 1)                       # ...while this thread prepares the next batch
        batch_loss_sum, batch_correct = step.collect(pending)          # sets .grad
        if ctx.enabled:                               # what DDP does: the global batch's mean gradient
            ctx.average_gradients(params)             # in buckets: a few collectives, not one per tensor
        grad_norms = stack.clip_grad_norms(cfg.grad_clip or math.inf)  # (N,)
        bad = ~torch.isfinite(batch_loss_sum) | ~torch.isfinite(grad_norms)
        first_bad_step = torch.where((first_bad_step < 0) & bad, i, first_bad_step)
        if check_each_step:
            _stop_if_nonfinite(first_bad_step, seeds, epoch, n_steps)
        opt.step()
        loss_sum += batch_loss_sum
        correct += batch_correct
    return {"loss_sum": loss_sum, "correct": correct, "first_bad_step": first_bad_step}
