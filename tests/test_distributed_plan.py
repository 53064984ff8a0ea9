"""Which device and backend each process of a run gets (distributed.plan_devices), checked
without a GPU: torch's view of the GPUs is faked, and nothing starts a process group. And how
gradients are averaged over processes (DistributedContext.average_gradients): two real gloo
processes on the CPU, this file run as their script under torchrun."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from structinit import distributed
from structinit.distributed import DistributedContext, plan_devices, relaunch_under_torchrun
from structinit.errors import ConfigError


@pytest.fixture
def gpus(monkeypatch):
    """gpus(n): torch sees n GPUs; set_device and init_process_group are recorded, not run."""
    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: calls.append(("init", backend)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", str(device))))

    def see(n: int):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)
        return calls
    return see


def test_two_processes_on_one_gpu_are_refused_before_any_process_group(gpus):
    calls = gpus(1)
    ctx = DistributedContext(world_size=2, rank=1, local_rank=1)
    for attempt in (ctx.plan, ctx.device, ctx.start):
        with pytest.raises(ConfigError) as refused:
            attempt()
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith("2 processes on this machine but 1 visible GPU(s)")
        assert "CUDA_VISIBLE_DEVICES= STRUCTINIT_NPROC=2" in message and "gloo" in message
    assert calls == []                                    # no GPU set, no process group
    # the stage's own refusal, before torchrun starts anything: the same line
    with pytest.raises(ConfigError, match=r"^2 processes on this machine but 1 visible GPU\(s\)"):
        relaunch_under_torchrun("stages.train", [], {"STRUCTINIT_NPROC": "2"})


def test_two_processes_on_two_gpus_use_nccl_one_gpu_each(gpus):
    calls = gpus(2)
    for local_rank in (0, 1):
        plan = DistributedContext(2, local_rank, local_rank).plan()
        assert plan.backend == "nccl" and plan.device == torch.device("cuda", local_rank)
    ctx = DistributedContext(2, 1, 1)
    assert ctx.device() == torch.device("cuda", 1)
    ctx.start()
    # the GPU is set before the group starts, so NCCL's barriers use cuda:1, not cuda:0
    assert calls == [("set_device", "cuda:1"), ("set_device", "cuda:1"), ("init", "nccl")]


def test_without_a_gpu_every_process_runs_on_the_cpu_with_gloo(gpus):
    calls = gpus(0)
    for ctx in (DistributedContext(), DistributedContext(2, 1, 1), DistributedContext(8, 5, 5)):
        assert ctx.plan().backend == "gloo" and ctx.device() == torch.device("cpu")
    DistributedContext(2, 1, 1).start()
    DistributedContext().start()                          # one process: no group at all
    assert calls == [("init", "gloo")]


def test_the_gpus_are_counted_against_this_machines_processes(gpus):
    """Two machines of two GPUs, two processes each: world size 4, but 2 processes per machine."""
    gpus(2)
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
    ctx = DistributedContext.from_env(env)
    assert (ctx.world_size, ctx.rank, ctx.local_rank, ctx.local_world_size) == (4, 3, 1, 2)
    assert ctx.plan().device == torch.device("cuda", 1)
    # without LOCAL_WORLD_SIZE every process is taken to be on this machine
    with pytest.raises(ConfigError, match="4 processes on this machine but 2 visible GPU"):
        DistributedContext.from_env({k: v for k, v in env.items() if k != "LOCAL_WORLD_SIZE"}).plan()


def test_one_process_takes_the_first_gpu_or_the_cpu():
    assert plan_devices(1, 0, gpus=1).device == torch.device("cuda", 0)
    assert plan_devices(1, 0, gpus=0).device == torch.device("cpu")
    assert plan_devices(3, 2, gpus=4) == plan_devices(3, 2, gpus=3)
    with pytest.raises(ConfigError, match=r"ask for at most 2 \(STRUCTINIT_NPROC=2\)"):
        plan_devices(3, 0, gpus=2)


# ---- gradients averaged over processes, in buckets ----

SMALL_BUCKET_BYTES = 256 * 2**10        # several buckets for the ViT-T/2 below (its fp32 grads: ~21 MiB)
# ViT-T/2's parameters as create_vit builds them for CIFAR (no class token; pos_embed, patch
# embedding, 12 blocks, norm, head), written out: timm's import would double the workers' start
_D, _BLOCK = 192, [(192,), (192,), (576, 192), (576,), (192, 192), (192,), (192,), (192,), (768, 192), (768,),
                   (192, 768), (192,)]
VIT_T2_SHAPES = [(1, 256, _D), (_D, 3, 2, 2), (_D,), *_BLOCK * 12, (_D,), (_D,), (10, _D), (10,)]


def _params_with_grads(seed: int) -> list[torch.nn.Parameter]:
    """ViT-T/2's 151 parameter tensors, an fp64 one (its own bucket), one without a gradient, and
    one whose gradient is not contiguous; gradients random from `seed` (each rank its own)."""
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in VIT_T2_SHAPES]
    params += [torch.nn.Parameter(torch.zeros(5, 3, dtype=torch.float64)), torch.nn.Parameter(torch.zeros(4)),
               torch.nn.Parameter(torch.zeros(6, 7))]
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
    params[-2].grad = None
    params[-1].grad = torch.randn(7, 6, generator=g).t()
    return params


def _average_gradients_worker(out: Path) -> None:
    """One rank (under torchrun): its gradients before, after average_gradients (the default
    bucket, then a small one), the per-tensor all_reduce mean, and the all_reduces each made."""
    ctx = DistributedContext.from_env()
    ctx.start()
    calls = []
    all_reduce = dist.all_reduce

    def counted(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return all_reduce(tensor, *args, **kwargs)

    result = {}
    for name, cap in (("default", distributed.GRAD_BUCKET_BYTES), ("small", SMALL_BUCKET_BYTES)):
        params = _params_with_grads(seed=100 + ctx.rank)
        grads = [p.grad for p in params if p.grad is not None]
        before = [g.clone() for g in grads]
        per_tensor = [g.clone() for g in grads]
        for t in per_tensor:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            t.div_(ctx.world_size)
        calls.clear()
        distributed.GRAD_BUCKET_BYTES, default = cap, distributed.GRAD_BUCKET_BYTES
        dist.all_reduce = counted
        try:
            ctx.average_gradients(params)
        finally:
            dist.all_reduce, distributed.GRAD_BUCKET_BYTES = all_reduce, default
        assert all(p.grad is g for p, g in zip((p for p in params if p.grad is not None), grads))  # in place
        result[name] = {"before": before, "after": [g.clone() for g in grads], "per_tensor": per_tensor,
                        "all_reduces": list(calls), "tensors": len(grads)}
    torch.save(result, out / f"rank{ctx.rank}.pt")
    ctx.stop()


def test_two_processes_average_gradients_in_a_few_buckets(tmp_path):
    """Each rank's gradients differ; after average_gradients both hold their mean, to the bit
    the same bytes, equal (to float noise) to an all_reduce per tensor, in far fewer all_reduces
    than tensors: one per dtype with the default 25 MiB bucket (ViT-T/2's fp32 gradients fit one)."""
    repo = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                          __file__, str(tmp_path)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name in ("default", "small"):
        r0, r1 = ranks[0][name], ranks[1][name]
        tensors = r0["tensors"]
        assert tensors == 153                         # ViT-T/2's 151 (no class token), fp64, non-contiguous
        assert not any(torch.equal(a, b) for a, b in zip(r0["before"], r1["before"]))
        for a, b, ref, before0, before1 in zip(r0["after"], r1["after"], r0["per_tensor"], r0["before"], r1["before"]):
            assert torch.equal(a, b)                              # every rank the same bytes
            torch.testing.assert_close(a, ref, rtol=1e-6, atol=1e-7)
            torch.testing.assert_close(a, (before0 + before1) / 2, rtol=1e-6, atol=1e-7)
        assert r0["all_reduces"] == r1["all_reduces"]             # the buckets pair up across ranks
        assert sum(r0["all_reduces"]) == sum(t.numel() for t in r0["before"])   # every element, once
        assert len(r0["all_reduces"]) < tensors, r0["all_reduces"]
    assert len(ranks[0]["default"]["all_reduces"]) == 2           # fp32 and fp64
    # ~21 MiB of fp32 in 256 KiB buckets (the largest tensor, 576x192, one of its own)
    assert 2 < len(ranks[0]["small"]["all_reduces"]) < tensors


def test_one_process_leaves_the_gradients_alone(monkeypatch):
    monkeypatch.setattr(dist, "all_reduce", lambda *a, **k: pytest.fail("no all_reduce on one process"))
    params = _params_with_grads(seed=0)
    before = [None if p.grad is None else p.grad.clone() for p in params]
    DistributedContext().average_gradients(params)
    assert all((b is None and p.grad is None) or torch.equal(p.grad, b) for p, b in zip(params, before))


if __name__ == "__main__":                   # a rank of test_two_processes_average_gradients_in_a_few_buckets
    _average_gradients_worker(Path(sys.argv[1]))
