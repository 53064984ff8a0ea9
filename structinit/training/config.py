"""TrainConfig: a training recipe (params.yaml's recipes.<dataset>.train), and the
RandAugment policy string it may name. Torch-free: the params schema checks a file against it
before any stage imports torch."""
from __future__ import annotations

import re
from dataclasses import dataclass

AMP_MODES = ("auto", "bf16", "off")


@dataclass(frozen=True)
class RandAugmentPolicy:
    magnitude: float = 9.0
    magnitude_std: float = 0.5
    num_layers: int = 2
    prob: float = 0.5
    increasing: bool = True

    @classmethod
    def parse(cls, spec: str) -> "RandAugmentPolicy":
        """timm's config string, e.g. "rand-m9-mstd0.5-inc1" (keys m, mstd, n, p, inc)."""
        parts = spec.split("-")
        if parts[0] != "rand":
            raise ValueError(f"randaugment={spec!r}: must start with 'rand', e.g. 'rand-m9-mstd0.5-inc1'")
        kw = {}
        names = {"m": "magnitude", "mstd": "magnitude_std", "n": "num_layers", "p": "prob", "inc": "increasing"}
        for part in parts[1:]:
            match = re.fullmatch(r"([a-z]+)([\d.]+)", part)
            if not match or match[1] not in names:
                raise ValueError(f"randaugment={spec!r}: unknown part {part!r}; known keys: {list(names)}")
            key, val = names[match[1]], float(match[2])
            kw[key] = int(val) if key == "num_layers" else bool(val) if key == "increasing" else val
        if not kw.get("increasing", False):
            raise ValueError(f"randaugment={spec!r}: only the increasing op set (inc1) is implemented")
        return cls(**kw)


@dataclass
class TrainConfig:
    """Defaults are the paper's small-dataset recipe (method page, section 5)."""
    epochs: int = 200
    batch_size: int = 512
    lr: float = 1e-3
    min_lr: float = 1e-6
    warmup_epochs: float = 10
    warmup_prefix: bool = False  # False: timm's cosine over all steps, warm-up replacing its start
                                 # (the paper's runs); True: the cosine starts after warm-up
    weight_decay: float = 0.01
    adam_eps: float = 1e-3
    grad_clip: float | None = 3.0   # None: no clipping (the official ImageNet command)
    label_smoothing: float = 0.1
    randaugment: str | None = "rand-m9-mstd0.5-inc1"
    hflip: bool = True
    amp: str = "auto"            # auto: bf16 autocast on CUDA and on CPUs with native bf16, else fp32
    cpu_chunks: str | int = "auto"  # CPU: run each batch as n single-threaded chunks (cpu_chunks.py)
    eval_every: int = 1          # test-set evaluation every n epochs (and always after the last)
    # The streamed trainer's (ImageNet) extras, timm's train.py options of the same meaning;
    # the on-device trainer refuses them rather than ignore them.
    mixup: float = 0.0           # mixup alpha (0 = off)
    cutmix: float = 0.0          # cutmix alpha (0 = off)
    random_erasing: float = 0.0  # per-image probability, pixel mode (timm --reprob, --remode pixel)
    lr_batch_size: int | None = None  # lr is for this global batch; scaled by sqrt(batch / this)
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
        bounds = {"lr": self.lr > 0, "min_lr": 0 <= self.min_lr <= self.lr,
                  "warmup_epochs": self.warmup_epochs >= 0,
                  "weight_decay": self.weight_decay >= 0, "adam_eps": self.adam_eps > 0,
                  "grad_clip": self.grad_clip is None or self.grad_clip > 0,
                  "label_smoothing": 0 <= self.label_smoothing < 1,
                  "mixup": self.mixup >= 0, "cutmix": self.cutmix >= 0,
                  "random_erasing": 0 <= self.random_erasing <= 1,
                  "lr_batch_size": self.lr_batch_size is None or self.lr_batch_size >= 1}
        allowed = {"lr": "> 0", "min_lr": "between 0 and lr", "warmup_epochs": ">= 0",
                   "weight_decay": ">= 0", "adam_eps": "> 0", "grad_clip": "> 0 or null (no clipping)",
                   "label_smoothing": "in [0, 1)", "mixup": ">= 0 (0 = off)", "cutmix": ">= 0 (0 = off)",
                   "random_erasing": "a probability in [0, 1]", "lr_batch_size": ">= 1 or null"}
        for name, ok in bounds.items():
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be {allowed[name]}")
        if self.randaugment:
            RandAugmentPolicy.parse(self.randaugment)  # fail now, not mid-run

    @property
    def streamed_only(self) -> dict:
        """The options set here that only the streamed trainer implements."""
        return {k: v for k, v in (("mixup", self.mixup), ("cutmix", self.cutmix),
                                  ("random_erasing", self.random_erasing),
                                  ("lr_batch_size", self.lr_batch_size)) if v}

    def scaled_lr(self, global_batch: int) -> float:
        """lr for this global batch: timm's rule for Adam-family optimizers, lr * sqrt(ratio)
        (train.py's --lr-base/--lr-base-size, the official ImageNet command's lr 4e-3 at 4096)."""
        return self.lr if self.lr_batch_size is None else self.lr * (global_batch / self.lr_batch_size) ** 0.5
