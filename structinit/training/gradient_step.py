"""One training step's gradients, two ways, one interface: `submit(x, y)`, then `collect(pending)`.

    step = plan_gradient_step(cfg.cpu_chunks, stack, device, batch, loss_and_grads)
    with step:                          # the chunked step sets torch to one thread per chunk
        pending = step.submit(x, y)     # x (N, B, ...), y (N, B): every stacked model's batch
        ...                             # the caller prepares the next batch meanwhile
        loss_sum, correct = step.collect(pending)   # sets p.grad; (N,) each
        with step.all_threads(): ...    # evaluation, with the process's intra-op threads

WholeBatchStep: the batch's gradients in one pass (GPUs; CPU models that cannot be split), or
    in micro-batches one after another (STRUCTINIT_MICRO_BATCH: a batch too big for the GPU).
ChunkedStep (CPU): the batch as n single-threaded chunks on n threads, gradients summed.

Why chunks: on a CPU, PyTorch's intra-op threads fork and join inside every op, and a small
ViT's ops (64 tokens, width 48) are short. Splitting each batch into one chunk per core, each
forward/backward single-threaded on its own Python thread (torch ops release the GIL), keeps
every core busy with no fork/join inside each op. The chunks split the batch dimension of every
stacked model at once. Whether it pays: `python -m benchmarks.stacked_throughput` (rows
"cpu_chunks=1").

Same optimizer step: each chunk's loss is weighted by its share of the batch, so the sum of
the chunk gradients is the full batch's mean-loss gradient, for every model. Chunks are summed in a fixed
order, so a run is deterministic; only the float summation order differs from the unsplit
step (as it already does between thread counts). That holds only for models whose forward
treats samples independently and deterministically, so `auto` falls back to one chunk, and
an explicit count is refused, for BatchNorm (batch statistics, and its running stats would
be updated from several threads) and for active dropout / drop-path (one shared RNG drawn
from several threads in no fixed order).

On CUDA there is nothing to gain (one device, already asynchronous): always the whole batch.
"""
from __future__ import annotations

import contextlib
import functools
from concurrent.futures import ThreadPoolExecutor

from typing import Callable

import torch

from structinit.training.stacked import StackedModels, set_grads

MIN_CHUNK = 16          # below this, per-chunk Python overhead eats the gain


def _why_not_splittable(model: torch.nn.Module) -> str | None:
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            return f"{name or 'model'} is {type(m).__name__} (batch statistics)"
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            p = m.p
        else:
            p = getattr(m, "drop_prob", 0.0)      # timm's DropPath
        if p:
            return f"{name} is {type(m).__name__}(p={p}) (random masks from a shared RNG)"
    return None


LossAndGrads = Callable[[StackedModels, torch.Tensor, torch.Tensor], tuple]


def plan_gradient_step(setting: str | int, stack: StackedModels, device: torch.device, batch_size: int,
                       loss_and_grads: LossAndGrads, *, micro_batch: int | None = None
                       ) -> tuple["WholeBatchStep | ChunkedStep", str]:
    """The step a stack trains with, and why (for the log): ChunkedStep where plan_cpu_chunks
    splits the batch, WholeBatchStep otherwise. loss_and_grads(stack, x, y) -> (grads {name:
    (N, ...)}, each model's mean loss (N,), logits (N, B, classes)): the trainer's own.
    micro_batch (images per model per pass, smaller than the batch): the whole-batch step in
    pieces, one after another, on any device; it replaces the CPU's chunks (a memory limit
    comes first) and is refused where splitting a batch changes the step (BatchNorm, dropout)."""
    if micro_batch is not None and micro_batch < batch_size:
        if micro_batch < 1:
            raise ValueError(f"micro_batch={micro_batch}: give a positive number of images, or None")
        why = _why_not_splittable(stack.base)
        if why:
            raise ValueError(f"micro-batches of {micro_batch} images are not the same step for this model: "
                             f"{why}; unset STRUCTINIT_MICRO_BATCH (or give it >= the batch, {batch_size})")
        pieces = -(-batch_size // micro_batch)
        return (WholeBatchStep(stack, loss_and_grads, micro_batch),
                f"{pieces} micro-batches of <= {micro_batch} images per model, one after another")
    chunks, how = plan_cpu_chunks(setting, stack.base, device, batch_size)
    step = ChunkedStep(stack, chunks, loss_and_grads) if chunks > 1 else WholeBatchStep(stack, loss_and_grads)
    return step, how


def plan_cpu_chunks(setting: str | int, model: torch.nn.Module, device: torch.device,
                    batch_size: int) -> tuple[int, str]:
    """How many chunks a step runs as, and why. setting: "auto" (one per intra-op thread) or
    a positive int (1 = off), as validated by TrainConfig. More chunks than threads did not
    pay for five stacked digits ViTs (benchmarks/stacked_throughput.py --chunk-rows 2 4 8)."""
    explicit = setting != "auto"
    wanted = setting if explicit else min(torch.get_num_threads(), batch_size // MIN_CHUNK)
    if wanted <= 1:
        return 1, "one chunk"
    if device.type != "cpu":                      # the same params.yaml runs on CPU and GPU
        return 1, f"one chunk (cpu_chunks applies to CPU only, this is {device.type})"
    why = (f"more chunks than the batch has images ({batch_size})" if wanted > batch_size
           else _why_not_splittable(model))
    if why is None:
        return wanted, f"{wanted} chunks of ~{batch_size // wanted} images per model, one thread each"
    if explicit:
        raise ValueError(f"cpu_chunks={setting} is not possible here: {why}; use cpu_chunks=1")
    return 1, f"one chunk ({why})"


def _sums(losses: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's (sum of per-image losses, n correct) from its mean loss (N,), logits
    (N, B, classes) and labels (N, B)."""
    return losses * y.shape[1], (logits.argmax(-1) == y).sum(1)


class WholeBatchStep:
    """The batch's gradients with the process's intra-op threads: in one pass, or in pieces of
    `micro_batch` images per model, one after another, each piece's gradients weighted by its
    share of the batch and summed in order (the one-pass step's, to float noise)."""

    def __init__(self, stack: StackedModels, loss_and_grads: LossAndGrads, micro_batch: int | None = None):
        self.stack, self.loss_and_grads, self.micro_batch = stack, loss_and_grads, micro_batch

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def all_threads(self):
        return contextlib.nullcontext()

    def submit(self, x: torch.Tensor, y: torch.Tensor) -> tuple:
        n = y.shape[1]
        if not self.micro_batch or self.micro_batch >= n:
            grads, losses, logits = self.loss_and_grads(self.stack, x, y)
            return grads, _sums(losses, logits, y)
        total, loss_sum, correct = None, 0, 0
        for xc, yc in zip(x.split(self.micro_batch, 1), y.split(self.micro_batch, 1)):
            grads, losses, logits = self.loss_and_grads(self.stack, xc, yc)   # (N, b, ...) pieces
            weight = yc.shape[1] / n
            total = ({k: g * weight for k, g in grads.items()} if total is None
                     else {k: total[k] + g * weight for k, g in grads.items()})
            s_loss, s_correct = _sums(losses, logits, yc)
            loss_sum, correct = loss_sum + s_loss, correct + s_correct
        return total, (loss_sum, correct)

    def collect(self, pending: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        grads, sums = pending
        set_grads(self.stack.trainable(), grads)
        return sums


class ChunkedStep:
    """A stacked batch's gradients as `chunks` single-threaded pieces in parallel.

    Inside `with`, torch runs one intra-op thread per Python thread (process-wide:
    torch.set_num_threads), restored on exit.
    """

    def __init__(self, stack: StackedModels, chunks: int, loss_and_grads: LossAndGrads):
        """loss_and_grads runs on each chunk's thread (so whatever it enters, e.g. autocast,
        which is per thread, applies there) with that thread's replica."""
        self.chunks, self.loss_and_grads = chunks, loss_and_grads
        # functional_call swaps tensors into its module while it runs: one module per thread.
        self.replicas = [stack] + [stack.replica() for _ in range(chunks - 1)]
        self.params = stack.trainable()
        self._pool: ThreadPoolExecutor | None = None
        self._threads = None

    def __enter__(self):
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        # One worker per intra-op thread there was; more chunks than that queue up on them.
        self._pool = ThreadPoolExecutor(min(self.chunks, self._threads), thread_name_prefix="structinit-chunk")
        return self

    def __exit__(self, *exc):
        self._pool.shutdown()
        torch.set_num_threads(self._threads)

    @contextlib.contextmanager
    def all_threads(self):
        """Give the main thread its intra-op threads back, e.g. for evaluation."""
        torch.set_num_threads(self._threads)
        try:
            yield
        finally:
            torch.set_num_threads(1)

    def _one_chunk(self, replica, x, y, weight):
        grads, losses, logits = self.loss_and_grads(replica, x, y)
        return {k: g * weight for k, g in grads.items()}, _sums(losses, logits, y)

    def submit(self, x: torch.Tensor, y: torch.Tensor) -> list:
        """Start the chunks (slices of B) on the pool; the caller may work meanwhile."""
        n = y.shape[1]
        return [self._pool.submit(self._one_chunk, replica, xc, yc, yc.shape[1] / n)
                for replica, xc, yc in zip(self.replicas, x.tensor_split(self.chunks, 1),
                                           y.tensor_split(self.chunks, 1))]

    def collect(self, pending: list) -> tuple[torch.Tensor, torch.Tensor]:
        results = [f.result() for f in pending]   # fixed order: deterministic sums
        set_grads(self.params, {k: functools.reduce(torch.add, [g[k] for g, _ in results])
                                for k in self.params})
        return sum(s[0] for _, s in results), sum(s[1] for _, s in results)
