"""Where a CPU training step's time goes, and the fastest it could be with the model's own math.

    python -m benchmarks.step_floor [--dtype bf16] [--models 5] [--batch 32] [--steps 10]
                                    [--repeats 5] [--no-compile] [--trainer-speedup X]

Times one chunk's training step (StackedModels.loss_and_grads: forward, loss, backward) of the
default digits cell (params.yaml's digits model, Trunc Normal, `--models` seeds stacked the
batched way, `--batch` images each, single-threaded: as each of the CPU trainer's chunks runs,
one per core), four ways, interleaved so that machine load hits them alike:

- today: the step the trainer runs (eager, the attention kernel choose_attention picks);
- compiled: the same step with the batched module under `torch.compile` (inductor fuses the
  elementwise work into generated C++ loops; the matmuls stay oneDNN/MKL calls). A speed
  alternative measured here, not adopted by the trainer (see the printed note);
- floor, GEMMs: every matmul and convolution the step ran, forward and backward (recorded by
  a dispatch mode, then replayed alone on fresh tensors of the same shapes, strides and dtypes):
  the step's matrix work at this machine's speed for these shapes, nothing else;
- floor, GEMMs + exp/erf: those plus every softmax and GELU, forward and backward, replayed the
  same way: work no implementation of this model's math avoids (exact GELU, softmax attention).

Prints ms per step (min / median over `--repeats` timings of `--steps` steps), each as a
fraction of today's, and the ceiling: how much faster today's step could get if it cost only
its floor. The floor leaves out everything else a step does (LayerNorm, residuals, casts, the
loss, the optimizer, the next batch's augmentation), so the true ceiling is lower. With
`--trainer-speedup X` (today's trainer against the issue's baseline, as
`python -m benchmarks.trainer_speed` prints it), it also prints that ceiling against the
baseline: X times today's ceiling.
"""
import argparse
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from benchmarks.attention_kernels import make_stack

aten = torch.ops.aten
GEMMS = {aten.bmm, aten.baddbmm, aten.mm, aten.addmm, aten.convolution, aten.convolution_backward}
EXP_ERF = {aten._softmax, aten._softmax_backward_data, aten.gelu, aten.gelu_backward}


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


def replayer(calls: list):
    """A function that runs the recorded calls again, on tensors made once up front."""
    def make(v):
        return v.make() if isinstance(v, _TensorSpec) else v
    ready = [(func, tree_map(make, args), tree_map(make, kwargs)) for func, args, kwargs in calls]

    def run():
        for func, args, kwargs in ready:
            func(*args, **kwargs)
    return run


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

    threads = torch.get_num_threads()
    torch.set_num_threads(1)                      # as each chunk of the CPU trainer runs
    try:
        stack, smoothing = make_stack(a.models)
        if stack.batched is None:
            raise SystemExit("the digits model does not take the batched way: nothing to measure")
        kernel = stack.choose_attention(torch.device("cpu"), a.dtype)
        x = torch.randn(a.models, a.batch, 1, 8, 8)
        y = torch.randint(0, 10, (a.models, a.batch))

        def loss(logits, labels):
            return torch.nn.functional.cross_entropy(logits.float(), labels, label_smoothing=smoothing)

        def context():
            return torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16")

        def step():
            return stack.loss_and_grads(x, y, loss, context)

        # The floors decompose attention as its math does (q @ k.T, softmax, @ v): recorded
        # from the explicit kernel, whichever the trainer runs (a fused kernel hides the softmax).
        for m in stack.base.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = False
        step()                                    # oneDNN primitives, allocator: before recording
        with RecordOps(GEMMS) as gemms:
            step()
        with RecordOps(GEMMS | EXP_ERF) as heavy:
            step()
        stack.choose_attention(torch.device("cpu"), a.dtype)           # back to the trainer's own
        contenders = {"today (eager, " + kernel + ")": step}
        compile_seconds, compile_error = None, None
        if not a.no_compile:
            eager = stack.batched
            compiled_module = torch.compile(eager)
            compiled = stack.__class__.__new__(stack.__class__)     # a second stack on the same tensors
            compiled.__dict__.update(stack.__dict__, batched=compiled_module)
            try:
                t = time.perf_counter()
                compiled.loss_and_grads(x, y, loss, context)
                compile_seconds = time.perf_counter() - t
                contenders["compiled (torch.compile, inductor)"] = (
                    lambda: compiled.loss_and_grads(x, y, loss, context))
            except Exception as e:                # no C++ compiler, an inductor gap: say so, go on
                compile_error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        contenders["floor: GEMMs alone"] = replayer(gemms.calls)
        contenders["floor: GEMMs + softmax/GELU"] = replayer(heavy.calls)
        times = {k: [] for k in contenders}
        for fn in contenders.values():            # warm-up
            fn()
        for _ in range(a.repeats):
            for name, fn in contenders.items():
                t = time.perf_counter()
                for _ in range(a.steps):
                    fn()
                times[name].append((time.perf_counter() - t) / a.steps)
    finally:
        torch.set_num_threads(threads)

    medians = {k: statistics.median(v) for k, v in times.items()}
    first = next(iter(times))
    today = medians[first]
    rows = [[name, f"{min(ts) * 1e3:.1f}", f"{medians[name] * 1e3:.1f}", f"{medians[name] / today:.2f}",
             f"{a.models * a.batch / medians[name]:.0f}"] for name, ts in times.items()]
    n_gemm, n_heavy = len(gemms.calls), len(heavy.calls)
    print(f"{a.models} digits ViTs stacked (batched), {a.batch} images each per step, 1 thread, {a.dtype}; "
          f"native bf16: {cpu_has_native_bf16()}; {a.repeats} interleaved repeats of {a.steps} steps; "
          f"the floors replay {n_gemm} GEMM calls and {n_heavy - n_gemm} softmax/GELU calls per step")
    print(tabulate(rows, headers=["step", "ms min", "median", "of today", "model-img/s per thread"],
                   tablefmt="github"))
    # Paired within each repeat (today's time and the floor's, taken back to back), so that a
    # slow stretch of the machine cancels out; min / median over the repeats.
    ratios = sorted(t / f for t, f in zip(times[first], times["floor: GEMMs + softmax/GELU"]))
    ceiling = statistics.median(ratios)
    result = {"medians_s": medians, "ceiling": ceiling, "ceiling_min": ratios[0], "compile_seconds": compile_seconds,
              "compile_error": compile_error, "gemm_calls": n_gemm, "exp_erf_calls": n_heavy - n_gemm}
    if compile_seconds is not None:
        print(f"compiled: first step (compile) {compile_seconds:.1f} s; "
              f"speedup of the step {today / medians['compiled (torch.compile, inductor)']:.2f}")
    elif compile_error:
        print(f"compiled: not measured, torch.compile failed here ({compile_error})")
    print(f"ceiling: today's step / its floor = {ceiling:.2f} median, {ratios[0]:.2f} min over the repeats "
          "(an upper bound: the floor leaves out "
          "LayerNorm, residuals, casts, the loss, the optimizer and augmentation)")
    if a.trainer_speedup:
        result["ceiling_vs_baseline"] = a.trainer_speedup * ceiling
        print(f"ceiling against the baseline: {a.trainer_speedup:.2f} (trainer_speed) x {ceiling:.2f} = "
              f"{result['ceiling_vs_baseline']:.2f}")
    return result


if __name__ == "__main__":
    main()
