"""replication (frozen; about 1 h on 2 cores): the main table's conclusions on disjoint seeds.

    python -m stages.replication --out results/evidence/replication [--seeds 5 6 7 8 9]

In a scratch copy of the repository (structinit/pipeline/scratch.py: code, params, dvc.lock, prepared data,
the frozen stages' committed outputs; no results), sets grid.seeds to the new seeds (default:
as many as grid.seeds, after the largest), runs the real `dvc repro aggregate` and compares
its reports/conclusions/main_table.json with this workspace's (structinit/evidence/replication.py).
Writes into --out: replication.md (the verdicts), replication.json (the primary contrast of
both halves and pooled: what the headline quotes while fresh), runs/train/<cell>/seed<s>/ (each
new run's small outputs) and inputs.json (the DVC hash of each main-grid cell compared).
"""
import argparse
import json
import shutil
from pathlib import Path

import yaml

from stages.common import run_stage, write_json, write_text
from structinit.records import RECORD, inputs_record
from structinit.evidence import replication as ev
from structinit.pipeline import cells
from structinit.pipeline.load import load_params
from structinit.pipeline import scratch


def echo(line: str) -> None:
    print(line, end="", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", help="default: as many as grid.seeds, after the largest")
    ap.add_argument("--results", type=Path, default=Path("results/train"))
    ap.add_argument("--conclusions", type=Path, default=Path("reports/conclusions/main_table.json"))
    ap.add_argument("--out", type=Path, default=Path("results/evidence/replication"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    a = ap.parse_args()
    params = dict(load_params())
    seeds = params["grid"]["seeds"]
    new = a.seeds or list(range(max(seeds) + 1, max(seeds) + 1 + len(seeds)))
    if set(new) & set(seeds):
        ap.error(f"--seeds {new} overlap grid.seeds {seeds}: a replication needs disjoint seeds")
    record = inputs_record("replication", sorted({str(a.results / cells.main_cell(d, i))
                                                  for d, i, _ in cells.main_runs(params)}))
    original = json.loads(a.conclusions.read_text())
    kept = a.out / "runs/train"
    with scratch.Scratch("replication", keep=a.keep) as s:
        repo = scratch.copy_working_tree(s.repo, with_outputs=("dvc.lock", "data/prepared"))   # no second download
        scratch.evidence_frozen(repo)                 # this stage, unfrozen here to run it, frozen there
        copied = dict(load_params(repo / "params.yaml"))      # the one loader; a plain dict to write back
        copied["grid"]["seeds"] = new
        copied["grid"]["gpu_datasets"] = []            # a GPU's frozen cells are at grid.seeds only
        copied["studies"]["data_size"].get("gpu", {})["datasets"] = []
        for study in copied.get("studies", {}).values():   # a study's seeds are a subset of the grid's
            if "seeds" in study:                           # (only the main table runs here)
                study["seeds"] = new[:len(study["seeds"])]
        (repo / "params.yaml").write_text(yaml.safe_dump(copied, sort_keys=False))
        env = scratch.pipeline_env(repo, "replication")
        scratch.commit(repo, "replication", env)          # dvclive records the experiment's base commit
        if scratch.run_dvc(repo, "repro", "aggregate", env=env, on_line=echo):
            raise SystemExit("dvc repro aggregate failed in the scratch copy (its output is above)")
        again = json.loads((repo / "reports/conclusions/main_table.json").read_text())
        shutil.rmtree(kept, ignore_errors=True)
        ev.keep_outputs(repo / "results/train", kept)
    both = ev.halves(a.results, kept, seeds, new)
    text = ev.replication_report(original, again, seeds, new, **both)
    write_text(a.out / "replication.md", text)
    write_json(a.out / "replication.json", ev.primary_record(original, again, seeds, new, both["values"],
                                                             ev.computed_on(kept, new),
                                                             str(a.out / "replication.md")))
    write_json(a.out / RECORD, record)
    print(text)


if __name__ == "__main__":
    run_stage(main)
