"""train_baseline@<dataset>-<init>-<seed> / train_impulse@<dataset>-<kernel>-<seed>: one cell."""
import argparse
import os
from pathlib import Path

import torch
from dvclive import Live

from stages.common import impulse_name, load_params, recipe, save_torch, write_json
from structinit import ImageData, ImpulseSolution, TrainConfig, initialize, stratified_subset, train_model
from structinit.pipeline import build_model

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--init", required=True, help="trunc_normal, kaiming_uniform, mimetic or impulse")
    ap.add_argument("--kernel", type=int, help="impulse only")
    ap.add_argument("--solution", help="impulse only: the preoptimize artifact")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True, help="dvclive directory (metrics, curves, init record)")
    ap.add_argument("--model-out", required=True)
    a = ap.parse_args()
    if (a.init == "impulse") != (a.solution is not None):
        raise SystemExit("--solution is required for --init impulse and only for it")
    params = load_params()
    rec = recipe(params, a.dataset)
    cfg = TrainConfig(**rec["train"], seed=a.seed)            # bad keys/values fail here, early
    data = ImageData.load(a.data)
    subset = stratified_subset(data.train_labels, params["data"]["train_size"],
                               seed=params["data"]["subset_seed"])
    model = build_model(rec["model"], data.spec)
    options = {}
    if a.init == "impulse":
        options["solution"] = ImpulseSolution.from_dict(torch.load(a.solution, weights_only=False))
    record = initialize(model, a.init, seed=a.seed, **options)
    cell = f"{a.dataset}-{impulse_name(a.kernel) if a.init == 'impulse' else a.init}-{a.seed}"
    # Checkpoints live outside DVC's outputs (DVC deletes outputs before a stage runs), so an
    # interrupted cell resumes from its last finished epoch; runtime location via env var.
    ckpt = Path(os.environ.get("STRUCTINIT_CKPT_DIR", ".ckpt")) / f"{cell}.pt"
    with Live(a.out, dvcyaml=False, save_dvc_exp=False) as live:
        live.log_params({"dataset": a.dataset, "init": a.init, "kernel": a.kernel, "seed": a.seed,
                         "train_images": len(subset), **rec["model"], **rec["train"]})

        def log(metrics):
            for key in ("train_loss", "train_acc", "test_loss", "test_acc", "lr"):
                live.log_metric(key.replace("_", "/", 1), metrics[key])
            live.next_step()

        history = train_model(model, data, cfg, train_indices=subset, checkpoint_path=ckpt,
                              fingerprint={"init": record.to_dict(), "subset": subset.tolist()},
                              on_epoch_end=log)
        live.summary["best_test_acc"] = max(h["test_acc"] for h in history)
        live.summary["final_test_acc"] = history[-1]["test_acc"]
        live.summary["median_images_per_s"] = sorted(h["images_per_s"] for h in history)[len(history) // 2]
    write_json(Path(a.out) / "init.json", record.to_dict())
    save_torch(a.model_out, model.state_dict())
    ckpt.unlink(missing_ok=True)
    print(f"{cell}: final test acc {history[-1]['test_acc']:.4f}")
