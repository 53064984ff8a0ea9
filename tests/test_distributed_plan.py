"""Which device and backend each process of a run gets (distributed.plan_devices), checked
without a GPU: torch's view of the GPUs is faked, and nothing starts a process group."""
import pytest
import torch
import torch.distributed as dist

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
