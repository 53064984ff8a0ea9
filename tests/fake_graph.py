"""torch.cuda's graph capture stood in for on the CPU, with a CUDA graph's semantics.

A capture records the aten ops that the captured code dispatches (forward, autograd's backward,
clipping, the optimizer's kernel), each with the tensors it read and wrote, and it computes
nothing: what the block wrote to tensors from before the capture is put back, and what it
allocated is poisoned (NaN, -1). replay() runs that op list again on those same tensors, and
nothing else. No Python of the step runs, so:
- a tensor rebound in Python after the capture (a fresh input buffer, a new .grad) is not what
  the graph reads or writes; the graph keeps the captured one;
- a Python number an op took (a host lr) stays the capture's value;
- a tensor the capture allocated and filled (zeros, AdamW's new state) is filled again at every
  replay;
- each op's result goes into the tensor the capture allocated for it (the graph's fixed
  memory), so the outputs are the same tensors at every replay.
A host read while capturing (.item(), float(t), bool(t)) raises, because CUDA refuses a sync
in a capture. Not modelled: the graph's pool reusing memory that the capture freed (here every
recorded tensor stays alive), and streams, which are plain objects.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

# Ops that allocate and compute nothing: a graph has no kernel for them to replay.
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
CAPTURE_REFUSED = "operation not permitted when stream is capturing"


def _results(func, out) -> list[torch.Tensor]:
    """The tensors func returned that alias none of its arguments, per its schema (views and
    in-place results are the arguments' own memory)."""
    returns = func._schema.returns
    outs = (out,) if len(returns) == 1 else out or ()
    return [t for r, o in zip(returns, outs) if r.alias_info is None for t in tree_leaves(o)
            if isinstance(t, torch.Tensor)]


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors func writes in place (its arguments that the schema marks `!`)."""
    given = [*args, *(kwargs.get(a.name) for a in func._schema.arguments[len(args):])]
    return [t for a, v in zip(func._schema.arguments, given) if a.alias_info is not None and a.alias_info.is_write
            for t in tree_leaves(v) if isinstance(t, torch.Tensor)]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class Graph:
    """torch.cuda.CUDAGraph. ops: what its capture recorded, as (func, args, kwargs, results)."""

    def __init__(self):
        self.ops: list[tuple] = []

    def replay(self):
        with torch.no_grad():
            for func, args, kwargs, results in self.ops:
                for kept, new in zip(results, _results(func, func(*args, **kwargs))):
                    kept.copy_(new)


class _Recording(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops, self.allocated, self.before = [], [], []
        self.own, self.kept = set(), set()       # storages the capture allocated; views already kept

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._local_scalar_dense.default:
            raise RuntimeError(CAPTURE_REFUSED)
        written = _written(func, args, kwargs)
        for t in written:                         # from before the capture: keep what it held
            key = (_storage(t), t.storage_offset(), t.shape, t.stride())
            if key[0] not in self.own and key not in self.kept:
                self.kept.add(key)
                self.before.append((t, t.clone()))
        out = func(*args, **kwargs)
        results = _results(func, out)
        inputs = {_storage(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        fresh = [t for t in results if _storage(t) not in inputs]     # not an unsafe view of an input
        self.allocated += fresh
        self.own.update(_storage(t) for t in fresh)
        if func.overloadpacket.__name__ not in ALLOCATIONS and (written or results):   # a view runs nothing
            self.ops.append((func, args, kwargs, results))
        return out


@contextlib.contextmanager
def graph(g: Graph):
    """torch.cuda.graph: record g's ops while the block runs, then undo what the block computed."""
    recording = _Recording()
    with recording:
        yield
    with torch.no_grad():
        for t, held in reversed(recording.before):       # the last kept first: overlapping views unwind
            t.copy_(held)
        for t in recording.allocated:
            t.fill_(True if t.dtype == torch.bool else float("nan") if t.is_floating_point() else -1)
    g.ops = recording.ops


class FakeCuda:
    """torch.cuda's stream and graph calls, stood in for through `monkeypatch`: CUDAGraph and
    graph as above. events: "capture", "captured" and "replay", in order; streams: which stream
    each capture ran on (and whatever a test adds, with `current`, the stream a block runs on).
    fail: a capture raises as it starts, as one that CUDA refuses does."""

    def __init__(self, monkeypatch, fail: bool = False):
        self.events, self.streams, self.current = [], [], object()      # current: the default stream
        fake = self

        class Stream:
            def __init__(self, device=None):
                pass

            def wait_stream(self, other):
                pass

        class CUDAGraph(Graph):
            def replay(self):
                fake.events.append("replay")
                super().replay()

        @contextlib.contextmanager
        def capture(g, stream=None, **kwargs):
            if fail:
                raise RuntimeError(CAPTURE_REFUSED)
            fake.events.append("capture")
            fake.streams.append(("capture", stream))
            with graph(g):
                yield
            fake.events.append("captured")

        @contextlib.contextmanager
        def on(s):
            before, fake.current = fake.current, s
            try:
                yield
            finally:
                fake.current = before

        for name, value in {"Stream": Stream, "CUDAGraph": CUDAGraph, "graph": capture, "stream": on,
                            "current_stream": lambda device=None: Stream(),
                            "synchronize": lambda device=None: None}.items():
            monkeypatch.setattr(torch.cuda, name, value)
