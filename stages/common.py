"""What every stage script shares: reading params.yaml, cell names, atomic writes.

Stages stay thin: parse arguments and params, call structinit, write outputs.
"""
from __future__ import annotations

import atexit
import json
import os
import sys
from pathlib import Path

import yaml

from structinit.io import write_atomic


def run_stage(main) -> None:
    """Run a stage's main(); under DVC, then leave without tearing the interpreter down.

    Finalizing the module graph of torch + timm + dvclive takes ~1.5 s per process on these
    2-core machines (`python -m benchmarks.pipeline` shows the per-stage cost), and one
    `dvc repro` starts 15+ stage processes. When main() returns, every output is written
    (atomically) and closed; the atexit handlers (logging, tqdm, dvclive) still run and the
    standard streams are flushed, then the process exits with status 0. Only under DVC
    (which sets DVC_STAGE): run by hand, e.g. under a profiler, a stage exits normally.
    Errors take the normal path either way (traceback, non-zero status).
    """
    main()
    if os.environ.get("DVC_STAGE"):
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def load_params(path: str | Path = "params.yaml") -> dict:
    with open(path) as f:
        return yaml.safe_load(f)


def recipe(params: dict, dataset: str) -> dict:
    recipes = params["recipes"]
    if dataset not in recipes:
        raise SystemExit(f"no recipe for dataset {dataset!r} in params.yaml (recipes: {sorted(recipes)})")
    return recipes[dataset]


def impulse_name(kernel: int) -> str:
    """Initializer name of the structured init with a k x k kernel, as in cell names."""
    return f"impulse{kernel}"


def seed_dir(group_dir: str | Path, seed: int) -> Path:
    """One seed's folder inside a stage's output folder: a stage trains or solves every seed of
    one cell at once (stacked), and each seed keeps its own outputs."""
    return Path(group_dir) / f"seed{seed}"


def seeds_at(params: dict, dotted: str) -> list[int]:
    """The seed list at a dotted key of params.yaml, e.g. "grid.seeds" (a stage's --seeds-from)."""
    node = params
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise SystemExit(f"--seeds-from {dotted}: params.yaml has no key {key!r} there")
        node = node[key]
    if (not isinstance(node, list) or not node
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in node)):
        raise SystemExit(f"{dotted}={node!r}: expected a non-empty list of integer seeds")
    if len(set(node)) != len(node):
        raise SystemExit(f"{dotted}={node!r}: a seed is listed twice")
    return node


def write_json(path: str | Path, obj) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n"))


def write_text(path: str | Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text))


def read_cell(group_dir: Path, seed: int):
    """One seed of a trained cell (its dvclive output) -> (final/best test accuracy in %,
    epochs), curve (named <cell>-<seed>, e.g. digits-mimetic-3)."""
    import pandas as pd  # only the report stages need it; keeps the training stages' start-up short

    run = seed_dir(group_dir, seed)
    metrics = json.loads((run / "metrics.json").read_text())
    curve = pd.read_csv(run / "plots/metrics/test/acc.tsv", sep="\t")
    return ({"acc": 100 * metrics["final_test_acc"], "best_acc": 100 * metrics["best_test_acc"],
             "epochs": int(metrics["step"]) + 1},
            curve.assign(cell=f"{group_dir.name}-{seed}", epoch=curve.step + 1))

