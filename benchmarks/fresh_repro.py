"""End to end: the default `dvc repro` in a fresh clone, timed stage by stage.

    python -m benchmarks.fresh_repro [--target aggregate] [--repo .] [--keep]

Clones the repository's committed HEAD into a temporary folder (what a user gets: no DVC
cache, nothing run yet; commit first to measure local changes), runs `dvc repro <target>`
there with this environment's Python on PATH, and prints each stage family's count and
seconds (from the moments DVC announces each stage) and the whole wall time. The default
target, `aggregate`, is the main table alone (download -> preoptimize -> train -> aggregate);
`--target ''` runs everything, the three studies included. Last line: `wall: <seconds> s`.
"""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

STAGE_LINE = re.compile(r"Running stage '([^']+)'")


def timed_repro(repo: Path, target: str) -> tuple[list[tuple[str, float]], float]:
    """Run `dvc repro target` in repo; returns [(stage, seconds)] in run order and the wall time."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               DVC_NO_ANALYTICS="1")
    cmd = ["dvc", "repro"] + ([target] if target else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    starts, tail = [], collections.deque(maxlen=40)
    for line in proc.stdout:
        tail.append(line)
        if match := STAGE_LINE.search(line):
            starts.append((match[1], time.perf_counter()))
            print(f"{starts[-1][1] - t0:7.1f} s  {match[1]}", flush=True)
    if proc.wait():
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{''.join(tail)}")
    end = time.perf_counter()
    stages = [(name, (starts[i + 1][1] if i + 1 < len(starts) else end) - t)
              for i, (name, t) in enumerate(starts)]
    return stages, end - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="aggregate", help="dvc repro target ('' = every stage)")
    ap.add_argument("--repo", default=".", help="repository to clone (default: this one)")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="structinit-repro-"))
    clone = tmp / "repo"
    head = subprocess.run(["git", "-C", a.repo, "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", a.repo, str(clone)], check=True)
    print(f"dvc repro {a.target or '(all stages)'} in a fresh clone of {head} ({clone})", flush=True)
    try:
        stages, wall = timed_repro(clone, a.target)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    by_family = collections.defaultdict(list)
    for name, seconds in stages:
        by_family[name.split("@")[0]].append(seconds)
    rows = [[fam, len(s), f"{sum(s):.1f}", f"{sum(s) / len(s):.1f}"] for fam, s in by_family.items()]
    rows.append(["total", len(stages), f"{sum(s for _, s in stages):.1f}", ""])
    print(tabulate(rows, headers=["stage", "runs", "seconds", "seconds per run"], tablefmt="github"))
    print(f"wall: {wall:.1f} s ({wall / 60:.1f} min)")


if __name__ == "__main__":
    main()
