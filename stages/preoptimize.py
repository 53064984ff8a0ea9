"""preoptimize@<dataset>-<kernel>: the structured init's Q/K solve for one model shape, one
per seed of grid.seeds (<out>/seed<s>.pt, <record>/seed<s>.json)."""
import argparse

from stages.common import log_timings, run_stage, write_record
from structinit.pipeline.load import load_params
from structinit.pipeline.cells import seed_dir
from structinit.io import save_checked, without_timings
from structinit.config import patch_grid_for
from structinit.data.specs import get_spec
from structinit.init.impulse import solve_impulse_qk
from structinit.pipeline.build import impulse_options


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--kernel", type=int, required=True)
    ap.add_argument("--seeds-from", required=True, metavar="KEY", help="e.g. grid.seeds")
    ap.add_argument("--out", required=True, help="folder of solutions (seed<s>.pt)")
    ap.add_argument("--record", required=True, help="folder of solve records (seed<s>.json: fit, softness)")
    a = ap.parse_args()
    params = load_params()
    model_cfg = params.recipe(a.dataset).model
    # your own dataset's image size is declared in params.yaml (checked against its files)
    own = params.own_datasets.get(a.dataset)
    image_size = own["image_size"] if own else get_spec(a.dataset).image_size
    for seed in params.seeds_at(a.seeds_from):
        sol = solve_impulse_qk(patch_grid_for(image_size, model_cfg["patch_size"]),
                               model_cfg["embed_dim"], model_cfg["num_heads"], model_cfg["depth"],
                               kernel=a.kernel, seed=seed, **impulse_options(params["solve"]))
        save_checked(seed_dir(a.out, seed).with_suffix(".pt"), without_timings(sol.to_dict()))
        info = sol.solver_info["layer0"]
        log_timings(seed_dir(a.record, seed), {"solve_seconds": sol.solve_seconds})
        write_record(seed_dir(a.record, seed).with_suffix(".json"), {
            "dataset": a.dataset, "kernel": a.kernel, "seed": seed, "solver": sol.options["solver"],
            "fit_mse": sol.fit_mse, "target_mass": sol.target_mass,
            "solves": sol.solver_info["solves"], "offsets_layer0": sol.offsets[0],
            "steps_run": info.get("steps_run"), "stopped_early": info.get("stopped_early"),
            "model": model_cfg})
        print(f"{a.dataset} k={a.kernel} seed={seed}: {sol.options['solver']} solve in "
              f"{sol.solve_seconds:.2f}s, mse {sol.fit_mse:.5f}, target mass {sol.target_mass:.3f}")


if __name__ == "__main__":
    run_stage(main)
