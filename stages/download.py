"""download@<dataset>: fetch (checksum-verified) and convert one dataset to uint8 tensors.

Datasets read from a local directory (ImageNet) have their own stage, download_streamed
(stages/download_streamed.py), so this one never imports their code."""
import argparse

from stages.common import run_stage
from structinit.data.tensors import prepare_dataset


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--raw", default="data/raw", help="torchvision download cache")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    data = prepare_dataset(a.dataset, root=a.raw)
    data.save(a.out)
    print(f"{a.dataset}: {len(data.train_labels)} train / {len(data.test_labels)} test images -> {a.out}")


if __name__ == "__main__":
    run_stage(main)
