"""reference_solve's solves: one by one (as the stage ran them before) against all seeds stacked.

    python -m benchmarks.reference_solve_speed [--repeats 3] [--steps 10000] [--seeds 0 1 2 3 4]
                                               [--kernels 3 5] [--threads N]

The default's shape (digits: 8x8 grid, width 48, 3 heads, pseudo-input P), per kernel: the
official loop for every seed, (a) one `solve_impulse_qk` per seed at the process's intra-op
threads (the stage before: what a 16-core GPU machine ran with 16 threads), (b)
`solve_impulse_qk_seeds`, every seed in one stacked loop with one thread (the stage now).
The repeats are interleaved (a, b, a, b, ...) so that machine load hits both alike. Checks that
(a) and (b) give the same bits (Q, K, fit, target mass) and prints min/median seconds per
kernel, then last `ratio: <one by one / stacked>` (medians over every kernel). --threads sets
the intra-op threads of (a), e.g. a GPU machine's core count. The whole stage's figure adds the
process start (imports) to these.
"""
import argparse
import statistics
import time

import torch
from tabulate import tabulate

from structinit.init.impulse import solve_impulse_qk, solve_impulse_qk_seeds

DIGITS_SOLVE = dict(patch_grid=(8, 8), embed_dim=48, num_heads=3, depth=1)


def one_by_one(kernel, seeds, steps):
    return [solve_impulse_qk(**DIGITS_SOLVE, kernel=kernel, seed=s, solver="adam", steps=steps) for s in seeds]


def stacked(kernel, seeds, steps):
    return solve_impulse_qk_seeds(**DIGITS_SOLVE, kernel=kernel, seeds=seeds, solver="adam", steps=steps)


def same_bits(a, b) -> bool:
    return all(torch.equal(x.q, y.q) and torch.equal(x.k, y.k) and x.fit_mse == y.fit_mse
               and x.target_mass == y.target_mass and x.offsets == y.offsets for x, y in zip(a, b, strict=True))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10_000, help="Adam steps per solve (10,000: the stage's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--kernels", type=int, nargs="+", default=[3, 5])
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads of the one-by-one way")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, CPU, one by one at {torch.get_num_threads()} thread(s), stacked at 1; "
          f"{len(a.seeds)} seeds x {a.steps:,} steps per kernel")
    ways = {"one by one (before)": one_by_one, "stacked (now)": stacked}
    secs = {(w, k): [] for w in ways for k in a.kernels}
    for _ in range(a.repeats):                    # interleaved: one of each per round
        for k in a.kernels:
            out = {}
            for w, fn in ways.items():
                t = time.perf_counter()
                out[w] = fn(k, a.seeds, a.steps)
                secs[w, k].append(time.perf_counter() - t)
            assert same_bits(*out.values()), f"kernel {k}: the stacked solve's bits differ from one by one"
    rows = [[w, k, len(s), f"{min(s):.2f}", f"{statistics.median(s):.2f}"] for (w, k), s in secs.items()]
    print(tabulate(rows, headers=["way", "kernel", "repeats", "min s", "median s"], tablefmt="github"))
    print("same bits: yes (Q, K, fit, target mass, offsets; every seed, every kernel, every repeat)")
    before = statistics.median(s for k in a.kernels for s in secs[list(ways)[0], k])
    after = statistics.median(s for k in a.kernels for s in secs[list(ways)[1], k])
    print(f"ratio: {before / after:.1f}")


if __name__ == "__main__":
    main()
