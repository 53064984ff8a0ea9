"""The training recipe, torch-free: the params schema checks a file against it before any stage
imports torch.

    TrainConfig                                 params.yaml's recipes.<dataset>.train; its RandAugment
                                                policy string is parsed by config.RandAugmentPolicy
    steps_per_epoch(n, batch_size)              optimizer steps per epoch, as both trainers count (drop-last)
    match_steps(train, n_reference, n_subset)   the recipe for n_subset images with as many optimizer
                                                steps as on n_reference

Why match_steps: the same epochs on 10 % of the images are 10 % of the optimizer steps, and a
model that is simply trained less looks worse whatever its initialization. The data-size study
compares initializers at equal training length instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from structinit.config import RandAugmentPolicy


AMP_MODES = ("auto", "bf16", "off")


COMPILE_MODES = ("auto", "on", "off")


CUDA_GRAPH_MODES = ("auto", "off")


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
    cpu_chunks: str | int = "auto"  # CPU: run each batch as n single-threaded chunks (step.py)
    compile: str = "auto"        # torch.compile the step's forward and loss: auto = on CUDA, off on CPU
                                 # (where committed bytes are eager's); "on" / "off" anywhere
    # off until a GPU has shown the captured step equal to the uncaptured one (the GPU window's
    # check, benchmarks/gpu_session.py); auto: on CUDA, a stack's whole step as one CUDA graph
    cuda_graph: str = "off"
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
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"compile={self.compile!r}; choose one of {COMPILE_MODES}")
        if self.cuda_graph not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graph={self.cuda_graph!r}; choose one of {CUDA_GRAPH_MODES}")
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


def subset_size(n: int, size: float | int | None) -> int:
    """How many of `n` images stratified_subset(labels, size, seed) keeps (data/tensors.py's rule):
    None or 1.0 = all, a float = round(size * n), an int = that many."""
    if size is None or size == 1.0:
        return n
    return round(size * n) if isinstance(size, float) else size


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Optimizer steps in one epoch over n images, as both trainers count them: the batch is
    min(batch_size, n) and the ragged last batch is dropped (static shapes). The on-device
    trainer (trainer.py) shrinks a batch larger than n to n; the streamed one (streamed.py)
    refuses such a batch, so there it is n // batch_size."""
    if n < 1 or batch_size < 1:
        raise ValueError(f"n={n}, batch_size={batch_size}: both must be >= 1")
    return n // min(batch_size, n)


def total_steps(train: dict, n: int) -> int:
    """Optimizer steps of a whole run: epochs x steps per epoch."""
    return train["epochs"] * steps_per_epoch(n, train["batch_size"])


def match_steps(train: dict, n_reference: int, n_subset: int) -> dict:
    """`train` (settings for n_reference images) for n_subset images at about the same number
    of optimizer steps: epochs, warm-up steps and the evaluation interval in steps are held.
    The batch size is kept (a smaller batch would be another recipe, not less data), so
    n_subset must hold one batch: ValueError otherwise."""
    batch = train["batch_size"]
    if n_subset < batch:
        raise ValueError(f"n_subset={n_subset}: fewer images than one batch ({batch}); allowed: "
                         f"{batch}..{n_reference} images, or lower recipes.<dataset>.train.batch_size")
    if n_subset > n_reference:
        raise ValueError(f"n_subset={n_subset}: more images than the reference run's {n_reference}")
    ref_per_epoch = steps_per_epoch(n_reference, batch)
    per_epoch = steps_per_epoch(n_subset, batch)
    epochs = max(1, round(train["epochs"] * ref_per_epoch / per_epoch))
    warmup_steps = round(train["warmup_epochs"] * ref_per_epoch)   # as the trainer counts them
    eval_steps = train.get("eval_every", 1) * ref_per_epoch  # else a 10 % subset evaluates 10x as often
    warmup = min(warmup_steps / per_epoch, epochs)
    return {**train, "epochs": epochs,
            "warmup_epochs": int(warmup) if warmup == int(warmup) else warmup,   # 11, not 11.0
            "eval_every": max(1, round(eval_steps / per_epoch))}
