"""The training recipe, torch-free so that the params schema can check a file before any stage imports torch.

    TrainConfig                                 params.yaml's recipes.<dataset>.train (randaugment: RandAugmentPolicy)
    steps_per_epoch(n, batch_size)              optimizer steps per epoch, as both trainers count (drop-last)
    match_steps(train, n_reference, n_subset)   the recipe for n_subset images at n_reference's optimizer steps

Why match_steps: the same epochs on 10 % of the images are 10 % of the steps, and a model simply trained less looks
worse whatever its init, so the data-size study compares initializers at equal training length.
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
    batch_size: int = 512       # global, split among processes
    lr: float = 1e-3
    min_lr: float = 1e-6
    warmup_epochs: float = 10
    warmup_prefix: bool = False  # False: warm-up replaces the cosine's start (the paper's); True: cosine follows it
    weight_decay: float = 0.01
    adam_eps: float = 1e-3
    grad_clip: float | None = 3.0   # None: no clipping (the official ImageNet command)
    label_smoothing: float = 0.1
    randaugment: str | None = "rand-m9-mstd0.5-inc1"
    hflip: bool = True
    amp: str = "auto"            # auto: bf16 autocast on CUDA and on CPUs with native bf16, else fp32
    cpu_chunks: str | int = "auto"  # CPU: run each batch as n single-threaded chunks (stacked.py)
    compile: str = "auto"        # torch.compile forward+loss; auto: on CUDA, off on CPU (committed bytes are eager's)
    # auto: a stack's whole step as one CUDA graph; off until a GPU shows it equal to eager (benchmarks/gpu_session.py)
    cuda_graph: str = "off"
    eval_every: int = 1          # test-set evaluation every n epochs (and always after the last)
    # streamed (ImageNet) trainer only, as in timm's train.py; the on-device trainer refuses rather than ignores them
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
        """timm's rule for Adam-family optimizers (train.py --lr-base/--lr-base-size; ImageNet's 4e-3 at 4096)."""
        return self.lr if self.lr_batch_size is None else self.lr * (global_batch / self.lr_batch_size) ** 0.5


def subset_size(n: int, size: float | int | None) -> int:
    """How many of `n` images stratified_subset keeps (data/tensors.py): None or 1.0: n; a float: round(size * n)."""
    if size is None or size == 1.0:
        return n
    return round(size * n) if isinstance(size, float) else size


def steps_per_epoch(n: int, batch_size: int) -> int:
    """As both trainers count: batch min(batch_size, n), the ragged last batch dropped (static shapes). The on-device
    trainer shrinks a batch above n to n; the streamed one refuses it, so there it is n // batch_size."""
    if n < 1 or batch_size < 1:
        raise ValueError(f"n={n}, batch_size={batch_size}: both must be >= 1")
    return n // min(batch_size, n)


def total_steps(train: dict, n: int) -> int:
    """Optimizer steps of a whole run: epochs x steps per epoch."""
    return train["epochs"] * steps_per_epoch(n, train["batch_size"])


def match_steps(train: dict, n_reference: int, n_subset: int) -> dict:
    """`train` (for n_reference images) for n_subset images, holding epochs, warm-up and evaluation interval in steps.
    The batch size is kept: a smaller one would be another recipe, not less data."""
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
