"""The trainer: the paper's recipe, device-agnostic, resumable, no host sync in the step loop.

    train_model(model, data, TrainConfig(...)) -> list of per-epoch metric dicts

The whole dataset lives on the training device as one uint8 tensor; each batch is gathered,
augmented (augment.py) and normalized there. Per-epoch randomness (shuffle, augmentation)
comes from a generator seeded by (seed, epoch), so a run resumed from its end-of-epoch
checkpoint continues exactly as the uninterrupted run would have.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .augment import RandAugmentPolicy, rand_augment, random_hflip
from .cpu_chunks import ChunkedBackward, plan_cpu_chunks
from .data import ImageData
from .io import save_torch

AMP_MODES = ("auto", "bf16", "off")


@dataclass
class TrainConfig:
    """Defaults are the paper's small-dataset recipe (method page, section 5)."""
    epochs: int = 200
    batch_size: int = 512
    lr: float = 1e-3
    min_lr: float = 1e-6
    warmup_epochs: float = 10
    weight_decay: float = 0.01
    adam_eps: float = 1e-3
    grad_clip: float = 3.0
    label_smoothing: float = 0.1
    randaugment: str | None = "rand-m9-mstd0.5-inc1"
    hflip: bool = True
    amp: str = "auto"            # auto: bf16 autocast on CUDA, fp32 on CPU
    channels_last: bool = False
    compile: bool = False
    cpu_chunks: str | int = "auto"  # CPU: run each batch as n single-threaded chunks (cpu_chunks.py)
    eval_every: int = 1          # test-set evaluation every n epochs (and always after the last)
    seed: int = 0

    def __post_init__(self):
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp={self.amp!r}; choose one of {AMP_MODES}")
        for name in ("epochs", "batch_size", "eval_every"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if self.cpu_chunks != "auto" and (isinstance(self.cpu_chunks, bool)
                                          or not isinstance(self.cpu_chunks, int) or self.cpu_chunks < 1):
            raise ValueError(f"cpu_chunks={self.cpu_chunks!r}: use 'auto' or a positive integer (1 = off)")
        if self.randaugment:
            RandAugmentPolicy.parse(self.randaugment)  # fail now, not mid-run


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def lr_at(step: int, total_steps: int, warmup_steps: int, cfg: TrainConfig) -> float:
    """Linear warm-up from 0, then cosine to min_lr; a function of the step, so resumable."""
    if step < warmup_steps:
        return cfg.lr * (step + 1) / warmup_steps
    t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on 1-D parameters (biases, norms); frozen ones are left out."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


class BatchPipeline:
    """uint8 images on the device -> augmented, normalized float batches."""

    def __init__(self, data: ImageData, cfg: TrainConfig, device: torch.device):
        spec = data.spec
        self.mean = torch.tensor(spec.mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(spec.std, device=device).view(1, -1, 1, 1) * 255
        self.policy = RandAugmentPolicy.parse(cfg.randaugment) if cfg.randaugment else None
        self.hflip = cfg.hflip
        self.memory_format = torch.channels_last if cfg.channels_last else torch.contiguous_format

    def normalize(self, x_uint8: torch.Tensor) -> torch.Tensor:
        x = (x_uint8.float() - self.mean) / self.std
        return x.contiguous(memory_format=self.memory_format)

    def augment(self, x_uint8: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        x = x_uint8.float()
        if self.policy is not None:
            x = rand_augment(x, self.policy, gen, fill=self.mean)
        if self.hflip:
            x = random_hflip(x, gen)
        return ((x - self.mean) / self.std).contiguous(memory_format=self.memory_format)


def _epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + epoch)


def _autocast(cfg: TrainConfig, device: torch.device):
    use = cfg.amp == "bf16" or (cfg.amp == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=use)


@torch.no_grad()
def evaluate(model, images: torch.Tensor, labels: torch.Tensor, pipe: BatchPipeline,
             cfg: TrainConfig, device: torch.device, batch_size: int = 1024) -> dict:
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for i in range(0, len(labels), batch_size):
        x, y = pipe.normalize(images[i:i + batch_size]), labels[i:i + batch_size]
        with _autocast(cfg, device):
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
    """Train in place; returns one metrics dict per epoch.

    checkpoint_path: written atomically after every epoch and resumed from when it exists
    and its `fingerprint` (config + whatever the caller adds, e.g. the init) matches; a
    mismatching checkpoint is ignored and overwritten. on_epoch_end(metrics) is called for
    every epoch, including (first) the epochs restored from a checkpoint.
    """
    device = torch.device(device) if device is not None else default_device()
    fingerprint = json.loads(json.dumps({"config": dataclasses.asdict(cfg), **(fingerprint or {})},
                                        default=str))
    idx = train_indices if train_indices is not None else torch.arange(len(data.train_labels))
    train_x = data.train_images[idx].to(device)
    train_y = data.train_labels[idx].to(device)
    test_x, test_y = data.test_images.to(device), data.test_labels.to(device)
    batch_size = min(cfg.batch_size, len(train_y))

    model.to(device)
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)
    # fused AdamW: one kernel for all parameters instead of a handful per tensor.
    opt = torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, eps=cfg.adam_eps,
                            fused=device.type in ("cuda", "cpu"))
    history: list[dict] = []
    start_epoch = 0
    ckpt = Path(checkpoint_path) if checkpoint_path else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, map_location=device, weights_only=False)
        if state.get("fingerprint") == fingerprint:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            history, start_epoch = state["history"], state["epoch"] + 1
            print(f"resuming from {ckpt} after epoch {start_epoch}/{cfg.epochs}")
        else:
            print(f"ignoring {ckpt}: it was written for a different configuration")
    for metrics in history:
        if on_epoch_end:
            on_epoch_end(metrics)

    pipe = BatchPipeline(data, cfg, device)
    step_fn = torch.compile(model) if cfg.compile else model
    chunks, how = plan_cpu_chunks(cfg.cpu_chunks, model, device, batch_size, cfg.compile)
    if progress:
        print(f"training on {device}: {how} per step")
    chunked = (ChunkedBackward(model, chunks, lambda x, y: _forward_loss(model, x, y, cfg, device))
               if chunks > 1 else None)
    model.train()
    with chunked or contextlib.nullcontext():
        for epoch in range(start_epoch, cfg.epochs):
            metrics = _train_epoch(epoch, model, step_fn, chunked, opt, pipe, train_x, train_y,
                                   batch_size, cfg, device, progress)
            if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
                t = time.perf_counter()
                with chunked.all_threads() if chunked else contextlib.nullcontext():
                    metrics.update(evaluate(model, test_x, test_y, pipe, cfg, device))
                metrics["seconds"] += time.perf_counter() - t
            history.append(metrics)
            if progress:
                test = f"test acc {metrics['test_acc']:.4f}  " if "test_acc" in metrics else ""
                tqdm.write(f"epoch {epoch + 1}/{cfg.epochs}  loss {metrics['train_loss']:.4f}  "
                           f"{test}({metrics['images_per_s']:.0f} img/s)")
            if ckpt is not None:
                save_torch(ckpt, {"fingerprint": fingerprint, "epoch": epoch, "history": history,
                                  "model": model.state_dict(), "optimizer": opt.state_dict()})
            if on_epoch_end:
                on_epoch_end(metrics)
    return history


def _forward_loss(model, x, y, cfg: TrainConfig, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean label-smoothed loss, logits) of one batch: the training objective."""
    with _autocast(cfg, device):
        logits = model(x)
    return F.cross_entropy(logits.float(), y, label_smoothing=cfg.label_smoothing), logits


def _train_epoch(epoch, model, step_fn, chunked, opt, pipe, train_x, train_y, batch_size,
                 cfg, device, progress) -> dict:
    """One pass over the (shuffled) training set; no host sync until its end."""
    t0 = time.perf_counter()
    steps_per_epoch = len(train_y) // batch_size      # drop the ragged tail: static shapes
    total_steps = steps_per_epoch * cfg.epochs
    warmup_steps = round(cfg.warmup_epochs * steps_per_epoch)
    gen = _epoch_generator(cfg.seed, epoch, device)
    order = torch.randperm(len(train_y), device=device, generator=gen)
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    bar = tqdm(range(steps_per_epoch), desc=f"epoch {epoch + 1}/{cfg.epochs}",
               disable=not progress, leave=False, mininterval=1.0)

    def batch(i):                                     # batches drawn in order: gen's stream is fixed
        if i == steps_per_epoch:
            return None
        rows = order[i * batch_size:(i + 1) * batch_size]
        return pipe.augment(train_x[rows], gen), train_y[rows]

    upcoming = batch(0)
    for i in bar:
        step = epoch * steps_per_epoch + i
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total_steps, warmup_steps, cfg)
        x, y = upcoming
        if chunked is not None:
            pending = chunked.submit(x, y)            # the chunks run on the pool threads...
            upcoming = batch(i + 1)                   # ...while this one augments the next batch
            batch_loss_sum, batch_correct = chunked.collect(pending)   # sets .grad
        else:
            loss, logits = _forward_loss(step_fn, x, y, cfg, device)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            batch_loss_sum, batch_correct = loss.detach() * len(y), (logits.argmax(-1) == y).sum()
            upcoming = batch(i + 1)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        loss_sum += batch_loss_sum
        correct += batch_correct
    seen = steps_per_epoch * batch_size
    if device.type == "cuda":
        torch.cuda.synchronize()                      # so train_seconds is the real time
    metrics = {"epoch": epoch + 1, "lr": opt.param_groups[0]["lr"],
               "train_loss": loss_sum.item() / seen, "train_acc": correct.item() / seen}
    train_seconds = time.perf_counter() - t0
    metrics.update(seconds=train_seconds, train_seconds=train_seconds,
                   images_per_s=seen / train_seconds)
    return metrics
