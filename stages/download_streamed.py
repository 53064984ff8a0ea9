"""download_streamed@<dataset>: a dataset read from a local directory (ImageNet): check the
directory and list it.

The output is the manifest (files, labels, sizes): what the training stages read and what DVC
hashes in place of ~150 GB of images. The path itself is not part of it, so moving the copy
retrains nothing."""
import argparse

from stages.common import run_stage
from structinit.pipeline.load import load_params
from structinit.data.imagenet import scan_imagenet
from structinit.data.specs import get_spec
from structinit.io import save_checked


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    local = load_params()["local_datasets"]
    root = local[a.dataset]
    manifest = scan_imagenet(root, num_classes=get_spec(a.dataset).num_classes,
                             require_full=local[f"{a.dataset}_require_full"])
    save_checked(a.out, manifest)
    print(f"{a.dataset}: {len(manifest['train'])} train / {len(manifest['val'])} val images in {root} "
          f"-> {a.out} (a manifest; images are read from {root} while training)")


if __name__ == "__main__":
    run_stage(main)
