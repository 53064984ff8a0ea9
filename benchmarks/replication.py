"""Replication check: retrain the main table on a disjoint set of seeds and test each of
reports/main_table.md's conclusions on it.

    python -m benchmarks.replication [--seeds 5 6 7 8 9] [--keep]

Copies the working tree (code, params.yaml, dvc.lock, prepared data; no results) into a temporary
folder, sets grid.seeds to the new seeds there, runs the real `dvc repro aggregate`, and
compares reports/conclusions/main_table.json of both runs pair by pair:
  confirmed      the same significant direction on the new seeds
  not replicated significant before, not distinguishable now
  reversed       significant in the opposite direction
  consistent     not distinguishable before or now
  new            not distinguishable before, significant now
Prints the table and last `confirmed: <k> of <m> stated differences`.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from tabulate import tabulate

REPO = Path(__file__).resolve().parents[1]


def copy_tree(dest: Path) -> None:
    """Code, params, dvc.lock and the prepared data: with the lock, DVC sees the download
    stages as done (no second download) and re-runs the main table's stages, one per cell,
    each training all the new seeds stacked (reference_solve included)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        if f.split("/")[0] in ("results", "reports") or not (REPO / f).exists():
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)
    if (REPO / "data/prepared").exists():
        shutil.copytree(REPO / "data/prepared", dest / "data/prepared", dirs_exist_ok=True)


def verdict(before: str, after: str) -> str:
    if before == "~":
        return "consistent" if after == "~" else "new"
    if after == before:
        return "confirmed"
    return "not replicated" if after == "~" else "reversed"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", help="default: as many as grid.seeds, after the largest")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    ap.add_argument("--out", default="benchmarks/replication.md", help="where the verdicts are written")
    ap.add_argument("--again", type=Path, metavar="JSON",
                    help="train nothing: compare with this replication's conclusions (a kept copy's "
                         "reports/conclusions/main_table.json, run on --seeds)")
    a = ap.parse_args()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    seeds = params["grid"]["seeds"]
    new = a.seeds or list(range(max(seeds) + 1, max(seeds) + 1 + len(seeds)))
    if set(new) & set(seeds):
        raise SystemExit(f"--seeds {new} overlap grid.seeds {seeds}: a replication needs disjoint seeds")
    original = json.loads((REPO / "reports/conclusions/main_table.json").read_text())
    if a.again is not None:
        if not a.seeds:
            ap.error("--again needs the --seeds that replication ran on")
        text = replication_report(original, json.loads(a.again.read_text()), seeds, new)
        Path(a.out).write_text(text)
        print(text)
        return
    tmp = Path(tempfile.mkdtemp(prefix="structinit-replication-"))
    try:
        repo = tmp / "repo"
        copy_tree(repo)
        params["grid"]["seeds"] = new
        for study in params.get("studies", {}).values():   # a study's seeds are a subset of the grid's
            if "seeds" in study:                           # (only the main table runs here)
                study["seeds"] = new[:len(study["seeds"])]
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                   DVC_NO_ANALYTICS="1", STRUCTINIT_CKPT_DIR=str(repo / ".ckpt"),
                   GIT_AUTHOR_NAME="replication", GIT_AUTHOR_EMAIL="replication@localhost",
                   GIT_COMMITTER_NAME="replication", GIT_COMMITTER_EMAIL="replication@localhost")
        # dvclive records the experiment's base commit, so the copy needs one
        for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "replication"],
                    ["dvc", "repro", "aggregate"]):
            subprocess.run(cmd, cwd=repo, env=env, check=True)
        again = json.loads((repo / "reports/conclusions/main_table.json").read_text())
    finally:
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    text = replication_report(original, again, seeds, new)
    Path(a.out).write_text(text)
    print(text)


def _stated(c: dict) -> str:
    p = c.get("p_adjusted", c.get("p_holm"))
    diff = c["diff"] if "diff" in c else c["mean_a"] - c["mean_b"]
    return f"{c['verdict']} ({diff:+.2f}, p={p:.2g}{', fragile' if c.get('fragile') else ''})"


def replication_report(original: dict, again: dict, seeds: list, new: list) -> str:
    """Each planned conclusion of the committed main table against the same test on new seeds."""
    after = {(c["family"], c["a"], c["b"]): c for c in again["conclusions"]}
    rows, stated, confirmed = [], 0, 0
    for c in original["conclusions"]:
        d = after.get((c["family"], c["a"], c["b"]))
        if d is None:
            rows.append([c["family"], c.get("role", ""), f"{c['a']} vs {c['b']}", _stated(c), "not run", "—"])
            continue
        v = verdict(c["verdict"], d["verdict"])
        stated += c["verdict"] != "~"
        confirmed += v == "confirmed"
        rows.append([c["family"], c.get("role", ""), f"{c['a']} vs {c['b']}", _stated(c), _stated(d), v])
    return (f"# Replication of the main table's planned conclusions (python -m benchmarks.replication)\n\n"
            f"Seeds {seeds} (reports/) vs {new} (replication, disjoint). Test: {original['test']}.\n\n"
            + tabulate(rows, headers=["dataset", "role", "contrast", "stated", "replication", "verdict"],
                       tablefmt="github")
            + f"\n\nconfirmed: {confirmed} of {stated} stated differences\n")


if __name__ == "__main__":
    main()
