"""Pre-optimization speed and softness: the official solver vs the closed form.

    python -m benchmarks.preopt [--repeats 3] [--steps 10000]

ViT-T/2 (16x16 grid, C=192, 3 heads, k=3): the official loop (10,000 Adam steps, no early
stop) and the closed form at the official softness (softness law), same seed and so same
offsets. The repeats are interleaved (official, closed form, official, ...) so that machine
load hits both alike. Then the closed form on ViT-B/16 (14x14 grid, C=768, 12 heads).
Prints min/median seconds, each solve's fit and target mass, and last
`ratio: <official / closed form>` (medians).
"""
import argparse
import statistics
import time

import torch
from tabulate import tabulate

from structinit.init import solve_impulse_qk

# solve_impulse_qk's shape arguments (not create_vit's: models.vit.VIT_T2_CIFAR is those)
VIT_T2_SOLVE = dict(patch_grid=(16, 16), embed_dim=192, num_heads=3)
VIT_B16_SOLVE = dict(patch_grid=(14, 14), embed_dim=768, num_heads=12)


def solve(shape, **opts):
    t = time.perf_counter()
    sol = solve_impulse_qk(depth=1, kernel=3, seed=0, **shape, **opts)
    return time.perf_counter() - t, sol


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10_000,
                    help="the official loop's Adam steps (10,000 as the paper's code; fewer: a smoke run)")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    cases = {f"official loop, {a.steps:,} steps": (VIT_T2_SOLVE, dict(solver="adam", steps=a.steps)),
             "closed form": (VIT_T2_SOLVE, dict(solver="closed_form"))}
    secs = {name: [] for name in cases}
    sols = {}
    for _ in range(a.repeats):                   # interleaved: one of each per round
        for name, (shape, opts) in cases.items():
            s, sols[name] = solve(shape, **opts)
            secs[name].append(s)
    b16 = [solve(VIT_B16_SOLVE) for _ in range(max(5, a.repeats))]
    rows = [[name, "ViT-T/2", len(secs[name]), f"{min(secs[name]):.3f}", f"{statistics.median(secs[name]):.3f}",
             sols[name].solver_info["layer0"].get("steps_run", "—"), f"{sols[name].fit_mse:.5f}",
             f"{sols[name].target_mass:.3f}", str(sols[name].offsets[0])] for name in cases]
    rows.append(["closed form", "ViT-B/16", len(b16), f"{min(s for s, _ in b16):.3f}",
                 f"{statistics.median(s for s, _ in b16):.3f}", "—", f"{b16[-1][1].fit_mse:.5f}",
                 f"{b16[-1][1].target_mass:.3f}", str(b16[-1][1].offsets[0])])
    print(tabulate(rows, headers=["solver", "model", "repeats", "min s", "median s", "steps",
                                  "fit (MSE)", "target mass", "offsets"], tablefmt="github"))
    official, fast = (sols[n] for n in cases)
    assert official.offsets == fast.offsets
    print(f"target mass difference (closed form - official): {fast.target_mass - official.target_mass:+.3f}")
    print(f"ViT-B/16 closed form median: {statistics.median(s for s, _ in b16):.3f} s")
    names = list(cases)
    print(f"ratio: {statistics.median(secs[names[0]]) / statistics.median(secs[names[1]]):.0f}")


if __name__ == "__main__":
    main()
