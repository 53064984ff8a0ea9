"""What a stage costs before its work: the import of each stage that trains nothing, and a
training stage's time from process start to its first step (issue 50, item 4).

    python -m benchmarks.stage_startup                           # this checkout, 5 repeats
    python -m benchmarks.stage_startup --baseline /work/base     # and another checkout, interleaved
    python -m benchmarks.stage_startup --train                   # + the digits cell to its first step
    python -m benchmarks.stage_startup --repeats 1 --stages check_params    # the smallest size (the test's)

Each figure is a fresh interpreter (`python -c "import stages.<x>"`, or the stage itself), its
wall time measured from outside, min / median over the repeats; with --baseline every repeat
runs each checkout in turn, so both see the same load. Rows:
- `import stages.<x>`: what the stage pays before its first line of work (the rest of its
  time is its own work: reading, solving, writing);
- `check_params (whole stage)`: the first stage of every `dvc repro`, whose work is a few ms;
- `train to first step` (--train): `python -m stages.train` on the default digits cell
  (trunc_normal, grid.seeds, the CPU) in a scratch folder, stopped when the trainer's epoch
  loop calls its first epoch (the first step follows at once; no compile on the CPU), and of
  that the memory estimate's share.
Machines differ and 2 shared cores are noisy: compare figures of one run only.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# every stage that trains nothing, as dvc.template.yaml runs them (those present in a checkout)
STAGES = ("check_params", "download", "preoptimize", "aggregate", "curves", "attention_report", "study_report",
          "regime_report", "reports_index")

# Runs stages.train in-process with the trainer's epoch function replaced by a stop: prints the
# wall-clock time of the first epoch's call and the memory estimate's seconds, then exits.
DRIVER = r"""
import os, sys, time
import structinit.training.trainer as T
import structinit.training.memory as M
spent = []
def timed(fn):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent.append(time.perf_counter() - t)
    return run
for mod in (M, T):
    if hasattr(mod, "estimate_training_memory"):
        setattr(mod, "estimate_training_memory", timed(getattr(mod, "estimate_training_memory")))
def first(*a, **k):
    print(f"FIRST_STEP {time.time():.6f} ESTIMATE {sum(spent):.6f}", flush=True)
    os._exit(0)
setattr(T, "train_epoch" if hasattr(T, "train_epoch") else "_train_epoch", first)
sys.argv = ["stages.train", *sys.argv[1:]]
import runpy
runpy.run_module("stages.train", run_name="__main__", alter_sys=True)
raise SystemExit("the trainer never reached its first epoch")
"""
TRAIN_ARGS = ("--dataset", "digits", "--init", "trunc_normal", "--seeds-from", "grid.seeds",
              "--data", "data/prepared/digits.pt", "--out", "results/train/digits-trunc_normal",
              "--model-out", "models/digits-trunc_normal")


def environment(checkout: Path) -> dict:
    return dict(os.environ, PYTHONPATH=str(checkout), CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", ""))


def wall(cmd: list[str], cwd: Path, env: dict) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} in {cwd}: exit {r.returncode}\n{r.stderr[-2000:]}")
    return seconds


def scratch_for(checkout: Path, root: Path) -> Path:
    """A folder where the checkout's stages can run: its params.yaml and the digits data."""
    work = root / checkout.name
    work.mkdir(parents=True)
    shutil.copy(checkout / "params.yaml", work / "params.yaml")
    (work / "data/prepared").mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "stages.download", "--dataset", "digits", "--source",
                    str(checkout / "datasets/digits"), "--out", "data/prepared/digits.pt"],
                   cwd=work, env=environment(checkout), check=True, capture_output=True)
    return work


def first_step(checkout: Path, work: Path) -> tuple[float, float]:
    """(seconds from process start to the first epoch's call, of them the memory estimate's)."""
    env = dict(environment(checkout), STRUCTINIT_CKPT_DIR=str(work / ".ckpt"), STRUCTINIT_RESTART="1")
    t = time.time()
    r = subprocess.run([sys.executable, "-c", DRIVER, *TRAIN_ARGS], cwd=work, env=env, capture_output=True, text=True)
    line = next((x for x in r.stdout.splitlines() if x.startswith("FIRST_STEP")), None)
    if line is None:
        raise SystemExit(f"train in {checkout}: no first step\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    _, stamp, _, estimate = line.split()
    return float(stamp) - t, float(estimate)


def summary(values: list[float]) -> str:
    return f"{min(values):6.2f} / {statistics.median(values):6.2f}"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stages", default=",".join(STAGES), help="comma-separated; default: every non-training stage")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. /work/base), measured interleaved")
    ap.add_argument("--train", action="store_true", help="also: the digits cell from process start to its first step")
    ap.add_argument("--train-repeats", type=int, default=3)
    a = ap.parse_args(argv)
    checkouts = {"this": REPO} | ({"baseline": a.baseline.resolve()} if a.baseline else {})
    stages = [s for s in a.stages.split(",") if s]
    rows: dict[str, dict[str, list[float]]] = {}

    def add(row, which, seconds):
        rows.setdefault(row, {}).setdefault(which, []).append(seconds)

    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(a.repeats):
            for which, checkout in checkouts.items():
                env = environment(checkout)
                add("python -c pass (the interpreter)", which, wall([sys.executable, "-c", "pass"], checkout, env))
                for stage in stages:
                    if (checkout / "stages" / f"{stage}.py").exists():
                        add(f"import stages.{stage}", which,
                            wall([sys.executable, "-c", f"import stages.{stage}"], checkout, env))
                if "check_params" in stages:
                    add("check_params (whole stage)", which,
                        wall([sys.executable, "-m", "stages.check_params", "--out",
                              str(Path(tmp) / f"{which}.checked")], checkout, env))
        if a.train:
            works = {which: scratch_for(checkout, Path(tmp) / which) for which, checkout in checkouts.items()}
            for _ in range(a.train_repeats):
                for which, checkout in checkouts.items():
                    seconds, estimate = first_step(checkout, works[which])
                    add("train digits cell: start to first step", which, seconds)
                    add("  of which the memory estimate", which, estimate)

    load = os.getloadavg()
    print(f"stage start-up, wall seconds min / median over {a.repeats} repeats ({a.train_repeats} for training) "
          f"on {os.cpu_count()} CPU core(s), load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    names = list(checkouts)
    header = "| what | " + " | ".join(f"{n} ({checkouts[n]})" for n in names) + " |"
    print()
    print(header)
    print("|---|" + "---|" * len(names))
    for row, by in rows.items():
        print(f"| {row} | " + " | ".join(summary(by[n]) if n in by else "-" for n in names) + " |")


if __name__ == "__main__":
    main()
