"""What every stage script shares: atomic writes, timing logs, and the
pipeline's process policy (what the library itself never does: exits, environment checks).

params.yaml is read by structinit/pipeline/load.py (load_params); cell names and which cells
it asks for: structinit/pipeline/cells.py.

Stages stay thin: parse arguments and params, call structinit, write outputs.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import time
from pathlib import Path

from structinit.errors import StructinitError
from structinit.io import without_timings, write_atomic

TIMINGS_DIR = Path("logs/timings")   # wall-clock times: beside the outputs, never in them


REMOVED_NUMERICS_VAR = "STRUCTINIT_CPU_NUMERICS"     # the old CPU pin's opt-out; the pin is gone


def refuse_removed_setting(environ=os.environ) -> None:
    """The old opt-out variable, still set in someone's shell, would now do nothing: say so."""
    if environ.get(REMOVED_NUMERICS_VAR):
        raise SystemExit(
            f"{REMOVED_NUMERICS_VAR}={environ[REMOVED_NUMERICS_VAR]!r} is no longer read: the CPU pin it "
            "switched off is gone (it did not give the same bytes on Intel and AMD CPUs and cost speed); "
            f"every run now uses the CPU's own kernels. Unset {REMOVED_NUMERICS_VAR}; "
            "docs/reproducibility.md says what holds.")


# How a training stage runs, never what it computes: environment variables, so that they stay
# out of the stage's command and params (DVC would count them as another cell).
CHECKPOINT_SECONDS_VAR = "STRUCTINIT_CHECKPOINT_SECONDS"   # seconds between checkpoint writes
RESTART_VAR = "STRUCTINIT_RESTART"                          # 1: discard a cell's checkpoint, start afresh
ALLOW_CPU_VAR = "STRUCTINIT_ALLOW_CPU"                      # 1: train a GPU recipe on a CPU anyway
DEFAULT_CHECKPOINT_SECONDS = 30.0
# The embedded dataset's recipe is sized for a CPU; every other built-in dataset's (the paper's
# CIFAR-10/100, SVHN, ImageNet recipes, Fashion-MNIST's) for GPUs: ViT-T/2 on CIFAR-10 takes weeks
# on a CPU.
CPU_DATASETS = ("digits",)


def requested_checkpoint_seconds(environ=os.environ) -> float:
    """STRUCTINIT_CHECKPOINT_SECONDS: a training checkpoint is written at the end of an epoch
    once this many seconds have passed since the last one (default 30; 0: every epoch)."""
    raw = environ.get(CHECKPOINT_SECONDS_VAR, "")
    if not raw:
        return DEFAULT_CHECKPOINT_SECONDS
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise StructinitError(f"{CHECKPOINT_SECONDS_VAR}={raw!r}: give a number of seconds >= 0 "
                              f"(0: every epoch; unset: {DEFAULT_CHECKPOINT_SECONDS:g})")
    return seconds


def restart_requested(environ=os.environ) -> bool:
    """STRUCTINIT_RESTART=1: the cell's checkpoint is discarded and it trains from its first epoch."""
    raw = environ.get(RESTART_VAR, "")
    if raw not in ("", "0", "1"):
        raise StructinitError(f"{RESTART_VAR}={raw!r}: give 1 (discard the cell's checkpoint) or 0 / unset")
    return raw == "1"


def refuse_cpu_for_gpu_recipe(dataset: str, device_type: str, own_datasets, environ=os.environ,
                              estimate=None) -> None:
    """A built-in dataset's recipe other than the embedded one is a GPU recipe (the paper's,
    Fashion-MNIST's): on a machine whose torch sees no GPU it stops before any work, unless
    STRUCTINIT_ALLOW_CPU=1. Your own datasets (own_datasets) carry your recipe and are never
    refused. estimate(): a sentence saying how long the cell would take here
    (structinit/pipeline/estimate.py), measured in seconds and said either way."""
    if device_type != "cpu" or dataset in CPU_DATASETS or dataset in own_datasets:
        return
    how_long = f" {estimate()}." if estimate else ""
    if environ.get(ALLOW_CPU_VAR, "") == "1":
        print(f"{ALLOW_CPU_VAR}=1: training {dataset}'s GPU recipe on the CPU.{how_long}")
        return
    raise StructinitError(
        f"{dataset}'s recipe is sized for a GPU, and this torch sees none (torch.cuda.is_available() is "
        f"False).{how_long or ' On a CPU it would take days to weeks.'} Only {', '.join(CPU_DATASETS)} (and "
        f"your own datasets) train on a CPU by default. Install a CUDA build of torch (docs/scaling-out.md), "
        f"or set {ALLOW_CPU_VAR}=1 to train on the CPU anyway.")


def run_stage(main) -> None:
    """Run a stage's main(). Under DVC (DVC_STAGE set), skip the interpreter's teardown once
    every output is written: finalizing torch + timm + dvclive costs ~1.5 s per stage process.
    atexit handlers still run; errors exit as usual."""
    refuse_removed_setting()
    try:
        main()
    except StructinitError as e:      # bad input, damaged file, diverged run: the message says it all
        sys.exit(f"error: {e}")
    if os.environ.get("DVC_STAGE"):
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def add_variant_options(parser) -> None:
    """--options, last on a grid.variants cell's command line: its options as DVC renders them
    (--alpha 0.5 ...). They are there so that DVC re-runs the cell when they change; the
    options used are params.yaml's (grid.variants), the one source."""
    parser.add_argument("--options", nargs=argparse.REMAINDER, default=[],
                        help="a grid.variants cell's options as DVC renders them (--alpha 0.5 ...), last")


def write_json(path: str | Path, obj) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n"))


def write_record(path: str | Path, record: dict) -> None:
    """A JSON record that is a DVC output: the same bytes on every run, so its timings (keys
    ending in "seconds") go to log_timings instead."""
    write_json(path, without_timings(record))


def seconds_since_start() -> float | None:
    """Wall seconds since this process started, the interpreter's start and every import
    included (Linux: /proc/self/stat's start time against the boot clock, 10 ms ticks); None
    where that is not readable."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def log_timings(output: str | Path, timings: dict) -> None:
    """Wall-clock figures of the run that wrote `output`, at logs/timings/<output>.json: not a
    DVC output (they differ on every run) and not in git; `python -m benchmarks.timings`
    collects them."""
    output = Path(output)
    if output.is_absolute():                   # keep the log under logs/timings, never beside
        try:                                   # the output (inside a DVC output folder)
            output = output.relative_to(Path.cwd())
        except ValueError:
            output = output.relative_to(output.anchor)
    write_json(TIMINGS_DIR / output.with_suffix(".json"), timings)


def write_text(path: str | Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text))


def conclusions_path(report_path: str | Path) -> Path:
    """reports/<name>.md -> reports/conclusions/<name>.json: the report's verdicts as data."""
    report_path = Path(report_path)
    return report_path.parent / "conclusions" / f"{report_path.stem}.json"


def write_conclusions(report_path: str | Path, record: dict) -> None:
    """record: structinit.reporting.stats.conclusions_record of what the report concluded."""
    write_json(conclusions_path(report_path), record)
