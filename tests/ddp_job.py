"""Run by the tests alone or under torchrun: train a tiny ViT on a tiny ILSVRC folder with
the streamed trainer, or two digits ViTs stacked with the on-device trainer (ROOT = "digits"),
and save (rank 0) the weights and history.

    python tests/ddp_job.py ROOT OUT [--epochs N] [--stop-after E] [--checkpoint PATH]
"""
import argparse
import os
import sys

# The CPU always, before torch is imported: the tests compare one and two processes to float
# noise in fp32, through gloo (a GPU would add its own numerics, and two processes on a
# one-GPU machine are refused: distributed.plan_devices).
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch

from structinit.training.config import TrainConfig
from structinit.distributed import DistributedContext
from structinit.data.imagenet import imagenet_datasets, scan_imagenet
from structinit.models import create_vit
from structinit.training.streamed import train_streamed

ap = argparse.ArgumentParser()
ap.add_argument("root")
ap.add_argument("out")
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--stop-after", type=int, help="exit (as a kill would) after this epoch's checkpoint")
ap.add_argument("--checkpoint")
ap.add_argument("--mixup", type=float, default=0.0)
ap.add_argument("--rank1-builds-other-weights", action="store_true",
                help="digits: rank 1 builds different models (as a solve that differs between processes would)")
a = ap.parse_args()


def stop(metrics):
    if a.stop_after and metrics["epoch"] == a.stop_after:
        sys.exit(3)


def note_report(i, metrics):
    """Who reported which epoch: the trainers call on_epoch_end on rank 0 alone."""
    with open(f"{a.out}.reports", "a") as f:
        f.write(f"rank{ctx.rank} model{i} epoch{metrics['epoch']}\n")


ctx = DistributedContext.from_env()
ctx.start()
if a.root == "digits":
    from structinit.data.tensors import prepare_dataset
    from structinit.training.trainer import train_models

    # fp32 (amp off): one and two processes are compared to float noise
    cfgs = [TrainConfig(epochs=a.epochs, batch_size=64, lr=1e-3, warmup_epochs=1, randaugment="rand-m9-mstd0.5-inc1",
                        eval_every=1, seed=s, amp="off") for s in (0, 1)]
    models = [create_vit(img_size=8, patch_size=1, embed_dim=24, depth=1, num_heads=2, num_classes=10, in_chans=1)
              for _ in cfgs]
    for i, m in enumerate(models):
        torch.manual_seed(i + (100 if a.rank1_builds_other_weights and ctx.rank == 1 else 0))
        for p in m.parameters():
            torch.nn.init.normal_(p, std=0.05)
    histories = train_models(models, prepare_dataset("digits"), cfgs, train_indices=torch.arange(512),
                             checkpoint_path=a.checkpoint,
                             ctx=ctx, progress=False,
                             on_epoch_end=lambda i, metrics: (note_report(i, metrics), i == 1 and stop(metrics)))
    if ctx.is_main:
        torch.save({"models": [m.state_dict() for m in models], "histories": histories,
                    "world_size": ctx.world_size}, a.out)
    ctx.stop()
    sys.exit(0)
manifest = scan_imagenet(a.root, num_classes=4)
# RandAugment and random erasing on: each image is seeded by (seed, epoch, index), so two
# processes with half batches see exactly the images one process sees
cfg = TrainConfig(epochs=a.epochs, batch_size=8, lr=1e-3, warmup_epochs=1, randaugment="rand-m9-mstd0.5-inc1",
                  random_erasing=0.25, mixup=a.mixup, grad_clip=1.0, eval_every=1, seed=3, amp="off")
train_set, test_set = imagenet_datasets(a.root, manifest, cfg, cfg.seed)
torch.manual_seed(0)
model = create_vit(img_size=224, patch_size=16, embed_dim=24, depth=1, num_heads=2, num_classes=4, in_chans=3)


history = train_streamed(model, train_set, test_set, cfg, ctx=ctx, checkpoint_path=a.checkpoint, workers=0,
                         on_epoch_end=stop, progress=False)
if ctx.is_main:
    torch.save({"model": model.state_dict(), "history": history, "world_size": ctx.world_size}, a.out)
ctx.stop()
