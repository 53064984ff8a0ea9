"""analyze_streamed: stages/analyze.py for a dataset read from a local folder (ImageNet): the
same analysis, on the first --images validation images read from the folder."""
from stages import analyze
from stages.common import run_stage
from structinit.data.imagenet import check_root_matches, evaluation_images
from structinit.data.specs import get_spec
from structinit.io import load_checked


def folder_images(a, params):
    manifest = load_checked(a.data, f"a dataset manifest: re-create it with dvc repro -f download_streamed@{a.dataset}")
    root = check_root_matches(params["local_datasets"][a.dataset], manifest)
    return get_spec(a.dataset), evaluation_images(root, manifest, a.images)


if __name__ == "__main__":
    run_stage(lambda: analyze.main(load_images=folder_images))
