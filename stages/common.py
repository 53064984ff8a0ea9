"""What every stage script shares: reading params.yaml, atomic writes, timing logs, and the
pipeline's process policy (what the library itself never does: exits, environment checks).

Cell names and which cells params.yaml asks for: structinit/pipeline/cells.py.

Stages stay thin: parse arguments and params, call structinit, write outputs.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
from pathlib import Path

import yaml

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


def load_params(path: str | Path = "params.yaml") -> dict:
    """params.yaml as it is. The check_params stage, upstream of every stage, has checked it
    against its schema (structinit/pipeline/params.py): a stage never imports the schema, so
    editing a schema rule re-runs nothing but that check."""
    return yaml.safe_load(Path(path).read_text())


def recipe(params: dict, dataset: str) -> dict:
    recipes = params["recipes"]
    if dataset not in recipes:
        raise SystemExit(f"no recipe for dataset {dataset!r} in params.yaml (recipes: {sorted(recipes)})")
    return recipes[dataset]


def seeds_at(params: dict, dotted: str) -> list[int]:
    """The seed list at a dotted key of params.yaml, e.g. "grid.seeds" (a stage's --seeds-from)."""
    node = params
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise SystemExit(f"--seeds-from {dotted}: params.yaml has no key {key!r} there")
        node = node[key]
    if (not isinstance(node, list) or not node
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in node)):
        raise SystemExit(f"{dotted}={node!r}: expected a non-empty list of integer seeds")
    if len(set(node)) != len(node):
        raise SystemExit(f"{dotted}={node!r}: a seed is listed twice")
    return node


def write_json(path: str | Path, obj) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n"))


def write_record(path: str | Path, record: dict) -> None:
    """A JSON record that is a DVC output: the same bytes on every run, so its timings (keys
    ending in "seconds") go to log_timings instead."""
    write_json(path, without_timings(record))


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
