"""Optimizer steps of a training run, and holding them fixed when the training set shrinks.

    steps_per_epoch(n, batch_size)              as the trainer counts them (drop-last)
    match_steps(train, n_reference, n_subset)   the recipe's train settings for n_subset images,
                                                with as many optimizer steps as on n_reference

Why: the same epochs on 10 % of the images are 10 % of the optimizer steps, and a model that
is simply trained less looks worse whatever its initialization. The data-size study compares
initializers at equal training length instead. Torch-free: params.yaml's schema uses it.
"""
from __future__ import annotations


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
