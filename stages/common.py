"""What every stage script shares: reading params.yaml, cell names, atomic writes.

Stages stay thin: parse arguments and params, call structinit, write outputs.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from structinit.io import write_atomic


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


def write_json(path: str | Path, obj) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n"))


def write_text(path: str | Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text))


def read_cell(cell: Path):
    """A trained cell's dvclive output -> (final/best test accuracy in %, epochs), curve."""
    import pandas as pd  # only the report stages need it; keeps the training stages' start-up short

    metrics = json.loads((cell / "metrics.json").read_text())
    curve = pd.read_csv(cell / "plots/metrics/test/acc.tsv", sep="\t")
    return ({"acc": 100 * metrics["final_test_acc"], "best_acc": 100 * metrics["best_test_acc"],
             "epochs": int(metrics["step"]) + 1},
            curve.assign(cell=cell.name, epoch=curve.step + 1))
