"""regime (frozen; about 1 h on 2 cores): the regime study, run on top of the main grid's cells.

    python -m stages.regime --dataset digits --out results/evidence/regime

In a scratch copy of the repository (structinit/pipeline/scratch.py) with the main grid's outputs (results,
models, artifacts, prepared data, reports), sets studies.regime.datasets to [dataset] and runs
the study's own stages (`dvc repro --allow-missing regime_report`), refusing, naming them, when
DVC would re-run any main-grid stage (the main grid is not up to date with this code). Writes
into --out: regime.md (the report, headed by the commit it ran at, the commit that fixed its
primary and the machine), regime.png, results/<cell>/seed<s>/ (each run's small outputs),
runs.csv, conclusions.json and inputs.json (the DVC hash of each main-grid cell it reuses).
The study's own pieces are structinit/evidence/regime.py's.
"""
import argparse
import json
import shutil
import subprocess
from pathlib import Path

import yaml

from stages.common import run_stage, write_json, write_text
from structinit.records import RECORD, inputs_record
from structinit.evidence import regime as ev
from structinit.evidence.replication import keep_outputs
from structinit.pipeline.cells import main_cell
from structinit.pipeline.load import load_params
from structinit.reporting.regime_report import regime_runs
from structinit.pipeline import scratch


def echo(line: str) -> None:
    print(line, end="", flush=True)


def uncommitted_changes(cwd: Path | None = None, outputs: tuple[str, ...] = ()) -> bool:
    """Whether the checkout differs from its commit in a tracked file other than dvc.yaml and
    `outputs` (paths from the checkout's top): running this stage as documented (docs/studies.md)
    unfreezes it in dvc.yaml, which `git checkout dvc.yaml` restores, and DVC removes the stage's
    committed outputs before it runs; neither changes what ran."""
    spec = [":(top)", ":(top,exclude)dvc.yaml", *(f":(top,exclude){o}" for o in outputs)]
    return bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", *spec], cwd=cwd,
                               capture_output=True, text=True).stdout.strip())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--out", type=Path, default=Path("results/evidence/regime"))
    ap.add_argument("--keep", action="store_true", help="keep the scratch copy (its path is printed)")
    a = ap.parse_args()
    params = dict(load_params())
    if a.dataset not in params["grid"]["datasets"]:
        ap.error(f"--dataset {a.dataset}: the study reuses the main grid's cells; grid.datasets: "
                 f"{params['grid']['datasets']}")
    here = Path.cwd()
    record = inputs_record("regime", [f"results/train/{main_cell(a.dataset, i)}"
                                      for i in params["studies"]["regime"]["reused"]])
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = uncommitted_changes(outputs=(a.out.as_posix(),))
    out = a.out
    with scratch.Scratch("regime", keep=a.keep) as s:
        repo = scratch.copy_working_tree(s.repo, with_outputs=("dvc.lock", *ev.OUTPUTS))   # the main grid, up to date
        scratch.evidence_frozen(repo)                 # this stage, unfrozen here to run it, frozen there
        copied = dict(load_params(repo / "params.yaml"))      # the one loader; a plain dict to write back
        copied["studies"]["regime"]["datasets"] = [a.dataset]
        (repo / "params.yaml").write_text(yaml.safe_dump(copied, sort_keys=False))
        env = scratch.pipeline_env(repo, "regime")
        scratch.commit(repo, "regime study", env)          # dvclive records the experiment's base commit
        plan: list[str] = []
        code = scratch.run_dvc(repo, "repro", "--dry", "--allow-missing", "regime_report", env=env,
                               on_line=plan.append)
        if why := ev.stale_main_grid("\n".join(plan), code):
            raise SystemExit(why)
        if scratch.run_dvc(repo, "repro", "--allow-missing", "regime_report", env=env, on_line=echo):
            raise SystemExit("dvc repro regime_report failed in the scratch copy (its output is above)")
        figure = out / "regime.png"
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / f"reports/figures/regime_{a.dataset}.png", figure)
        report = (repo / f"reports/regime_{a.dataset}.md").read_text().replace(
            f"reports/figures/regime_{a.dataset}.png", str(figure))
        conclusions = json.loads((repo / f"reports/conclusions/regime_{a.dataset}.json").read_text())
        write_json(out / "conclusions.json", conclusions)
        shutil.rmtree(out / "results", ignore_errors=True)
        keep_outputs(repo / "results/studies/regime", out / "results")   # metrics, params, init, curve
        table = regime_runs(copied, a.dataset, repo / "results/train", repo / "results/studies/regime",
                            repo / "artifacts/analysis")
        study = repo / "results/studies/regime"     # where each run's small outputs are now
        table["run"] = [str(out / "results" / Path(r).relative_to(study)) if Path(r).is_relative_to(study)
                        else str(Path(r).relative_to(repo)) for r in table.run]
        table.to_csv(out / "runs.csv", index=False, float_format="%.6g")
    machine = ev.machine_line()
    head = (f"<!-- written by the regime stage (`python -m stages.regime --dataset {a.dataset}`) at {commit}"
            f"{' (with uncommitted changes)' if dirty else ''}; {machine} -->\n\n"
            f"Run at commit {commit}{' with uncommitted changes' if dirty else ''}; its primary contrast, "
            f"`{params['studies']['regime']['contrasts']['primary']}`, {ev.fixed_at(params, here)}; {machine}.\n\n")
    text = head + report.replace("# Regime study", "## Regime study", 1).replace("\n## ", "\n### ")
    write_text(out / "regime.md", text)
    write_json(out / RECORD, record)
    print((out / "regime.md").read_text())
    print(ev.primary_line(conclusions))


if __name__ == "__main__":
    run_stage(main)
