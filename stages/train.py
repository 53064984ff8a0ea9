"""Train one cell, every seed at once: a ViT with one initializer, or a ConvMixer with one
filter mode, for each seed in --seeds-from, stacked into one model (structinit/training/stacked.py).

Used by every training stage: train_baseline, train_impulse (main grid) and the studies
(study_convmixer, study_pseudo_input, study_heads_width, study_data_size). The dataset's recipe comes from
params.yaml; the flags say what differs in this cell. Each seed keeps its own outputs:
<out>/seed<s>/ (dvclive metrics and curves, init.json), <model-out>/seed<s>.pt, and its own
resumable checkpoint.

Datasets read from a folder (ImageNet) have their own script, stages/train_streamed.py, which
reuses this one's pieces: this script never imports their code, so editing the ImageNet loader
retrains no on-device cell. STRUCTINIT_NPROC=N in the environment runs the cell on N processes
(torchrun, DDP; rank 0 writes everything): how a cell runs, so never part of its command.
"""
import argparse
import contextlib
import os
import sys
from pathlib import Path

import torch
from dvclive import Live

from stages.common import (RESTART_VAR, add_variant_options, log_timings, refuse_cpu_for_gpu_recipe,
                           requested_checkpoint_seconds, restart_requested, run_stage, seconds_since_start,
                           write_record)
from structinit.data.specs import STREAMED
from structinit.data.tensors import ImageData, prepare_dataset, stratified_subset
from structinit.io import save_torch, without_timings
from structinit.numerics import numerics_record, package_versions
from structinit.pipeline.build import CellModel, build_cell_model
from structinit.pipeline.cells import parse_init, run_name, seed_dir
from structinit.pipeline.load import load_params
from structinit.training.config import TrainConfig
from structinit.distributed import DistributedContext, relaunch_under_torchrun, requested_micro_batch
from structinit.training.config import match_steps, steps_per_epoch, subset_size, total_steps
from structinit.training.checkpoint import code_fingerprint
from structinit.training.stacked import compute_dtype, precision_note
from structinit.training.trainer import default_device
from structinit.training.trainer import train_models


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--seeds-from", required=True, metavar="KEY",
                    help="the params.yaml key that lists this cell's seeds, e.g. grid.seeds")
    ap.add_argument("--data", required=True, help="prepared dataset (download stage), or a built-in dataset's "
                                                  "folder (datasets/<name>), prepared here")
    ap.add_argument("--out", required=True, help="folder of per-seed dvclive folders (metrics, curves, init record)")
    ap.add_argument("--model-out", required=True, help="folder of per-seed weights")
    vit = ap.add_argument_group("ViT")
    vit.add_argument("--init", help="the cell's initializer: trunc_normal, kaiming_uniform, mimetic or "
                                    "impulse<k> (the structured init, k x k kernel)")
    vit.add_argument("--solutions", help="impulse: a preoptimize output folder (seed<s>.pt; else solved here)")
    vit.add_argument("--pseudo", help="impulse: pseudo-input variant, e.g. UP or PPL (see parse_pseudo_variant)")
    vit.add_argument("--shape", help="model shape override, a key of model_shapes in params.yaml")
    cm = ap.add_argument_group("ConvMixer")
    cm.add_argument("--convmixer", metavar="SIZE", help="a key of convmixer_sizes in params.yaml")
    cm.add_argument("--filter-mode", help="learned, random, impulse or box")
    size = ap.add_argument_group("data size")
    size.add_argument("--train-fraction", type=float, metavar="F",
                      help="train on this fraction, in (0, 1), of the main grid's training set "
                           "(data.train_size: all by default), stratified with data.subset_seed")
    size.add_argument("--match-steps", action="store_true",
                      help="with --train-fraction: as many optimizer steps as the main grid's run "
                           "(epochs, warm-up and eval_every scaled: structinit/training/config.py)")
    add_variant_options(vit)
    a = ap.parse_args()
    a.method = a.kernel = None
    if a.init:              # a.init stays the cell's name ("impulse3"); initialize() takes method, kernel
        try:
            a.method, a.kernel = parse_init(a.init)
        except ValueError as e:
            ap.error(f"--init: {e}")
    if bool(a.init) == bool(a.convmixer):
        ap.error("give either --init (ViT) or --convmixer SIZE --filter-mode MODE")
    if a.train_fraction is not None and not 0 < a.train_fraction < 1:
        ap.error(f"--train-fraction {a.train_fraction}: must be in (0, 1); 1 is the main grid's cell")
    if a.match_steps and a.train_fraction is None:
        ap.error("--match-steps needs --train-fraction")
    return a


def cell_model(a) -> CellModel:
    """What makes this cell's model, from the flags."""
    return CellModel(dataset=a.dataset, init=a.init, solutions=a.solutions, pseudo=a.pseudo, shape=a.shape,
                     convmixer=a.convmixer, filter_mode=a.filter_mode)


def data_size_cell(a, train: dict, subset, labels, subset_seed: int):
    """--train-fraction: this cell's images, a stratified subset drawn within the main grid's
    (`subset`), and with --match-steps the train settings at the main grid's step count.
    Returns (subset, train settings, what to log beside them: sizes and steps)."""
    n_main, main_steps = len(subset), total_steps(train, len(subset))
    subset = subset[stratified_subset(labels[subset], a.train_fraction, seed=subset_seed)]
    if a.match_steps:
        try:
            train = match_steps(train, n_main, len(subset))
        except ValueError as e:
            raise SystemExit(f"--train-fraction {a.train_fraction}: {e}") from None
    return subset, train, {
        "train_fraction": a.train_fraction, "main_grid_train_images": n_main, "match_steps": a.match_steps,
        "steps_per_epoch": steps_per_epoch(len(subset), train["batch_size"]),
        "steps": total_steps(train, len(subset)), "main_grid_steps": main_steps}


def cell_fingerprint(init_record: dict, subset, code: str) -> dict:
    """What a checkpoint must match to be resumed: configuration and code, never timings (a
    solve's seconds change on every run, and resume would silently never happen). code: the
    hash of the sources this process trains with (code_fingerprint): epochs trained by other
    code are not resumed, since dvc.lock will record this code's hash for the outputs."""
    return {"init": without_timings(init_record), "subset": [int(i) for i in subset], "code": code}


def main(module: str = "stages.train", load_data=None, train_cell=None):
    """Train the cell the flags name. `load_data(a, params)` -> (spec, train labels, data) and
    `train_cell(...)` -> per-seed histories default to the on-device ones; train_streamed.py
    passes its own."""
    # where a stage's fixed cost goes (logs/timings/<out>/phases.json): seconds since the process
    # started at each mark, its imports included
    phases = {"imported": seconds_since_start()}
    a = parse_args()
    requested_micro_batch()                   # bad values stop here, before any work
    every_s, restart = requested_checkpoint_seconds(), restart_requested()
    params = load_params()
    # default_device: whether torch sees a GPU, without taking one (device() would set GPU 0 in
    # this process, which under torchrun only waits for its workers)
    # the estimate trains the recipe's model on a few images: not for a streamed dataset (ImageNet)
    refuse_cpu_for_gpu_recipe(a.dataset, default_device().type, params.own_datasets,
                              estimate=None if a.dataset in STREAMED else lambda: cpu_estimate(a, params))
    if (status := relaunch_under_torchrun(module, sys.argv[1:])) is not None:
        sys.exit(status)
    main_rank = DistributedContext.from_env().is_main
    rec = params.recipe(a.dataset)
    seeds = params.seeds_at(a.seeds_from)
    spec, labels, data = (load_data or load_on_device)(a, params)
    phases["data"] = seconds_since_start()
    subset = stratified_subset(labels, params["data"]["train_size"], seed=params["data"]["subset_seed"])
    train, sizes = rec.train, {}
    if a.train_fraction is not None:
        subset, train, sizes = data_size_cell(a, train, subset, labels, params["data"]["subset_seed"])
    cfgs = [TrainConfig(**train, seed=seed) for seed in seeds]
    models, records = zip(*(build_cell_model(cell_model(a), params, spec, seed) for seed in seeds))
    phases["built"] = seconds_since_start()
    # Checkpoints live outside DVC's outputs (DVC deletes outputs before a stage runs), so an
    # interrupted cell resumes from its last finished epoch: on-device cells from one file with
    # every seed (checkpoint.pt), streamed ones seed by seed. STRUCTINIT_CKPT_DIR moves them;
    # STRUCTINIT_RESTART=1 discards them (the cell trains from its first epoch).
    cell = Path(a.out).name
    ckpt_dir = Path(os.environ.get("STRUCTINIT_CKPT_DIR", ".ckpt")) / Path(a.out).parent.name / cell
    if restart and main_rank and ckpt_dir.exists():
        for old in sorted(ckpt_dir.glob("*.pt")):
            old.unlink()
            print(f"{RESTART_VAR}=1: discarded {old}; training starts from the first epoch")
    code = code_fingerprint()                 # after the build: the initializer's file is loaded too
    fingerprints = [cell_fingerprint(r, subset, code) for r in records]
    device = DistributedContext.from_env().device()      # the one the trainer will pick
    # what the cell computes in, decided once: the trainer is handed it, and it is logged
    # beside the cell's params (the reports' "What ran")
    dtype = compute_dtype(cfgs[0], device, models[0])
    note = precision_note(cfgs[0], device, dtype)            # why fp32 on an older GPU
    # the card's name on a GPU: a report's column says what trained it ("What ran")
    gpu = {"gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {}
    ran_with = {"compute_dtype": dtype, "device": device.type, **gpu, **({"precision_note": note} if note else {}),
                "versions": package_versions(), "micro_batch": requested_micro_batch(),
                **({"cpu": (n := numerics_record())["cpu"], "cpu_threads": n["threads"]}
                   if device.type == "cpu" else {})}
    with contextlib.ExitStack() as stack:
        # under torchrun, rank 0 alone logs and writes (dvclive's advice for DDP)
        lives = [stack.enter_context(Live(seed_dir(a.out, seed), dvcyaml=False, save_dvc_exp=False))
                 for seed in seeds] if main_rank else []
        for live, seed, record in zip(lives, seeds, records):
            live.log_params({"dataset": a.dataset, "seed": seed, "train_images": len(subset),
                             **{k: v for k, v in record.items() if k in ("model", "method", "size", "filter_mode")},
                             **train, **sizes, **ran_with})

        def log(i, metrics):
            for key in ("train_loss", "train_acc", "test_loss", "test_acc", "lr"):
                if key in metrics:                    # test_* only on evaluated epochs
                    lives[i].log_metric(key.replace("_", "/", 1), metrics[key])
            lives[i].next_step()

        phases["training"] = seconds_since_start()
        histories = (train_cell or train_on_device)(a, list(models), params, data=data, cfgs=cfgs, subset=subset,
                                                    ckpt_dir=ckpt_dir, fingerprints=fingerprints, log=log,
                                                    checkpoint_every_s=every_s, dtype=dtype)
        for live, history in zip(lives, histories):
            live.summary["best_test_acc"] = max(h["test_acc"] for h in history if "test_acc" in h)
            live.summary["final_test_acc"] = history[-1]["test_acc"]
    phases["trained"] = seconds_since_start()
    if not main_rank:
        return
    for seed, record, model, history in zip(seeds, records, models, histories):
        write_record(seed_dir(a.out, seed) / "init.json", record)
        log_timings(seed_dir(a.out, seed), {
            "median_images_per_s": sorted(h["images_per_s"] for h in history)[len(history) // 2],
            "solve_seconds": record.get("solve_seconds"),
            "epochs": [{k: h[k] for k in ("epoch", "train_seconds", "seconds", "images_per_s")}
                       for h in history]})
        # on the CPU: weights written from a GPU must load on a machine without one
        save_torch(seed_dir(a.model_out, seed).with_suffix(".pt"), {k: v.cpu() for k, v in model.state_dict().items()})
        seed_dir(ckpt_dir, seed).with_suffix(".pt").unlink(missing_ok=True)    # streamed cells' checkpoints
        print(f"{run_name(cell, seed)}: final test acc {history[-1]['test_acc']:.4f}")
    # the cell's checkpoint, or each model's where the trainer ran them one after another (on a GPU)
    for done in [ckpt_dir / "checkpoint.pt", *ckpt_dir.glob("checkpoint-model*.pt")]:
        done.unlink(missing_ok=True)
    phases["saved"] = seconds_since_start()
    log_timings(Path(a.out) / "phases", {"seconds_since_start": phases})


def cpu_estimate(a, params) -> str:
    """How long this cell trains on this CPU (a GPU recipe: said before it stops, or starts)."""
    from structinit.data.specs import TRAIN_IMAGES, get_spec
    from structinit.pipeline.estimate import training_time_line

    rec = params.recipe(a.dataset)
    images = subset_size(TRAIN_IMAGES.get(a.dataset, 0), params["data"]["train_size"])
    if a.train_fraction is not None and not a.match_steps:   # matched steps: the main grid's images' worth
        images = subset_size(images, a.train_fraction)
    return training_time_line(a.dataset, rec.model, get_spec(a.dataset), rec.train, images,
                              len(params.seeds_at(a.seeds_from)), device="cpu")


def load_on_device(a, params):
    """The prepared dataset (download stage), or a built-in one prepared here from its folder
    (--data datasets/<name>: a GPU dataset's frozen stage, which depends on no download stage):
    (spec, train labels, the data itself)."""
    if Path(a.data).is_dir():
        data = prepare_dataset(a.dataset, local=a.data)
        data.check(a.data)
    else:
        data = ImageData.load(a.data)
    return data.spec, data.train_labels, data


def train_on_device(a, models, params, *, data, cfgs, subset, ckpt_dir, fingerprints, log, checkpoint_every_s,
                    dtype):
    """Every seed at once, stacked, the data on the device (structinit/training/trainer.py), in
    `dtype`: what the cell computes in, decided once by main()."""
    ctx = DistributedContext.from_env()
    ctx.start()
    histories = train_models(models, data, cfgs, train_indices=subset, checkpoint_path=ckpt_dir / "checkpoint.pt",
                             fingerprints=fingerprints, on_epoch_end=log, ctx=ctx,
                             checkpoint_every_s=checkpoint_every_s, micro_batch=requested_micro_batch(), dtype=dtype)
    ctx.stop()
    return histories


if __name__ == "__main__":
    run_stage(main)
