"""CPU training step as n single-threaded chunks on n threads, gradients summed.

Why: a small ViT's ops (a 65-token, 48-wide batch of 64) are too small for PyTorch's
intra-op threads to pay: on 2 cores, 2 intra-op threads run a step only ~1.3x faster than
one. Splitting the batch into one chunk per core, each forward/backward single-threaded on
its own Python thread (torch ops release the GIL), keeps every core busy with no fork/join
inside each op: ~1.2x the intra-op step on the same 2 cores (benchmarks/train_throughput.py).

Same optimizer step: each chunk's loss is weighted by its share of the batch, so the sum of
the chunk gradients is the full batch's mean-loss gradient. Chunks are summed in a fixed
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
                    batch_size: int, compiled: bool) -> tuple[int, str]:
    """How many chunks a step runs as, and why. setting: "auto" or a positive int (1 = off),
    as validated by TrainConfig."""
    explicit = setting != "auto"
    wanted = setting if explicit else min(torch.get_num_threads(), batch_size // MIN_CHUNK)
    if wanted <= 1:
        return 1, "one chunk"
    if device.type != "cpu":                      # the same params.yaml runs on CPU and GPU
        return 1, f"one chunk (cpu_chunks applies to CPU only, this is {device.type})"
    blockers = [
        (compiled, "compile=True (a compiled model is not run from several threads)"),
        (wanted > batch_size, f"more chunks than the batch has images ({batch_size})"),
    ]
    why = next((msg for bad, msg in blockers if bad), None) or _why_not_splittable(model)
    if why is None:
        return wanted, f"{wanted} chunks of ~{batch_size // wanted} images, one thread each"
    if explicit:
        raise ValueError(f"cpu_chunks={setting} is not possible here: {why}; use cpu_chunks=1")
    return 1, f"one chunk ({why})"


class ChunkedBackward:
    """Computes a batch's gradients as `chunks` single-threaded pieces in parallel.

    Use as a context manager: inside it, torch runs one intra-op thread per Python thread
    (process-wide: torch.set_num_threads), restored on exit.
    """

    def __init__(self, model: torch.nn.Module, chunks: int,
                 forward_loss: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]):
        """forward_loss(x, y) -> (mean loss, logits): the trainer's own, run on each chunk's thread
        (so whatever it enters, e.g. autocast, which is per thread, applies there)."""
        self.chunks, self.forward_loss = chunks, forward_loss
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._pool: ThreadPoolExecutor | None = None
        self._threads = None

    def __enter__(self):
        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        self._pool = ThreadPoolExecutor(self.chunks, thread_name_prefix="structinit-chunk")
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

    def _one_chunk(self, x, y, weight):
        loss, logits = self.forward_loss(x, y)
        grads = torch.autograd.grad(loss * weight, self.params, allow_unused=True)
        return grads, loss.detach() * len(y), (logits.argmax(-1) == y).sum()

    def submit(self, x: torch.Tensor, y: torch.Tensor) -> list:
        """Start the chunks on the pool; the caller may work meanwhile, then `collect`."""
        n = len(y)
        return [self._pool.submit(self._one_chunk, xc, yc, len(yc) / n)
                for xc, yc in zip(x.tensor_split(self.chunks), y.tensor_split(self.chunks))]

    def collect(self, pending: list) -> tuple[torch.Tensor, torch.Tensor]:
        """Sets p.grad to the batch's gradient; returns (sum of per-image losses, n correct)."""
        results = [f.result() for f in pending]   # fixed order: deterministic sums
        for i, p in enumerate(self.params):
            parts = [g[i] for g, _, _ in results if g[i] is not None]
            p.grad = functools.reduce(torch.add, parts) if parts else None
        return sum(r[1] for r in results), sum(r[2] for r in results)

    def backward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.collect(self.submit(x, y))
