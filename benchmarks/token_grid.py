"""What a token grid of 256 would cost: the regime study's optional arm (digits resampled to
16×16, 1-pixel patches, 256 tokens as ViT-T/2 on CIFAR) against today's 8×8 (64 tokens).

    python -m benchmarks.token_grid [--side 16] [--models 5] [--batch 32] [--steps 5] [--repeats 5]

Times one chunk's training step (StackedModels.loss_and_grads: forward, loss, backward; the
trainer's attention kernel and dtype for this CPU, single-threaded as each CPU chunk runs) of
the default digits model at 8×8 and at --side × --side, interleaved, and prints both, their
ratio (median of the per-repeat ratios, and min), and the regime study's 6 cells' training time
scaled by it: `--cell-minutes M` per 8×8 cell (default 7.2: the main grid's cells on the Zen 4,
benchmarks/fresh_repro.md). The width, depth, heads and recipe stay the recipe's; the step is
most of a cell's time, so the scaled figure is an estimate, not a run.
"""
import argparse
import statistics
import time

import torch

from benchmarks.attention_kernels import batched_stack, chunk_step, one_thread

CELLS = 6                           # the regime study's training cells (docs/studies.md)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", type=int, default=16, help="the resampled image side (patch 1: side² tokens)")
    ap.add_argument("--models", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="images per model per step (one chunk)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cell-minutes", type=float, default=7.2,
                    help="one 8x8 training cell's minutes, to scale (default: the main grid's on the Zen 4)")
    a = ap.parse_args(argv)
    from structinit.training.common import cpu_has_native_bf16

    dtype = "bf16" if cpu_has_native_bf16() else "fp32"       # what amp=auto computes in here
    with one_thread():
        steps = {}
        for side in (8, a.side):
            stack, smoothing = batched_stack(a.models, image_size=side)
            kernel = stack.choose_attention(torch.device("cpu"), dtype)
            step = chunk_step(stack, smoothing, a.batch, dtype, side)
            step()
            steps[side] = step
        times = {side: [] for side in steps}
        for _ in range(a.repeats):
            for side, fn in steps.items():
                t = time.perf_counter()
                for _ in range(a.steps):
                    fn()
                times[side].append((time.perf_counter() - t) / a.steps)
    ratios = sorted(big / small for small, big in zip(times[8], times[a.side]))
    ratio = statistics.median(ratios)
    for side, ts in times.items():
        print(f"{side}x{side} ({side * side} tokens): {statistics.median(ts) * 1e3:.1f} ms per step median, "
              f"{min(ts) * 1e3:.1f} ms min ({dtype}, {kernel}, 1 thread, {a.models} models x {a.batch} images)")
    minutes = CELLS * a.cell_minutes * ratio
    print(f"ratio: {ratio:.2f} median, {ratios[0]:.2f} min over {a.repeats} paired repeats")
    print(f"the regime study at {a.side}x{a.side}: about {minutes:.0f} min of training "
          f"({CELLS} cells x {a.cell_minutes:g} min x {ratio:.2f}) against {CELLS * a.cell_minutes:.0f} at 8x8")
    return {"ratio": ratio, "ratio_min": ratios[0], "minutes": minutes,
            "ms": {s: statistics.median(t) * 1e3 for s, t in times.items()}}


if __name__ == "__main__":
    main()
