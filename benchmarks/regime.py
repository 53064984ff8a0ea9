"""The regime study (beyond the paper; off the default): run its DVC stages in a copy of the
repository, on top of the main grid's cells, and keep what it found.

    python -m benchmarks.regime [--dataset digits] [--keep] [--out benchmarks/regime.md]

Copies the working tree (code, params.yaml, dvc.lock) and the main grid's outputs (results/,
models/, artifacts/, data/prepared/, reports/) into a temporary folder, so DVC finds the main
grid up to date there (`--allow-missing`: the copy has no DVC cache, and an output missing
from the cache alone is no reason to re-run); sets studies.regime.datasets to [dataset] in the
copy's params.yaml; asks DVC (--dry) what `dvc repro regime_report` would run and refuses,
naming them, when that is more than the study's own stages (the main grid here is not up to
date with this code: `./run.sh repro` first); then runs it (study_regime*, analyze_regime*,
regime_report). Writes the report to --out (its figure beside it, <out>.png), headed by the
commit it ran at, the commit that fixed its primary contrast in params.yaml and the machine,
and keeps in benchmarks/regime/ each of the study's runs' small outputs (metrics, params, init
record, test curve), runs.csv (one row per arm and seed: every number the report shows) and
conclusions.json (the report's verdicts as data).
Prints the report; its last line: `primary: <arm> - <arm> = <diff> points, 95 % CI [lo, hi], p = <p>`.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from benchmarks.replication import copy_tree, keep_outputs
from structinit.reporting.regime_report import regime_runs

REPO = Path(__file__).resolve().parents[1]
KEPT = Path("benchmarks/regime")
STAGE = re.compile(r"Running stage '([^']+)'")
FAILED_STAGE = re.compile(r"failed to reproduce '([^']+)'")
OWN_STAGES = ("check_params", "study_regime", "analyze_regime", "regime_report")   # check_params: params.yaml changed
OUTPUTS = ("results", "models", "artifacts", "data/prepared", "reports")   # the main grid, up to date


def copy_repository(dest: Path) -> None:
    """The working tree and the main grid's outputs: with dvc.lock, DVC sees every main-grid stage
    up to date in the copy and runs the study's stages alone."""
    copy_tree(dest)
    for folder in OUTPUTS:
        if (REPO / folder).exists():
            shutil.copytree(REPO / folder, dest / folder, dirs_exist_ok=True)


def fixed_at(params: dict) -> str:
    """Since which commit params.yaml has held this primary contrast (git's record, so that
    "fixed before the results" is checked, not asserted)."""
    line = f"primary: {params['studies']['regime']['contrasts']['primary']}"
    found = subprocess.run(["git", "log", "--reverse", "--format=%h %cs", "-S", line, "--", "params.yaml"],
                           cwd=REPO, capture_output=True, text=True).stdout.split("\n")[0].strip()
    return f"fixed in params.yaml since commit {found}" if found else "not yet in a commit of params.yaml"


def machine_line() -> str:
    from structinit.numerics import numerics_record

    n = numerics_record()
    return f"CPU: {n['cpu']}, {n['threads']} threads"


def primary_line(conclusions: dict) -> str:
    c = next((c for c in conclusions["conclusions"] if c["role"] == "primary" and ", epoch" not in c["id"]), None)
    if c is None:
        return "primary: not tested"
    return (f"primary: {c['a']} - {c['b']} = {c['diff']:+.2f} points, 95 % CI [{c['ci_low']:+.2f}, "
            f"{c['ci_high']:+.2f}], p = {c['p_adjusted']:.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    ap.add_argument("--out", default="benchmarks/regime.md", help="where the report is written")
    a = ap.parse_args()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    if a.dataset not in params["grid"]["datasets"]:
        ap.error(f"--dataset {a.dataset}: the study reuses the main grid's cells; grid.datasets: "
                 f"{params['grid']['datasets']}")
    if not (REPO / "results/train").exists():
        ap.error("no results/train here: run the main grid first (./run.sh repro), whose cells the study reuses")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    tmp = Path(tempfile.mkdtemp(prefix="structinit-regime-"))
    try:
        repo = tmp / "repo"
        copy_repository(repo)
        params["studies"]["regime"]["datasets"] = [a.dataset]
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   DVC_NO_ANALYTICS="1", STRUCTINIT_CKPT_DIR=str(repo / ".ckpt"),
                   GIT_AUTHOR_NAME="regime", GIT_AUTHOR_EMAIL="regime@localhost",
                   GIT_COMMITTER_NAME="regime", GIT_COMMITTER_EMAIL="regime@localhost")
        # dvclive records the experiment's base commit, so the copy needs one
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "regime study"]):
            subprocess.run(cmd, cwd=repo, env=env, check=True, stdout=subprocess.DEVNULL)
        plan = subprocess.run(["dvc", "repro", "--dry", "--allow-missing", "regime_report"], cwd=repo, env=env,
                              capture_output=True, text=True)
        # A dry run stops at the first stage whose inputs an earlier stage would write (an
        # analysis of cells not trained yet): that is one of the study's own, and every
        # main-grid stage upstream of it has been judged by then.
        failed = FAILED_STAGE.search(plan.stdout + plan.stderr)
        if plan.returncode and not (failed and failed[1].startswith(OWN_STAGES)):
            sys.exit(f"dvc repro --dry regime_report failed in the copy:\n{plan.stdout[-2000:]}{plan.stderr[-2000:]}")
        other = [s for s in STAGE.findall(plan.stdout) if not s.startswith(OWN_STAGES)]
        if other:
            sys.exit(f"the regime study reuses the main grid's cells, but here DVC would first run {other}: "
                     "the main grid is not up to date with this code; run it first (./run.sh repro)")
        subprocess.run(["dvc", "repro", "--allow-missing", "regime_report"], cwd=repo, env=env, check=True)
        figure = Path(a.out).with_suffix(".png")
        shutil.copy2(repo / f"reports/figures/regime_{a.dataset}.png", figure)
        report = (repo / f"reports/regime_{a.dataset}.md").read_text().replace(
            f"reports/figures/regime_{a.dataset}.png", str(figure))
        conclusions = json.loads((repo / f"reports/conclusions/regime_{a.dataset}.json").read_text())
        (REPO / KEPT).mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / f"reports/conclusions/regime_{a.dataset}.json", REPO / KEPT / "conclusions.json")
        keep_outputs(repo / "results/studies/regime", REPO / KEPT / "results")   # metrics, params, init, curve
        table = regime_runs(params, a.dataset, repo / "results/train", repo / "results/studies/regime",
                            repo / "artifacts/analysis")
        # where each run's small outputs are now: the main grid's in results/train, the study's kept here
        table["run"] = [str(KEPT / "results" / Path(r).relative_to(repo / "results/studies/regime"))
                        if Path(r).is_relative_to(repo / "results/studies/regime") else str(Path(r).relative_to(repo))
                        for r in table.run]
        (REPO / KEPT).mkdir(parents=True, exist_ok=True)
        table.to_csv(REPO / KEPT / "runs.csv", index=False, float_format="%.6g")
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    head = (f"<!-- written by `python -m benchmarks.regime --dataset {a.dataset}` at {commit}"
            f"{' (with uncommitted changes)' if dirty else ''}; {machine_line()} -->\n\n"
            f"Run at commit {commit}{' with uncommitted changes' if dirty else ''}; its primary contrast, "
            f"`{params['studies']['regime']['contrasts']['primary']}`, {fixed_at(params)}; {machine_line()}.\n\n")
    text = head + report.replace("# Regime study", "## Regime study", 1).replace("\n## ", "\n### ")
    Path(a.out).write_text(text)
    print(text)
    print(primary_line(conclusions))


if __name__ == "__main__":
    main()
