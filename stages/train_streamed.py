"""Train one cell of a dataset read from a local folder (ImageNet), every seed in turn with the
streamed trainer (structinit/training/streamed.py); --data is the dataset's manifest
(download_streamed stage). Everything else, flags included, is stages/train.py's: this script
only adds the streamed data and trainer, so that editing them re-runs only these cells."""
from stages import train
from stages.common import run_stage
from structinit.data.imagenet import check_root_matches, imagenet_datasets, manifest_labels
from structinit.data.specs import get_spec
from structinit.io import load_checked
from structinit.pipeline.cells import seed_dir
from structinit.distributed import DistributedContext, requested_micro_batch
from structinit.training.streamed import train_streamed


def load_manifest(a, params):
    """(spec, train labels, the manifest): images stay in the folder, read while training."""
    manifest = load_checked(a.data, f"a dataset manifest: re-create it with dvc repro -f download_streamed@{a.dataset}")
    return get_spec(a.dataset), manifest_labels(manifest), manifest


def train_streamed_seeds(a, models, params, *, data, cfgs, subset, ckpt_dir, fingerprints, log, checkpoint_every_s,
                         dtype):
    """Each seed in turn (one model fills the devices), on every process of this torchrun.
    Checkpoints every epoch (an ImageNet epoch is long): checkpoint_every_s is not used."""
    ctx = DistributedContext.from_env()
    ctx.start()
    root = check_root_matches(params["local_datasets"][a.dataset], data)
    histories = []
    for i, (model, cfg) in enumerate(zip(models, cfgs)):
        train_set, test_set = imagenet_datasets(root, data, cfg, cfg.seed, train_indices=subset)
        histories.append(train_streamed(
            model, train_set, test_set, cfg, ctx=ctx, fingerprint=fingerprints[i],
            micro_batch=requested_micro_batch(), dtype=dtype,
            checkpoint_path=seed_dir(ckpt_dir, cfg.seed).with_suffix(".pt"),
            on_epoch_end=lambda metrics, i=i: log(i, metrics)))
    ctx.stop()
    return histories


if __name__ == "__main__":
    run_stage(lambda: train.main("stages.train_streamed", load_data=load_manifest, train_cell=train_streamed_seeds))
