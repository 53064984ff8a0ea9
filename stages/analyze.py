"""analyze: one trained ViT cell -> its attention and representations at init and after
training, per seed (structinit/analysis/model.py), for the attention report's tables and figures.

The model at initialization is rebuilt (same init, seed and, for the structured init, the same
preoptimize artifact the training stage used); the trained weights are the training stage's.
    python -m stages.analyze --dataset digits --init impulse3 --seeds-from grid.seeds \
        --data data/prepared/digits.pt --models models/digits-impulse3 \
        --solutions artifacts/preopt/digits-3 --images 512 --out artifacts/analysis/digits-impulse3

Datasets read from a local folder (ImageNet) have their own script, stages/analyze_streamed.py,
which passes this one its images, so this script never imports their code.
"""
import argparse
import json
from pathlib import Path

import torch

from stages.common import add_variant_options, run_stage
from structinit.pipeline.load import load_params
from structinit.analysis.model import analyze_model, test_batch
from structinit.data.tensors import ImageData
from structinit.errors import StructinitError
from structinit.io import MissingFileError, load_torch, save_checked, without_timings
from structinit.pipeline.build import CellModel, build_cell_model
from structinit.pipeline.cells import main_cell, main_stage, parse_init, run_name, seed_dir


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--init", required=True, help="a baseline (trunc_normal, ...) or impulse<k>")
    ap.add_argument("--seeds-from", required=True, metavar="KEY", help="e.g. grid.seeds")
    ap.add_argument("--data", required=True, help="prepared dataset (download stage)")
    ap.add_argument("--models", required=True, help="the training stage's folder of seed<s>.pt")
    ap.add_argument("--solutions", help="impulse<k>: its preoptimize folder (seed<s>.pt), when the cell was trained "
                                        "from one; else the solve runs here, as the training stage's did (the "
                                        "rebuild is checked against its init.json either way)")
    ap.add_argument("--init-records", required=True,
                    help="the training stage's results folder: each seed's init.json must match the rebuild")
    ap.add_argument("--images", type=int, default=512, help="first N test images (default 512)")
    ap.add_argument("--out", required=True, help="folder of seed<s>.pt analyses")
    add_variant_options(ap)
    a = ap.parse_args()
    try:
        method, kernel = parse_init(a.init)
    except ValueError as e:
        ap.error(f"--init: {e}")
    if a.images < 2:
        ap.error(f"--images {a.images}: need at least 2 test images")
    return a, method, kernel


def check_same_init(path: Path, rebuilt: dict) -> None:
    """The model rebuilt here must be the one the training stage started from: its record (init,
    seed, options, offsets) equals the training stage's init.json, or the analysis would
    describe another model."""
    if not path.exists():
        raise MissingFileError(f"{path} does not exist: train the cell first (dvc repro)")
    trained = json.loads(path.read_text())
    rebuilt = json.loads(json.dumps(without_timings(rebuilt), default=str))
    if trained != rebuilt:
        diff = sorted(k for k in set(trained) | set(rebuilt) if trained.get(k) != rebuilt.get(k))
        raise StructinitError(f"{path}: the model rebuilt at init differs from the one trained in {diff}; "
                              "re-run the cell's training stage (dvc repro)")


def analyze_seed(cell: CellModel, params, spec, seed: int, images: torch.Tensor, *, init_records, models,
                 again: str) -> dict:
    """One seed of a cell, rebuilt at initialization (checked against its training stage's
    init.json) and loaded trained (<models>/seed<s>.pt), each analysed on `images` (on the device
    the analysis runs on): {"at_init", "trained"} -> ModelAnalysis, its tensors on the CPU; says
    how its attention moved. again: how to re-create missing weights."""
    model, record = build_cell_model(cell, params, spec, seed)
    check_same_init(seed_dir(init_records, seed) / "init.json", record)
    model.to(images.device)
    at_init = analyze_model(model, images, offsets=record["offsets"])
    weights = seed_dir(models, seed).with_suffix(".pt")
    model.load_state_dict(load_torch(weights, f"trained weights: re-create them with {again}",
                                     map_location=images.device))
    trained = analyze_model(model, images, offsets=record["offsets"])
    for analysis in (at_init, trained):
        for key, value in vars(analysis).items():
            if isinstance(value, torch.Tensor):
                setattr(analysis, key, value.cpu())
    mass = "" if trained.target_images is None else (
        f", target mass on images {at_init.target_images.mean():.3f} -> {trained.target_images.mean():.3f}")
    print(f"{run_name(main_cell(cell.dataset, cell.init), seed)}: mean attention distance on images "
          f"{at_init.distance_images.mean():.2f} -> {trained.distance_images.mean():.2f} patches{mass}", flush=True)
    return {"at_init": at_init, "trained": trained}


def on_device_images(a, params):
    """(spec, the first --images test images) of the prepared dataset (download stage)."""
    data = ImageData.load(a.data)
    return data.spec, test_batch(data, a.images)


def main(load_images=on_device_images):
    a, method, kernel = parse_args()
    params = load_params()
    seeds = params.seeds_at(a.seeds_from)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec, images = load_images(a, params)
    images = images.to(device)
    cell = CellModel(dataset=a.dataset, init=a.init, solutions=a.solutions)
    # a main-grid cell's training stage has a known address; a study's cells name their folder
    main_grid_cell = Path(a.models) == Path("models") / main_cell(a.dataset, a.init)
    again = (f"dvc repro -f {main_stage('train', a.dataset, a.init, params)}" if main_grid_cell
             else f"the stage that writes {a.models}")
    for seed in seeds:
        run = analyze_seed(cell, params, spec, seed, images, init_records=a.init_records, models=a.models,
                           again=again)
        save_checked(seed_dir(a.out, seed).with_suffix(".pt"),
                     {"dataset": a.dataset, "init": a.init, "seed": seed, "images": len(images),
                      **{state: analysis.to_dict() for state, analysis in run.items()}})


if __name__ == "__main__":
    run_stage(main)
