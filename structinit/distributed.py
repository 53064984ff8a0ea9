"""One training run over several processes (DDP): who am I, which device, and how to start.

    ctx = DistributedContext.from_env()     # WORLD_SIZE / RANK / LOCAL_RANK, as torchrun sets them
    ctx.is_main                             # rank 0: the only process that logs and writes files

A stage asks for N processes with the environment variable STRUCTINIT_NPROC=N, not with a
flag: the process count is how a cell is run, not what it computes, so it must stay out of
the stage's command and params (DVC would otherwise count an 8-GPU run and a 1-GPU run as two
different cells). `relaunch_under_torchrun` then re-starts the stage under torchrun.

Which device and backend a process gets is `plan_devices`: one GPU per process and NCCL where
this machine has a GPU for every process on it, the CPU and gloo where torch sees no GPU, and
a refusal in between (rank 1 of two processes on a one-GPU machine has no cuda:1). To run
several processes on the CPU of a machine with GPUs, hide them: CUDA_VISIBLE_DEVICES= .
"""
from __future__ import annotations

import dataclasses
import os
import sys

import torch
import torch.distributed as dist

from structinit.errors import ConfigError

NPROC_VAR = "STRUCTINIT_NPROC"                 # processes per cell (e.g. one per GPU)
MICRO_BATCH_VAR = "STRUCTINIT_MICRO_BATCH"     # images per forward pass per process (and per stacked model)
# Gradients are averaged over processes in flat buckets of about this many bytes (DDP's default,
# bucket_cap_mb=25): one all_reduce per bucket instead of one per parameter tensor (151 for a
# ViT-T/2), while a bucket stays small enough that its copy costs little memory.
GRAD_BUCKET_BYTES = 25 * 2**20


def requested_processes(environ=os.environ) -> int:
    raw = environ.get(NPROC_VAR, "1") or "1"
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise ConfigError(f"{NPROC_VAR}={raw!r}: give a whole number of processes >= 1 "
                          "(1 = this process alone; N = N processes, e.g. one per GPU)")
    return n


def requested_micro_batch(environ=os.environ) -> int | None:
    """STRUCTINIT_MICRO_BATCH: how a process's share of the batch is cut to fit in memory (the
    step is the same, so, like the process count, it is not part of a cell's identity)."""
    raw = environ.get(MICRO_BATCH_VAR, "")
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{MICRO_BATCH_VAR}={raw!r}: give a whole number of images >= 1, or leave it unset")
    return int(raw)


def under_torchrun(environ=os.environ) -> bool:
    return "TORCHELASTIC_RUN_ID" in environ or "LOCAL_RANK" in environ


def relaunch_under_torchrun(module: str, argv: list[str], environ=os.environ) -> int | None:
    """When STRUCTINIT_NPROC > 1 and this is not yet a torchrun worker: run `python -m module
    argv` under torchrun with that many processes on this machine and return its exit status;
    otherwise None (carry on in this process). --standalone picks a free rendezvous port, so
    two cells on one machine do not collide. One machine only: many machines run many cells
    (scale.fanout), not one cell."""
    n = requested_processes(environ)
    if n == 1 or under_torchrun(environ):
        return None
    plan_devices(n, local_rank=0)             # too few GPUs: refused here, before torchrun starts n processes
    import shlex
    import subprocess

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           "-m", module, *argv]
    print(f"{NPROC_VAR}={n}: running under torchrun: {shlex.join(cmd)}", flush=True)
    return subprocess.call(cmd)


def visible_gpus() -> int:
    """The GPUs this process may use (CUDA_VISIBLE_DEVICES counts); 0 without a usable CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    backend: str                # the process group's: "nccl" between GPUs, "gloo" on the CPU
    device: torch.device        # this process's


def plan_devices(processes: int, local_rank: int, gpus: int | None = None) -> DevicePlan:
    """Backend and device of process `local_rank` of the `processes` on this machine: a GPU of
    its own (cuda:<local_rank>) and NCCL when there are at least as many visible GPUs as
    processes; the CPU and gloo when there are none. Fewer GPUs than processes (but some) is
    refused: two processes on one GPU is not what NCCL runs, and silently putting some ranks
    on the CPU would make one run train on two kinds of device. gpus: visible_gpus() unless given."""
    gpus = visible_gpus() if gpus is None else gpus
    if gpus == 0:
        return DevicePlan("gloo", torch.device("cpu"))
    if gpus < processes:
        raise ConfigError(f"{processes} processes on this machine but {gpus} visible GPU(s): NCCL needs one GPU "
                          f"per process; ask for at most {gpus} ({NPROC_VAR}={gpus}), or run the {processes} "
                          f"processes on the CPU with gloo by hiding the GPUs: CUDA_VISIBLE_DEVICES= "
                          f"{NPROC_VAR}={processes} <command>")
    return DevicePlan("nccl", torch.device("cuda", local_rank))


def refuse_batchnorm(models, world_size: int) -> None:
    """Several processes would each normalize by their own slice of the batch, so the run would
    not be the one-process run: such a model trains on one process."""
    if world_size > 1 and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
                              for model in models for m in model.modules()):
        raise ValueError(f"{type(models[0]).__name__} has BatchNorm: on {world_size} processes each would "
                         "normalize by its own slice of the batch, so the run would not be the one-process "
                         f"run; train this cell on one process (unset {NPROC_VAR})")


@dataclasses.dataclass(frozen=True)
class DistributedContext:
    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int | None = None      # processes on this machine (torchrun's); None: world_size

    @classmethod
    def from_env(cls, environ=os.environ) -> DistributedContext:
        """torchrun's variables; a plain process is rank 0 of 1."""
        local = environ.get("LOCAL_WORLD_SIZE")
        return cls(int(environ.get("WORLD_SIZE", 1)), int(environ.get("RANK", 0)),
                   int(environ.get("LOCAL_RANK", 0)), int(local) if local else None)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def plan(self) -> DevicePlan:
        """plan_devices for this process: a ConfigError when this machine has fewer GPUs (but
        some) than processes."""
        return plan_devices(self.local_world_size or self.world_size, self.local_rank)

    def device(self) -> torch.device:
        """This process's GPU (by local rank), or the CPU when there is none (plan)."""
        device = self.plan().device
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return device

    def start(self) -> None:
        """Join the process group: NCCL between GPUs, gloo on CPU. No-op for one process."""
        if self.enabled and not dist.is_initialized():
            plan = self.plan()           # too few GPUs: refused before any rank waits in the rendezvous
            if plan.device.type == "cuda":
                torch.cuda.set_device(plan.device)   # NCCL's barriers then use this rank's GPU, not GPU 0
            dist.init_process_group(plan.backend)

    def stop(self) -> None:
        if self.enabled and dist.is_initialized():
            dist.destroy_process_group()

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast_from_main(self, tensors) -> None:
        """Overwrite every process's `tensors` (in place) with rank 0's: the processes train
        one model, and rank 0's is the one written out. No-op for one process."""
        if self.enabled:
            for t in tensors:
                dist.broadcast(t, src=0)

    def average_gradients(self, params) -> None:
        """Replace each parameter's gradient (p.grad; parameters without one are skipped) by its
        mean over the processes, as DDP does: the gradients are packed into flat buffers of about
        GRAD_BUCKET_BYTES each (one dtype and device per buffer, in the parameters' order), each
        buffer summed over processes with one all_reduce, divided by world_size and copied back.
        Every process then holds the same bytes. No-op for one process."""
        if not self.enabled:
            return
        for bucket in _grad_buckets([p.grad for p in params if p.grad is not None], GRAD_BUCKET_BYTES):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            flat.div_(self.world_size)
            parts = flat.split([g.numel() for g in bucket])
            torch._foreach_copy_(bucket, [part.view(g.shape) for part, g in zip(parts, bucket)])

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over processes (in place, returned): metrics of each process's shard."""
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t


def _grad_buckets(grads: list[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """grads cut into buckets of one dtype and device and at most cap_bytes each (a single
    larger tensor is a bucket of its own), each kept in the order given: every process cuts
    its gradients the same way, so the buckets' all_reduces pair up."""
    open_buckets: dict[tuple, tuple[list[torch.Tensor], int]] = {}
    buckets = []
    for g in grads:
        key = (g.dtype, g.device)
        bucket, size = open_buckets.get(key, ([], 0))
        nbytes = g.numel() * g.element_size()
        if bucket and size + nbytes > cap_bytes:
            buckets.append(bucket)
            bucket, size = [], 0
        bucket.append(g)
        open_buckets[key] = (bucket, size + nbytes)
    buckets.extend(bucket for bucket, _ in open_buckets.values())
    return buckets
