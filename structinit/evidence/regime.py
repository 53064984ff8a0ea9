"""The regime study (beyond the paper; off the default), as evidence: the frozen stage regime
(stages/regime.py: results/evidence/regime/) runs the study's own DVC stages (study_regime*,
analyze_regime*, regime_report) in a scratch copy of the repository on top of the main grid's
cells, and keeps its report (headed by the commit it ran at, the commit that fixed its primary
contrast in params.yaml and the machine), figure, each run's small outputs, runs.csv (one row
per arm and seed: every number the report shows) and conclusions.json.

This module holds what the stage computes from the run: the plan check (only the study's own
stages may run), the header and the primary's one line.
"""
import re
import subprocess
from pathlib import Path

STAGE = re.compile(r"Running stage '([^']+)'")
FAILED_STAGE = re.compile(r"failed to reproduce '([^']+)'")
OWN_STAGES = ("check_params", "study_regime", "analyze_regime", "regime_report")   # check_params: params.yaml changed
OUTPUTS = ("results", "models", "artifacts", "data/prepared", "reports")   # the main grid, up to date


def other_stages(plan_output: str, returncode: int) -> list[str]:
    """What `dvc repro --dry --allow-missing regime_report` would run besides the study's own
    stages (the main grid is then not up to date with this code). A dry run stops at the first
    stage whose inputs an earlier stage would write (an analysis of cells not trained yet): that
    is one of the study's own, and every main-grid stage upstream of it has been judged by
    then; where it stops at a main-grid stage (a stale download leaves the data a cell reads
    unwritten), that stage would run too. RuntimeError when the dry run failed otherwise."""
    failed = FAILED_STAGE.search(plan_output)
    if returncode and not failed:
        raise RuntimeError(f"dvc repro --dry regime_report failed in the copy:\n{plan_output[-4000:]}")
    planned = STAGE.findall(plan_output) + ([failed[1]] if failed else [])
    return [s for s in dict.fromkeys(planned) if not s.startswith(OWN_STAGES)]


def stale_main_grid(plan_output: str, returncode: int) -> str | None:
    """Why the study cannot run on this workspace's main grid (None when it can): the main-grid
    stages DVC would run first, and where its dry run stopped at one, DVC's own error line, so
    the cause is not lost."""
    other = other_stages(plan_output, returncode)
    if not other:
        return None
    errors = [line.strip() for line in plan_output.splitlines() if line.lstrip().startswith("ERROR")]
    return (f"the regime study reuses the main grid's cells, but here DVC would first run {other}: the main "
            "grid is not up to date with this code; run it first (./run.sh repro)"
            + (f"\nDVC's dry run stopped at a main-grid stage: {errors[-1]}" if errors else ""))


def fixed_at(params: dict, repo: Path) -> str:
    """Since which commit params.yaml has held this primary contrast (git's record, so that
    "fixed before the results" is checked, not asserted)."""
    line = f"primary: {params['studies']['regime']['contrasts']['primary']}"
    found = subprocess.run(["git", "log", "--reverse", "--format=%h %cs", "-S", line, "--", "params.yaml"],
                           cwd=repo, capture_output=True, text=True).stdout.split("\n")[0].strip()
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
