"""reference_solve@<dataset>-<kernel>: the official solver's softness, per seed of grid.seeds.

The paper's own loop (10,000 Adam steps, `solve_qk_adam` with its defaults, whatever
solve.solver and solve.adam say) on the same shape, offsets and pseudo-input as
preoptimize@<same key>, first block only. The reports put its mass beside the solve that
ran, so a departure from the official softness is visible. Every seed is solved in one stacked
loop on the CPU (solve_impulse_qk_seeds: the bits of one solve per seed, at the cost of about
one). DVC caches it: it re-runs only when the model shape, the offsets or the solver code change.
"""
import argparse

from stages.common import log_timings, run_stage, write_record
from structinit.pipeline.load import load_params
from structinit.pipeline.cells import seed_dir
from structinit.config import patch_grid_for
from structinit.data.specs import get_spec
from structinit.init.impulse import solve_impulse_qk_seeds

# The settings that pick the offsets and the pseudo-input: the same as the solve that ran.
SHARED_WITH_PREOPTIMIZE = ("offset_order", "pseudo_input")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--kernel", type=int, required=True)
    ap.add_argument("--seeds-from", required=True, metavar="KEY", help="e.g. grid.seeds")
    ap.add_argument("--record", required=True, help="folder of records (seed<s>.json: official mass and fit)")
    a = ap.parse_args()
    params = load_params()
    model_cfg = params.recipe(a.dataset).model
    opts = {k: params["solve"][k] for k in SHARED_WITH_PREOPTIMIZE}
    # your own dataset's image size is declared in params.yaml (checked against its files)
    own = params.own_datasets.get(a.dataset)
    image_size = own["image_size"] if own else get_spec(a.dataset).image_size
    seeds = params.seeds_at(a.seeds_from)
    # every seed in one stacked loop, on the CPU with one thread: the same bits as one by one
    solutions = solve_impulse_qk_seeds(patch_grid_for(image_size, model_cfg["patch_size"]), model_cfg["embed_dim"],
                                       model_cfg["num_heads"], 1, kernel=a.kernel, seeds=seeds, solver="adam", **opts)
    for seed, sol in zip(seeds, solutions):
        info = sol.solver_info["layer0"]
        log_timings(seed_dir(a.record, seed), {"solve_seconds": sol.solve_seconds})
        write_record(seed_dir(a.record, seed).with_suffix(".json"), {
            "dataset": a.dataset, "kernel": a.kernel, "seed": seed, "solver": "adam (official loop)",
            "steps_run": info["steps_run"], "fit_mse": sol.fit_mse, "target_mass": sol.target_mass,
            "offsets_layer0": sol.offsets[0], "model": model_cfg, **opts})
        print(f"{a.dataset} k={a.kernel} seed={seed}: official solver, {info['steps_run']} steps, "
              f"mse {sol.fit_mse:.5f}, target mass {sol.target_mass:.3f}")

if __name__ == "__main__":
    run_stage(main)
