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
    """How many of `n` images stratified_subset(labels, size, seed) keeps (data.py's rule):
    None or 1.0 = all, a float = round(size * n), an int = that many."""
    if size is None or size == 1.0:
        return n
    return round(size * n) if isinstance(size, float) else size


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Optimizer steps in one epoch over n images, as structinit/train.py runs it: the batch
    is min(batch_size, n) and the ragged last batch is dropped (static shapes)."""
    if n < 1 or batch_size < 1:
        raise ValueError(f"n={n}, batch_size={batch_size}: both must be >= 1")
    return n // min(batch_size, n)


def total_steps(train: dict, n: int) -> int:
    """Optimizer steps of a whole run: epochs x steps per epoch."""
    return train["epochs"] * steps_per_epoch(n, train["batch_size"])


def match_steps(train: dict, n_reference: int, n_subset: int) -> dict:
    """`train` (a recipe's train settings, run on n_reference images) adapted to n_subset
    images so that the optimizer takes about as many steps, on the same schedule:

    - epochs = round(reference steps / steps per epoch on the subset), at least 1: the total
      is the reference's to within half an epoch of the subset (exactly, when it divides);
    - warmup_epochs: the reference's warm-up steps (round(warmup_epochs x its steps per
      epoch), as the trainer counts them) over the subset's steps per epoch, so the warm-up
      lasts as many steps (the trainer rounds it back to exactly that count) and stays the
      same share of the cosine schedule;
    - eval_every: the reference's evaluation interval in steps, in subset epochs (at least
      1), so the test set is evaluated about as often: every epoch of a 10 % subset would
      cost as much evaluation as training. The trainer always evaluates the last epoch.

    The batch size is kept, so the subset must hold at least one batch (ValueError naming
    the sizes otherwise): a smaller batch would be another recipe, not less data.
    """
    batch = train["batch_size"]
    if n_subset < batch:
        raise ValueError(f"n_subset={n_subset}: fewer images than one batch ({batch}); allowed: "
                         f"{batch}..{n_reference} images, or lower recipes.<dataset>.train.batch_size")
    if n_subset > n_reference:
        raise ValueError(f"n_subset={n_subset}: more images than the reference run's {n_reference}")
    ref_per_epoch = steps_per_epoch(n_reference, batch)
    per_epoch = steps_per_epoch(n_subset, batch)
    epochs = max(1, round(train["epochs"] * ref_per_epoch / per_epoch))
    warmup_steps = round(train["warmup_epochs"] * ref_per_epoch)
    eval_steps = train.get("eval_every", 1) * ref_per_epoch
    warmup = min(warmup_steps / per_epoch, epochs)
    return {**train, "epochs": epochs,
            "warmup_epochs": int(warmup) if warmup == int(warmup) else warmup,   # 11, not 11.0
            "eval_every": max(1, round(eval_steps / per_epoch))}
