"""Whether a change moved a trained byte, in minutes: the first cells of the pipeline, short, in a
scratch copy of REV and of this working tree, on this machine, compared by dvc.lock's hashes.

    python -m tools.byte_check [REV]      # default HEAD; e.g. 130a2c7, whose trained outputs are committed

Each copy gets params.yaml at a short budget (tools/quick.py's quick_params: EPOCHS epochs,
seeds 0 and 1, Trunc Normal and Imp.-3) and runs `dvc repro` of the stages whose outputs are
OUTPUTS (found by path, so a stage renamed by the change is still found): the data, the Q/K
solve and two stacked cells, each trained by the CPU's chunked step. The working tree's copy then
trains its Imp.-3 cell again, cut (SIGTERM) at CUT of the time an uncut run took, and resumed by a
second `dvc repro`: the resumed run must give the uncut run's bytes. Prints each output's
verdict; exit status 1 when one differs. Bytes are a machine's: compare two trees on one
machine, never with another machine's files.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from structinit.pipeline import scratch
from structinit.pipeline.load import load_params
from tools.output_diff import output_hashes
from tools.quick import quick_params

EPOCHS, SEEDS, ARMS = 4, [0, 1], ["trunc_normal", "impulse3"]
OUTPUTS = ("data/prepared/digits.pt", "artifacts/preopt/digits-3", "results/preopt/digits-3",
           "results/train/digits-trunc_normal", "models/digits-trunc_normal",
           "results/train/digits-impulse3", "models/digits-impulse3")
RESUMED = "results/train/digits-impulse3"       # the cell cut and resumed,
CUT = 0.7                                       # at this share of its uncut run's seconds
CHECKPOINT_SECONDS_VAR = "STRUCTINIT_CHECKPOINT_SECONDS"   # stages/common.py's (a tool imports no stage)


def stages_writing(repo: Path, env: dict, outputs=OUTPUTS) -> dict[str, str]:
    """{output: the stage that writes it} in `repo`, from `dvc stage list`."""
    listed = subprocess.run(["dvc", "stage", "list"], cwd=repo, env=env, capture_output=True, text=True, check=True)
    found = {}
    for line in listed.stdout.splitlines():
        name, _, outs = line.partition(" Outputs ")
        for out in outs.split(", "):
            if out.strip() in outputs:
                found[out.strip()] = name.strip()
    missing = sorted(set(outputs) - set(found))
    if missing:
        raise SystemExit(f"byte_check: no stage in {repo} writes {missing}")
    return found


def prepare(repo: Path, root: Path) -> dict:
    """A copy of `root`'s working tree at the short budget, committed; its environment."""
    scratch.copy_working_tree(repo, root=root)
    params = quick_params(load_params(repo / "params.yaml"), EPOCHS, SEEDS, ARMS)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = scratch.pipeline_env(repo, "byte-check")
    scratch.commit(repo, "byte check", env)
    return env


def repro(repo: Path, env: dict, targets: list[str], log: Path, timeout: float | None = None) -> int:
    code = scratch.run_dvc(repo, "repro", *targets, env=env, log=log, timeout=timeout)
    if code and timeout is None:
        raise SystemExit(f"byte_check: dvc repro failed in {repo} (exit {code}); its log: {log}")
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", nargs="?", default="HEAD", help="the git revision to compare with (default HEAD)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder (its path is printed)")
    a = ap.parse_args(argv)
    return check(a.rev, keep=a.keep)


def check(rev: str, root: Path = scratch.REPO, keep: bool = False) -> int:
    """REV of this repository against the working tree of `root` (this checkout, or a test's copy)."""
    with scratch.Scratch("byte-check", keep=keep) as s:
        src = s.root / "rev-src"
        subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(scratch.REPO), str(src)], check=True)
        subprocess.run(["git", "-C", str(src), "checkout", "-q", "--detach", rev], check=True)
        got = {}
        for side, tree in ((rev, src), ("working tree", root)):
            repo = s.root / re.sub(r"\W+", "-", side)
            env = prepare(repo, tree)
            writers = stages_writing(repo, env)
            t = time.monotonic()
            repro(repo, env, list(dict.fromkeys(writers.values())), s.root / f"{repo.name}.log")
            got[side] = output_hashes((repo / "dvc.lock").read_text())
            print(f"{side}: trained in {time.monotonic() - t:.0f} s", flush=True)
        # the working tree's Imp.-3 cell again: cut at half its first run's time, then resumed
        env = dict(env, **{CHECKPOINT_SECONDS_VAR: "0"})          # a checkpoint every epoch: there is one to resume
        started = time.monotonic()
        repro(repo, env, ["-f", "-s", writers[RESUMED]], s.root / "again.log")
        whole = time.monotonic() - started
        cut = repro(repo, env, ["-f", "-s", writers[RESUMED]], s.root / "cut.log", timeout=CUT * whole)
        kept = sorted((repo / ".ckpt").rglob("*.pt"))
        repro(repo, env, ["-s", writers[RESUMED]], s.root / "resumed.log")
        resumed = output_hashes((repo / "dvc.lock").read_text())[RESUMED]
        print(f"cut at {CUT * whole:.0f} s of {whole:.0f} (dvc exit {cut}); "
              + (f"resumed from its checkpoint ({kept[0].name})" if kept else
                 "no checkpoint was written before the cut: the resume trained afresh"), flush=True)
        rows = [(out, got[rev].get(out) == got["working tree"].get(out)) for out in OUTPUTS]
        rows.append((f"{RESUMED}, cut and resumed", resumed == got["working tree"][RESUMED]))
        for out, same in rows:
            print(f"  {'same' if same else 'DIFFERENT':9} {out}")
        bad = [out for out, same in rows if not same]
        print(f"byte check against {rev}: " + (f"{len(bad)} output(s) differ" if bad else
                                                 f"all {len(rows)} identical"))
        s.keep = s.keep or bool(bad)
        return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
