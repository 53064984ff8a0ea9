"""analyze_gpu: a GPU dataset's main cells -> its attention analysis, compact, for git.

    python -m stages.analyze_gpu --dataset fashion_mnist --data datasets/fashion_mnist \
        --models models/gpu --results results/train --images 512 --out results/analysis_gpu/fashion_mnist.pt

Run where the cells were trained (the GPU machine: their weights, models/gpu/<cell>/seed<s>.pt,
stay there), after them: for every initializer of the main grid and every seed, the model is
rebuilt at initialization (checked against the training stage's init.json) and loaded trained,
and both are analysed, as stages/analyze.py does it (its analyze_seed), on the first --images test images
(structinit/analysis/model.py). What the attention report reads of them is written in one
file small enough to commit (structinit/reporting/attention_tables.py's `compact`: the CKA
matrices in place of the representations, the first seed's offset profiles alone), so a CPU's
`dvc repro` reports the dataset without its weights.
"""
import argparse
from pathlib import Path

import torch

from stages.analyze import analyze_seed
from stages.common import run_stage
from structinit.analysis.model import test_batch
from structinit.data.tensors import prepare_dataset
from structinit.io import save_checked
from structinit.pipeline.build import CellModel
from structinit.pipeline.cells import gpu_datasets, main_cell, main_inits, main_stage
from structinit.pipeline.load import load_params
from structinit.reporting.attention_tables import compact


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True, help="a dataset of grid.gpu_datasets")
    ap.add_argument("--data", required=True,
                    help="the dataset's folder (datasets/<name>), as its training stages read it")
    ap.add_argument("--models", required=True, help="the training stages' weights: <models>/<cell>/seed<s>.pt")
    ap.add_argument("--results", required=True, help="the training stages' results: <results>/<cell>/seed<s>/init.json")
    ap.add_argument("--images", type=int, default=512, help="first N test images (default 512)")
    ap.add_argument("--out", required=True, help="the compact analysis (.pt)")
    a = ap.parse_args()
    params = load_params()
    if a.dataset not in gpu_datasets(params):
        ap.error(f"--dataset {a.dataset}: not a GPU dataset; grid.gpu_datasets: {gpu_datasets(params)}")
    if a.images < 2:
        ap.error(f"--images {a.images}: need at least 2 test images")
    inits, seeds = main_inits(params), params["grid"]["seeds"]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = prepare_dataset(a.dataset, local=a.data)
    images = test_batch(data, a.images).to(device)
    runs = {}
    for init in inits:
        cell = CellModel(dataset=a.dataset, init=init)       # an impulse cell solves here, as its stage did
        again = (f"python -m tools.fashion_mnist --grid on the GPU machine (it trains "
                 f"{main_stage('train', a.dataset, init, params)} again where its weights are not there)")
        for seed in seeds:
            runs[init, seed] = analyze_seed(cell, params, data.spec, seed, images, again=again,
                                            init_records=Path(a.results) / main_cell(a.dataset, init),
                                            models=Path(a.models) / main_cell(a.dataset, init))
    save_checked(a.out, {"dataset": a.dataset, **compact(runs, inits, seeds, len(images))})
    print(f"{a.out}: {len(runs)} runs of {len(inits)} initializers, compact ({Path(a.out).stat().st_size:,} bytes)")


if __name__ == "__main__":
    run_stage(main)
