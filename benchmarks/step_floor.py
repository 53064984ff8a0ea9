"""Where a CPU training step's time goes, and how fast its heaviest kernels alone would run.

    python -m benchmarks.step_floor [--dtype bf16] [--models 5] [--batch 32] [--steps 10]
                                    [--repeats 5] [--no-compile] [--trainer-speedup X]

Times one chunk's training step (StackedModels.loss_and_grads: forward, loss, backward) of the
default digits cell, single-threaded as each CPU chunk runs, against the same step under
`torch.compile` and against floors: the step's own kernels, recorded while it runs and replayed
on fresh tensors (GEMMs: every matmul and convolution; heavy: those plus softmax, GELU and fused
attention), in the step's order ("in sequence") and each timed alone, repeated ("hot", the most
generous). Contenders are interleaved; each prints ms per step (min / median). The ceiling is
today's step over the hot heavy floor, paired per repeat; `--trainer-speedup X`
(benchmarks.trainer_speed's figure) adds that ceiling against its baseline.
"""
import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from structinit.pipeline.load import load_params

REPO = Path(__file__).resolve().parents[1]


def make_stack(n_models: int, image_size: int | None = None):
    """n_models digits ViTs (params.yaml's recipe, Trunc Normal, seeds 0..n-1) stacked the
    batched way, and the recipe's label smoothing; image_size: digits resampled to that side
    (patch 1: image_size**2 tokens), the recipe's 8 by default."""
    import dataclasses

    import structinit as si
    from structinit.data.specs import DATASETS
    from structinit.pipeline.build import build_model
    from structinit.training.stacked import StackedModels

    rec = load_params(REPO / "params.yaml")["recipes"]["digits"]
    spec = dataclasses.replace(DATASETS["digits"], image_size=image_size or DATASETS["digits"].image_size)
    models = []
    for seed in range(n_models):
        models.append(build_model(rec["model"], spec))
        si.initialize(models[-1], "trunc_normal", seed=seed)
    return StackedModels(models, plain=False).train(), rec["train"]["label_smoothing"]   # batched, even for one


@contextlib.contextmanager
def one_thread():
    """One intra-op thread, as each chunk of the CPU trainer runs; the process's count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def batched_stack(n_models: int, image_size: int | None = None):
    """make_stack, refused (SystemExit) where the model does not take the batched way."""
    stack, smoothing = make_stack(n_models, image_size)
    if stack.batched is None:
        raise SystemExit("the digits model does not take the batched way: nothing to measure")
    return stack, smoothing


def chunk_step(stack, smoothing: float, batch: int, dtype: str, side: int = 8):
    """One chunk's training step of `stack` as the CPU trainer runs it (forward, label-smoothed
    loss, backward: StackedModels.loss_and_grads) on fixed random images (N, batch, 1, side,
    side) and labels, under bf16 autocast or in fp32; a function of no arguments."""
    x = torch.randn(stack.n, batch, 1, side, side)
    y = torch.randint(0, 10, (stack.n, batch))

    def loss(logits, labels):
        from structinit.training.stacked import mean_cross_entropy
        return mean_cross_entropy(logits, labels, smoothing)

    def context():
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")

    def step():
        return stack.loss_and_grads(x, y, loss, context)
    return step


aten = torch.ops.aten
TODAY, COMPILED = "today (eager)", "compiled (torch.compile, inductor)"
GEMM_SEQ, HEAVY_SEQ = "floor: GEMMs, in sequence", "floor: heavy, in sequence"
GEMM_HOT, HEAVY_HOT = "floor: GEMMs, hot", "floor: heavy, hot"
GEMMS = {aten.bmm, aten.baddbmm, aten.mm, aten.addmm, aten.convolution, aten.convolution_backward}
EXP_ERF = {aten._softmax, aten._softmax_backward_data, aten.gelu, aten.gelu_backward,
           aten._scaled_dot_product_flash_attention_for_cpu,             # fused attention (fp32 here)
           aten._scaled_dot_product_flash_attention_for_cpu_backward}


class _TensorSpec:
    """Enough of a tensor to make another like it: shape, strides, dtype."""

    def __init__(self, t: torch.Tensor):
        self.shape, self.stride, self.dtype = tuple(t.shape), t.stride(), t.dtype

    def make(self) -> torch.Tensor:
        # The smallest storage these strides reach (expanded dims have stride 0), filled, then viewed.
        size = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.stride) if n)
        base = torch.randn(size).to(self.dtype) if self.dtype.is_floating_point else torch.zeros(size, dtype=self.dtype)
        return base.as_strided(self.shape, self.stride)


class RecordOps(TorchDispatchMode):
    """Records every call of the given aten ops (below autograd and autocast: backward ops and
    the dtypes autocast chose included) as (op, argument specs)."""

    def __init__(self, ops: set):
        super().__init__()
        self.ops, self.calls = ops, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.overloadpacket in self.ops:
            def spec(v):
                return _TensorSpec(v) if isinstance(v, torch.Tensor) else v
            self.calls.append((func, tree_map(spec, args), tree_map(spec, kwargs)))
        return func(*args, **kwargs)


def _ready(calls: list) -> list:
    """The recorded calls with tensors made for them, once."""
    def make(v):
        return v.make() if isinstance(v, _TensorSpec) else v
    return [(func, tree_map(make, args), tree_map(make, kwargs)) for func, args, kwargs in calls]


def replayer(calls: list):
    """A function that runs the recorded calls again in order, on tensors made once up front."""
    ready = _ready(calls)

    def run():
        for func, args, kwargs in ready:
            func(*args, **kwargs)
    return run


def hot_timer(calls: list, repeats: int):
    """A function that returns the recorded calls' summed seconds, each call timed alone over
    `repeats` runs after one untimed run (its inputs and output in cache)."""
    ready = _ready(calls)

    def seconds() -> float:
        total = 0.0
        for func, args, kwargs in ready:
            func(*args, **kwargs)
            t = time.perf_counter()
            for _ in range(repeats):
                func(*args, **kwargs)
            total += (time.perf_counter() - t) / repeats
        return total
    return seconds


def gemm_flops(calls: list) -> int:
    """FLOPs of one replay of the recorded calls (torch.utils.flop_counter's count)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        replayer(calls)()
    return counter.get_total_flops()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                    help="bf16 autocast (what amp=auto computes in on a CPU with native bf16) or fp32")
    ap.add_argument("--models", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="images per model per step (one chunk)")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile contender")
    ap.add_argument("--trainer-speedup", type=float, default=None,
                    help="today's trainer / the baseline's, as benchmarks.trainer_speed printed it")
    a = ap.parse_args(argv)
    from tabulate import tabulate

    from structinit.training.common import cpu_has_native_bf16

    with one_thread():
        stack, smoothing = batched_stack(a.models)
        kernel = stack.choose_attention(torch.device("cpu"), a.dtype)
        step = chunk_step(stack, smoothing, a.batch, a.dtype)
        step()                                    # oneDNN primitives, allocator: before recording
        with RecordOps(GEMMS | EXP_ERF) as heavy:
            step()
        gemm_calls = [call for call in heavy.calls if call[0].overloadpacket in GEMMS]
        contenders = {TODAY: step}
        compile_seconds, compile_error = None, None
        if not a.no_compile:
            compiled = stack.__class__.__new__(stack.__class__)     # a second stack on the same tensors
            compiled.__dict__.update(stack.__dict__, batched=torch.compile(stack.batched))
            try:
                t = time.perf_counter()
                compiled_step = chunk_step(compiled, smoothing, a.batch, a.dtype)
                compiled_step()
                compile_seconds = time.perf_counter() - t
                contenders[COMPILED] = compiled_step
            except Exception as e:                # no C++ compiler, an inductor gap: say so, go on
                compile_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        contenders[GEMM_SEQ] = replayer(gemm_calls)
        contenders[HEAVY_SEQ] = replayer(heavy.calls)
        hot = {GEMM_HOT: hot_timer(gemm_calls, a.steps), HEAVY_HOT: hot_timer(heavy.calls, a.steps)}
        flops = gemm_flops(gemm_calls)
        times = {k: [] for k in [*contenders, *hot]}
        for fn in contenders.values():            # warm-up
            fn()
        for _ in range(a.repeats):
            for name, fn in contenders.items():
                t = time.perf_counter()
                for _ in range(a.steps):
                    fn()
                times[name].append((time.perf_counter() - t) / a.steps)
            for name, seconds in hot.items():
                times[name].append(seconds())

    medians = {k: statistics.median(v) for k, v in times.items()}
    today = medians[TODAY]
    rows = [[name, f"{min(ts) * 1e3:.1f}", f"{medians[name] * 1e3:.1f}", f"{medians[name] / today:.2f}",
             f"{a.models * a.batch / medians[name]:.0f}"] for name, ts in times.items()]
    n_gemm, n_heavy = len(gemm_calls), len(heavy.calls)
    dtypes = sorted({str(v.dtype).replace("torch.", "") for _, args, _ in gemm_calls for v in args
                     if isinstance(v, _TensorSpec)})
    print(f"{a.models} digits ViTs stacked (batched), {a.batch} images each per step, 1 thread, {a.dtype} "
          f"({kernel}); native bf16: {cpu_has_native_bf16()}; {a.repeats} interleaved repeats of {a.steps} steps; "
          f"the step ran {n_gemm} GEMM calls (inputs in {', '.join(dtypes)}) and {n_heavy - n_gemm} "
          "softmax/GELU/fused-attention calls")
    print(tabulate(rows, headers=["step", "ms min", "median", "of today", "model-img/s per thread"],
                   tablefmt="github"))
    print(f"the GEMMs: {flops / 1e9:.2f} GFLOP per step, {flops / medians[GEMM_SEQ] / 1e9:.0f} GFLOP/s in "
          f"sequence, {flops / medians[GEMM_HOT] / 1e9:.0f} hot")
    # Paired within each repeat (today's time and the floor's, taken in the same pass over the
    # contenders), so that a slow stretch of the machine mostly cancels out.
    ratios = sorted(t / f for t, f in zip(times[TODAY], times[HEAVY_HOT]))
    ceiling = statistics.median(ratios)
    result = {"medians_s": medians, "ceiling": ceiling, "ceiling_min": ratios[0], "compile_seconds": compile_seconds,
              "compile_error": compile_error, "gemm_calls": n_gemm, "heavy_calls": n_heavy - n_gemm,
              "gemm_dtypes": dtypes, "gemm_gflop": flops / 1e9}
    if compile_seconds is not None:
        print(f"compiled: first step (compile) {compile_seconds:.1f} s; "
              f"speedup of the step {today / medians[COMPILED]:.2f}")
    elif compile_error:
        print(f"compiled: not measured, torch.compile failed here ({compile_error})")
    print(f"ceiling: today's step / its hot heavy floor = {ceiling:.2f} median, {ratios[0]:.2f} min over the "
          "repeats (an upper bound: LayerNorm, residuals, casts and the loss cost time on top)")
    if a.trainer_speedup:
        result["ceiling_vs_baseline"] = a.trainer_speedup * ceiling
        print(f"ceiling against the baseline: {a.trainer_speedup:.2f} (trainer_speed) x {ceiling:.2f} = "
              f"{result['ceiling_vs_baseline']:.2f} (if a run's time scales with its step's)")
    return result

if __name__ == "__main__":
    main()
