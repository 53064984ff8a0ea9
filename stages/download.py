"""download@<dataset>: one dataset of grid.datasets as uint8 tensors. A built-in one is fetched
(checksum-verified) and converted; your own (own_datasets in params.yaml) is read from its
folder, datasets/<name>/ (structinit/data/own.py), which this stage depends on for every
dataset: a built-in one's holds a README, so only your dataset's stages see an edit of yours.

Datasets read from a local directory (ImageNet) have their own stage, download_streamed
(stages/download_streamed.py), so this one never imports their code."""
import argparse

from stages.common import run_stage
from structinit.pipeline.load import load_params
from structinit.data.own import OwnDatasetError, load_own
from structinit.data.specs import DATASETS
from structinit.data.tensors import prepare_dataset


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--source", required=True, help="the dataset's folder, datasets/<name>: your own one's files")
    ap.add_argument("--raw", default="data/raw", help="torchvision download cache")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.dataset in DATASETS:
        data = prepare_dataset(a.dataset, root=a.raw, local=a.source)
    else:
        data = load_own(a.dataset, a.source)
        # check_params compared the declaration with the files when params.yaml last changed;
        # the files may have changed since, and preoptimize reads the declared image size
        declared = load_params().own_datasets.get(a.dataset)
        if declared is None:
            raise OwnDatasetError(f"{a.dataset!r} is neither a built-in dataset {list(DATASETS)} nor in "
                                  "own_datasets of params.yaml")
        wrong = {k: (v, getattr(data.spec, k)) for k, v in declared.items() if getattr(data.spec, k) != v}
        if wrong:
            raise OwnDatasetError(f"{a.source}: " + "; ".join(f"own_datasets.{a.dataset}.{k} is {v} but the files "
                                                               f"hold {got}" for k, (v, got) in wrong.items()))
    data.save(a.out)
    print(f"{a.dataset}: {len(data.train_labels)} train / {len(data.test_labels)} test images -> {a.out}")


if __name__ == "__main__":
    run_stage(main)
