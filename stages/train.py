"""Train one cell: a ViT with one initializer, or a ConvMixer with one filter mode.

Used by every training stage: train_baseline, train_impulse (main grid) and the studies
(study_convmixer, study_pseudo_input, study_heads_width). The dataset's recipe comes from
params.yaml; the flags say what differs in this cell.
"""
import argparse
import os
from pathlib import Path

import torch
from dvclive import Live

from stages.common import load_params, recipe, run_stage, write_json
from structinit.io import save_torch
from structinit import ImageData, ImpulseSolution, TrainConfig, initialize, stratified_subset, train_model
from structinit.models import create_convmixer
from structinit.pipeline import build_model, impulse_options, parse_pseudo_variant


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--data", required=True, help="prepared dataset (download stage)")
    ap.add_argument("--out", required=True, help="dvclive directory (metrics, curves, init record)")
    ap.add_argument("--model-out", required=True)
    vit = ap.add_argument_group("ViT")
    vit.add_argument("--init", help="trunc_normal, kaiming_uniform, mimetic, impulse, or impulse<k>")
    vit.add_argument("--kernel", type=int, help="impulse: kernel size (or give impulse<k>)")
    vit.add_argument("--solution", help="impulse: a preoptimize artifact (else solved here)")
    vit.add_argument("--pseudo", help="impulse: pseudo-input variant, e.g. UP or PPL (see parse_pseudo_variant)")
    vit.add_argument("--shape", help="model shape override, a key of model_shapes in params.yaml")
    cm = ap.add_argument_group("ConvMixer")
    cm.add_argument("--convmixer", metavar="SIZE", help="a key of convmixer_sizes in params.yaml")
    cm.add_argument("--filter-mode", help="learned, random, impulse or box")
    a = ap.parse_args()
    if a.init and a.init.startswith("impulse") and a.init != "impulse":
        a.kernel, a.init = int(a.init.removeprefix("impulse")), "impulse"
    if bool(a.init) == bool(a.convmixer):
        ap.error("give either --init (ViT) or --convmixer SIZE --filter-mode MODE")
    if a.init == "impulse" and a.solution is None and a.kernel is None:
        ap.error("--init impulse needs --kernel or --solution")
    return a


def build(a, params, rec, spec):
    """The model, initialized, and a record of how (for the cell's init.json)."""
    if a.convmixer:
        sizes = params["convmixer_sizes"]
        if a.convmixer not in sizes:
            raise SystemExit(f"unknown ConvMixer size {a.convmixer!r}; convmixer_sizes has {sorted(sizes)}")
        model = create_convmixer(**sizes[a.convmixer], num_classes=spec.num_classes,
                                 in_chans=spec.channels, filter_mode=a.filter_mode, seed=a.seed)
        return model, {"model": "convmixer", "size": sizes[a.convmixer], "filter_mode": a.filter_mode}
    model_cfg = dict(rec["model"])
    if a.shape:
        shapes = params["model_shapes"]
        if a.shape not in shapes:
            raise SystemExit(f"unknown model shape {a.shape!r}; model_shapes has {sorted(shapes)}")
        model_cfg.update(shapes[a.shape])
    model = build_model(model_cfg, spec)
    options = {}
    if a.init == "impulse":
        if a.solution:
            options["solution"] = ImpulseSolution.from_dict(torch.load(a.solution, weights_only=False))
        else:
            options = {**impulse_options(params["init"]), "kernel": a.kernel,
                       **(parse_pseudo_variant(a.pseudo) if a.pseudo else {})}
    record = initialize(model, a.init, seed=a.seed, **options)
    return model, {"model": "vit", **model_cfg, **record.to_dict()}


def without_timings(obj):
    """A copy of a record without its wall-clock fields (any key ending in "seconds")."""
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items() if not str(k).endswith("seconds")}
    if isinstance(obj, (list, tuple)):
        return [without_timings(v) for v in obj]
    return obj


def cell_fingerprint(init_record: dict, subset) -> dict:
    """What a checkpoint must match to be resumed: configuration only, never timings (a
    solve's seconds change on every run, and resume would silently never happen)."""
    return {"init": without_timings(init_record), "subset": [int(i) for i in subset]}


def main():
    a = parse_args()
    params = load_params()
    rec = recipe(params, a.dataset)
    cfg = TrainConfig(**rec["train"], seed=a.seed)            # bad keys/values fail here, early
    data = ImageData.load(a.data)
    subset = stratified_subset(data.train_labels, params["data"]["train_size"],
                               seed=params["data"]["subset_seed"])
    model, init_record = build(a, params, rec, data.spec)
    # Checkpoints live outside DVC's outputs (DVC deletes outputs before a stage runs), so an
    # interrupted cell resumes from its last finished epoch. STRUCTINIT_CKPT_DIR moves them.
    cell = Path(a.out).name
    ckpt = Path(os.environ.get("STRUCTINIT_CKPT_DIR", ".ckpt")) / Path(a.out).parent.name / f"{cell}.pt"
    with Live(a.out, dvcyaml=False, save_dvc_exp=False) as live:
        live.log_params({"dataset": a.dataset, "seed": a.seed, "train_images": len(subset),
                         **{k: v for k, v in init_record.items() if k in ("model", "method", "size", "filter_mode")},
                         **rec["train"]})

        def log(metrics):
            for key in ("train_loss", "train_acc", "test_loss", "test_acc", "lr"):
                if key in metrics:                    # test_* only on evaluated epochs
                    live.log_metric(key.replace("_", "/", 1), metrics[key])
            live.next_step()

        history = train_model(model, data, cfg, train_indices=subset, checkpoint_path=ckpt,
                              fingerprint=cell_fingerprint(init_record, subset),
                              on_epoch_end=log)
        live.summary["best_test_acc"] = max(h["test_acc"] for h in history if "test_acc" in h)
        live.summary["final_test_acc"] = history[-1]["test_acc"]
        live.summary["median_images_per_s"] = sorted(h["images_per_s"] for h in history)[len(history) // 2]
    write_json(Path(a.out) / "init.json", init_record)
    save_torch(a.model_out, model.state_dict())
    ckpt.unlink(missing_ok=True)
    print(f"{cell}: final test acc {history[-1]['test_acc']:.4f}")


if __name__ == "__main__":
    run_stage(main)
