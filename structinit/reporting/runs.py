"""What a report reads of a trained run: its accuracy and curve (dvclive output), and what it
computed with (logged beside its params by the training stage)."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from structinit.pipeline.cells import run_name, seed_dir


def ran_with(run_dirs) -> str:
    """One sentence for a report's "What ran": what the runs computed in and on, from what each
    logged beside its params (stages/train.py), e.g. "Computed in bf16 (autocast) on CPU: AMD
    EPYC 9R14, 2 threads (25 runs). With python 3.11.7, torch 2.14.1, ... (25 runs)"."""
    seen: dict[str, int] = {}
    versions: dict[str, int] = {}
    for run in run_dirs:
        logged = yaml.safe_load((Path(run) / "params.yaml").read_text())
        dtype = logged.get("compute_dtype", "an unrecorded dtype")
        where = (f"CPU: {logged['cpu']}, {logged['cpu_threads']} threads" if logged.get("device") == "cpu"
                 else f"{logged['device']}: {logged['gpu']}" if logged.get("gpu")
                 else logged.get("device", "an unrecorded device"))
        key = f"{dtype}{' (autocast)' if dtype == 'bf16' else ''} on {where}"
        seen[key] = seen.get(key, 0) + 1
        packages = logged.get("versions", "unrecorded package versions")
        versions[packages] = versions.get(packages, 0) + 1
    if not seen:
        return ""

    def counted(d):
        return "; ".join(f"{k} ({n} run{'s' * (n > 1)})" for k, n in d.items())
    return f"Computed in {counted(seen)}. With {counted(versions)}"


def ran_with_by_dataset(runs: dict[str, list]) -> str:
    """ran_with per dataset ({dataset: its run folders}), each sentence naming its dataset where
    there are several (a GPU dataset's column beside the CPU's); the plain sentence for one."""
    if len(runs) == 1:
        return ran_with(next(iter(runs.values())))
    return " ".join(f"{ds}: {ran_with(dirs)}." for ds, dirs in runs.items()).rstrip(".")


def read_cell(group_dir: Path, seed: int):
    """One seed of a trained cell (its dvclive output) -> (final/best test accuracy in %,
    epochs), curve (named <cell>-<seed>, e.g. digits-mimetic-3)."""
    import pandas as pd  # only the report stages need it; keeps the training stages' start-up short

    run = seed_dir(group_dir, seed)
    metrics = json.loads((run / "metrics.json").read_text())
    curve = pd.read_csv(run / "plots/metrics/test/acc.tsv", sep="\t")
    return ({"acc": 100 * metrics["final_test_acc"], "best_acc": 100 * metrics["best_test_acc"],
             "epochs": int(metrics["step"]) + 1},
            curve.assign(cell=run_name(group_dir.name, seed), epoch=curve.step + 1))

