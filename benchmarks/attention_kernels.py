"""Which attention kernel the batched stack should train with, per device and dtype.

    python -m benchmarks.attention_kernels [--repeats 5] [--steps 10] [--models 5] [--batch 32]

Times one training step's gradients (StackedModels.loss_and_grads: forward, loss, backward) of
the default digits cell's stack (params.yaml's digits model, Trunc Normal, `--models` seeds
stacked the batched way) on one chunk of `--batch` images per model, single-threaded, as each
of the CPU trainer's chunks runs (step.ChunkedGradients), for the four combinations of

- attention: timm's fused `scaled_dot_product_attention` or its explicit q @ k.T -> softmax -> @ v,
- precision: fp32, or bf16 autocast (emulated, and slow, on CPUs without native bf16).

Prints ms per step (min / median over `--repeats` timings of `--steps` steps each, the
four contenders interleaved so that machine load hits them alike), model-images/s, each
dtype's explicit/fused ratio, and last the choice StackedModels.choose_attention makes here.
Why it exists: on a Zen 4 (AVX512-BF16) in bf16 the fused kernel's backward took 61 % of a
step, and the step ran 2.6x slower than with explicit attention.
"""
import argparse
import contextlib
import statistics
import time
from pathlib import Path

import torch

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


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="images per model per step (one chunk)")
    a = ap.parse_args(argv)
    from tabulate import tabulate

    from structinit.training.common import cpu_has_native_bf16

    with one_thread():
        stack, smoothing = batched_stack(a.models)
        attns = [m for m in stack.base.modules() if hasattr(m, "fused_attn")]
        steps = {d: chunk_step(stack, smoothing, a.batch, d) for d in ("fp32", "bf16")}

        def step(fused: bool, dtype: str):
            def run():
                for m in attns:
                    m.fused_attn = fused
                return steps[dtype]()
            return run

        contenders = {(f, d): step(f, d) for d in ("fp32", "bf16") for f in (True, False)}
        times = {k: [] for k in contenders}
        for fn in contenders.values():            # warm-up (oneDNN primitives, allocator)
            fn()
            fn()
        for _ in range(a.repeats):
            for key, fn in contenders.items():
                t = time.perf_counter()
                for _ in range(a.steps):
                    fn()
                times[key].append((time.perf_counter() - t) / a.steps)

    rows = []
    for (fused, dtype), ts in times.items():
        med = statistics.median(ts)
        rows.append([dtype, "fused" if fused else "explicit", f"{min(ts) * 1e3:.1f}", f"{med * 1e3:.1f}",
                     f"{a.models * a.batch / med:.0f}"])
    ratios = {d: statistics.median(times[(True, d)]) / statistics.median(times[(False, d)]) for d in ("fp32", "bf16")}
    print(f"{a.models} digits ViTs stacked (batched), {a.batch} images each per step, 1 thread; "
          f"native bf16: {cpu_has_native_bf16()}; {a.repeats} interleaved repeats of {a.steps} steps")
    print(tabulate(rows, headers=["dtype", "attention", "ms/step min", "median", "model-img/s (median)"],
                   tablefmt="github"))
    for d, r in ratios.items():
        print(f"{d}: fused / explicit time = {r:.2f} ({'explicit' if r > 1 else 'fused'} is faster)")
    picked = {d: stack.choose_attention(torch.device("cpu"), d) for d in ("fp32", "bf16")}
    print("the trainer picks on this device: " + ", ".join(f"{d}: {p}" for d, p in picked.items()))
    return {"ratios": ratios, "picked": picked}


if __name__ == "__main__":
    main()
