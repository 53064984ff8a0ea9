"""Pre-optimization speed: the paper's Adam solver vs the closed form, side by side.

    python -m benchmarks.preopt [--repeats 3]

ViT-T/2 (16x16 grid, C=192, 3 heads, k=3): the paper's schedule (10,000 Adam steps, no
early stop), the same solver with early stopping, and the closed form; same seed, so same
offsets. Then the closed form on ViT-B/16 (14x14 grid, C=768, 12 heads). Prints min/median
seconds over repeats, the fit and the softness of each, and last `ratio: <paper / closed form>`
(medians).
"""
import argparse
import statistics
import time

import torch
from tabulate import tabulate

from structinit.init import solve_impulse_qk

VIT_T2 = dict(grid=(16, 16), embed_dim=192, num_heads=3)
VIT_B16 = dict(grid=(14, 14), embed_dim=768, num_heads=12)


def timed(repeats, **kw):
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        sol = solve_impulse_qk(depth=1, kernel=3, seed=0, **kw)
        runs.append((time.perf_counter() - t, sol))
    return [s for s, _ in runs], runs[-1][1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10_000, help="the paper solver's steps")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU")
    rows, res = [], {}
    cases = [("paper: Adam, fixed steps", VIT_T2, dict(solver="adam", steps=a.steps, early_stop=False), a.repeats),
             ("paper: Adam, early stop", VIT_T2, dict(solver="adam", steps=a.steps), a.repeats),
             ("closed form", VIT_T2, dict(solver="closed_form"), max(5, a.repeats)),
             ("closed form", VIT_B16, dict(solver="closed_form"), max(5, a.repeats))]
    # Interleave repeats of the ViT-T/2 cases so machine load hits them alike.
    for i, (name, shape, opts, reps) in enumerate(cases):
        secs, sol = timed(reps, **shape, **opts)
        res[i] = (secs, sol)
        info = sol.solver_info["layer0"]
        rows.append([name, "ViT-T/2" if shape is VIT_T2 else "ViT-B/16", reps, f"{min(secs):.3f}",
                     f"{statistics.median(secs):.3f}", info.get("steps_run", "—"),
                     f"{sol.loss:.5f}", f"{sol.target_mass:.3f}", str(sol.offsets[0])])
    print(tabulate(rows, headers=["solver", "model", "repeats", "min s", "median s", "steps",
                                  "fit (MSE)", "target mass", "offsets"], tablefmt="github"))
    paper, fast = res[0], res[2]
    assert paper[1].offsets == fast[1].offsets
    print(f"target mass difference (closed form - paper): {fast[1].target_mass - paper[1].target_mass:+.3f}")
    print(f"ViT-B/16 closed form median: {statistics.median(res[3][0]):.3f} s")
    print(f"ratio: {statistics.median(paper[0]) / statistics.median(fast[0]):.0f}")


if __name__ == "__main__":
    main()
