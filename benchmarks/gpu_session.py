"""One command on a GPU machine: the GPU probe, then the default's `dvc repro` in a fresh clone,
each writing its own file per card and commit, together in at most 10 minutes.

    python3 -m benchmarks.gpu_session                     # on the GPU machine, in the repository root
    python3 -m benchmarks.gpu_session --copy-to "$OUT"    # and copy both files there
    python3 -m benchmarks.gpu_session --dry-run           # print the plan (what runs, each one's seconds)

1. Where the project's packages are missing and `.whl/` holds their wheels, installs them into
   /tmp/site (on PYTHONPATH and PATH for what follows); where `python` is not on PATH, a
   two-line `python` runs this one (every stage's command calls `python`).
2. `python -m benchmarks.gpu_probe --budget B`, B = what --total leaves after set-up, less --fresh.
3. `python -m benchmarks.fresh_repro --target '' --out-dir benchmarks --deadline D` (a fresh
   clone of the committed HEAD), D = what is left of --total.
--total (585 s) leaves 15 s of a 10-minute command for starting and copying; --fresh (300 s) is
the default's target on one GPU. Standard library only: it runs before the packages are installed.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
SITE = Path("/tmp/site")
SHIM = Path("/tmp/structinit-python")
TOTAL, FRESH, MARGIN = 585.0, 300.0, 5.0


def missing_packages(python: str, env: dict) -> bool:
    """Whether the project's own packages (dvc, pydantic, ...) are missing for `python`."""
    r = subprocess.run([python, "-c", "import dvc, pydantic, tabulate, dvclive"], env=env, capture_output=True)
    return r.returncode != 0


def prepared_env(python: str, dry_run: bool) -> tuple[dict, list[str]]:
    """The environment the probe and the stages run with, and what was done to make it."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    done = []
    if WHEELS.is_dir() and missing_packages(python, env):
        wheels = sorted(WHEELS.glob("*.whl"))
        cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
               "--upgrade", "--target", str(SITE), *map(str, wheels)]
        done.append(f"installed {len(wheels)} wheels from .whl/ into {SITE}")
        if not dry_run:
            subprocess.run(cmd, check=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH", "")) if p)
        env["PATH"] = f"{SITE / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    if shutil.which("python", path=env.get("PATH")) is None:
        done.append(f"`python` on PATH: {SHIM / 'python'} runs {python}")
        if not dry_run:
            SHIM.mkdir(parents=True, exist_ok=True)
            (SHIM / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(python)} "$@"\n')
            (SHIM / "python").chmod(0o755)
        env["PATH"] = f"{SHIM}{os.pathsep}{env.get('PATH', '')}"
    return env, done


def plan(python: str, total: float, fresh: float, elapsed: float) -> list[tuple[str, list[str], float]]:
    """[(what, command, seconds it may take)]: the probe's budget is what is left of `total`
    after `elapsed`, less `fresh`; the fresh-clone run's deadline is set when it starts."""
    probe_budget = total - elapsed - fresh
    if probe_budget < 60:
        raise SystemExit(f"--total {total:.0f} s leaves the probe {probe_budget:.0f} s after the set-up and --fresh "
                         f"{fresh:.0f} s: give more --total or less --fresh")
    return [("probe", [python, "-m", "benchmarks.gpu_probe", "--budget", f"{probe_budget:.0f}"], probe_budget),
            ("fresh-clone run", [python, "-m", "benchmarks.fresh_repro", "--target", "", "--out-dir", "benchmarks",
                                 "--deadline", "{deadline}"], fresh)]


def written(before: dict[Path, float], pattern: str) -> list[Path]:
    """The files matching `pattern` in benchmarks/ that are new or changed since `before`."""
    return [p for p in sorted((REPO / "benchmarks").glob(pattern)) if before.get(p) != p.stat().st_mtime]


def main():
    started = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--total", type=float, default=TOTAL, help=f"seconds for everything (default {TOTAL:.0f})")
    ap.add_argument("--fresh", type=float, default=FRESH,
                    help=f"seconds kept for the fresh-clone run (default {FRESH:.0f}); it also gets what the probe "
                         "leaves")
    ap.add_argument("--copy-to", type=Path, help="also copy the files written to this folder (e.g. $OUT)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    a = ap.parse_args()
    python = sys.executable
    env, done = prepared_env(python, a.dry_run)
    for line in done:
        print(f"[session] {line}", flush=True)
    steps = plan(python, a.total, a.fresh, time.monotonic() - started)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    if dirty:
        print("[session] the working tree differs from HEAD: the probe measures the working tree, the fresh-clone "
              "run the committed HEAD (commit first to measure both at one commit)", flush=True)
    before = {p: p.stat().st_mtime for p in (REPO / "benchmarks").glob("*.md")}
    for what, cmd, seconds in steps:
        left = a.total - (time.monotonic() - started)
        if "{deadline}" in cmd:                # what the probe left, at least --fresh (less the margin)
            seconds = left - MARGIN if not a.dry_run else seconds - MARGIN
            cmd = [c.replace("{deadline}", f"{seconds:.0f}") for c in cmd]
        shown = " ".join(shlex.quote(c) for c in cmd)
        print(f"[session] {time.monotonic() - started:4.0f} s: {what}, at most {seconds:.0f} s: {shown}", flush=True)
        if a.dry_run:
            continue
        try:
            code = subprocess.run(cmd, cwd=REPO, env=env, timeout=max(seconds + 30, 1)).returncode
        except subprocess.TimeoutExpired:
            code = "timed out"
        print(f"[session] {time.monotonic() - started:4.0f} s: {what} ended ({code})", flush=True)
    if a.dry_run:
        return
    files = written(before, "gpu_probe-*.md") + written(before, "fresh_repro-*.md")
    for path in files:
        print(f"[session] written: {path.relative_to(REPO)}")
        if a.copy_to:
            a.copy_to.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, a.copy_to / path.name)
    print(f"[session] {time.monotonic() - started:.0f} s in all")


if __name__ == "__main__":
    main()
