"""CPU training step as n single-threaded chunks on n threads, gradients summed.

Why: on a CPU, PyTorch's intra-op threads fork and join inside every op, and a small ViT's
ops (64 tokens, width 48) are short. Splitting each batch into one chunk per core, each
forward/backward single-threaded on its own Python thread (torch ops release the GIL), keeps
every core busy with no fork/join inside each op. It applies to the stacked models as they
are (structinit/training/stacked.py): the chunks split the batch dimension of every model at once.
Whether it pays: `python -m benchmarks.stacked_throughput` (rows "cpu_chunks=1").

Same optimizer step: each chunk's loss is weighted by its share of the batch, so the sum of
the chunk gradients is the full batch's mean-loss gradient, for every model. Chunks are summed in a fixed
order, so a run is deterministic; only the float summation order differs from the unsplit
step (as it already does between thread counts). That holds only for models whose forward
treats samples independently and deterministically, so `auto` falls back to one chunk, and
an explicit count is refused, for BatchNorm (batch statistics, and its running stats would
be updated from several threads) and for active dropout / drop-path (one shared RNG drawn
from several threads in no fixed order).

On CUDA there is nothing to gain (one device, already asynchronous): always one chunk.
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


class ChunkedBackward:
    """Computes a stacked batch's gradients as `chunks` single-threaded pieces in parallel.

    Use as a context manager: inside it, torch runs one intra-op thread per Python thread
    (process-wide: torch.set_num_threads), restored on exit.
    """

    def __init__(self, stack: StackedModels, chunks: int,
                 loss_and_grads: Callable[[StackedModels, torch.Tensor, torch.Tensor], tuple]):
        """loss_and_grads(stack, x, y) -> (grads {name: (N, ...)}, each model's mean loss (N,),
        logits (N, B, classes)): the trainer's own (train.loss_and_grads), run on each chunk's
        thread (so whatever it enters, e.g. autocast, which is per thread, applies there) with
        that thread's replica."""
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
        return ({k: g * weight for k, g in grads.items()}, losses * y.shape[1],
                (logits.argmax(-1) == y).sum(1))

    def submit(self, x: torch.Tensor, y: torch.Tensor) -> list:
        """x (N, B, ...), y (N, B): start the chunks (slices of B) on the pool; the caller may
        work meanwhile, then `collect`."""
        n = y.shape[1]
        return [self._pool.submit(self._one_chunk, replica, xc, yc, yc.shape[1] / n)
                for replica, xc, yc in zip(self.replicas, x.tensor_split(self.chunks, 1),
                                           y.tensor_split(self.chunks, 1))]

    def collect(self, pending: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Sets p.grad to the batch's gradient; returns each model's (sum of per-image losses,
        n correct), (N,) each."""
        results = [f.result() for f in pending]   # fixed order: deterministic sums
        set_grads(self.params, {k: functools.reduce(torch.add, [g[k] for g, _, _ in results])
                                for k in self.params})
        return sum(r[1] for r in results), sum(r[2] for r in results)

    def backward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.collect(self.submit(x, y))
