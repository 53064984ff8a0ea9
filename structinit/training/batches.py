"""The stacked trainer's batches: each model's data order and augmentation, drawn on the device.

    augmentation = BatchAugmentation(data, cfg, device)    # uint8 in, normalized float out
    gens = [epoch_generator(seed, epoch, device) for seed in seeds]
    batches = EpochBatches(train_x, train_y, augmentation, gens, batch_size, ctx)
    x, y = batches.batch(i)                                # (N, B, C, H, W), (N, B)

Per-epoch randomness (shuffle, augmentation) comes from a generator seeded by (seed, epoch),
so a run resumed from its end-of-epoch checkpoint continues exactly as the uninterrupted run
would have, and each model draws what it would draw trained alone.
"""
from __future__ import annotations

import torch

from structinit.config import RandAugmentPolicy
from structinit.data.augment import apply_hflip, apply_rand_augment, draw_hflip, draw_rand_augment
from structinit.data.tensors import ImageData
from structinit.distributed import DistributedContext
from structinit.training.config import TrainConfig
from structinit.training.steps import steps_per_epoch


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


def epoch_generator(seed: int, epoch: int, device: torch.device) -> torch.Generator:
    """The generator of one model's epoch: its data order, then its augmentation draws."""
    return torch.Generator(device=device).manual_seed(seed * 1_000_003 + epoch)


class EpochBatches:
    """Each model's batches of one epoch, drawn from its own generator in `gens`, in order, as
    it would draw them alone. batch(i): step i's (x (N, B, ...), y (N, B)), this process's
    rows of the global batch under torchrun; None past the last step. The ragged tail is
    dropped (static shapes); `steps` stops the epoch early (tests)."""

    def __init__(self, train_x: torch.Tensor, train_y: torch.Tensor, augmentation: BatchAugmentation,
                 gens: list[torch.Generator], batch_size: int, ctx: DistributedContext, steps: int | None = None):
        self.train_x, self.train_y, self.augmentation, self.gens = train_x, train_y, augmentation, gens
        self.batch_size, self.ctx = batch_size, ctx
        self.steps_per_epoch = steps_per_epoch(len(train_y), batch_size)
        self.steps = self.steps_per_epoch if steps is None else min(steps, self.steps_per_epoch)
        # side by side, so that a step gathers every model's batch with one index (a gather per
        # model costs kernels per model)
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
