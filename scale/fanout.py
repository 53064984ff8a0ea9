"""Many cells at once: run every stale training cell concurrently on Ray, then record them with DVC.

Why: `dvc repro` runs one stage at a time (it has no --jobs, iterative/dvc#755), and two
`dvc repro`s in one workspace fight over dvc.lock. The grid's cells are independent of one
another, so this command:

1. brings the cells' upstream stages (download, preoptimize, ...: cheap) up to date with one
   plain, serial `dvc repro`;
2. asks DVC's Python API which selected cells are stale (`Repo.status`) and what they run;
3. runs each stale cell's command as one Ray task: Ray decides where and when, and pins the
   cell to its GPUs (CUDA_VISIBLE_DEVICES); output goes to logs/fanout/<cell>.log;
4. records the cells that succeeded with one `dvc commit -f`, so the next `dvc repro` skips
   every one of them and only aggregates and reports.

A failed cell is reported with its log; the others finish and are committed, and the command
exits 1, so running it again retries only the failed cells.

    python -m scale.fanout --dry-run                # what would run, and the commands
    python -m scale.fanout                          # this machine (starts a local Ray)
    python -m scale.fanout --gpus-per-cell 0.25     # four small cells share each GPU
    python -m scale.fanout --address auto           # a cluster started with `ray start`

On a cluster every Ray node must see this repository at the same path (a shared filesystem)
and have the project's environment installed: a cell runs with the Python of the Ray worker
that runs it. Do not run `dvc repro` or `dvc commit` in this workspace while it runs.
"""
from __future__ import annotations

import argparse
import fnmatch
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import networkx as nx  # DVC's own dependency: its pipeline graph is a networkx DiGraph

DEFAULT_STAGES = ("train_*", "study_*")
LOG_DIR = Path("logs/fanout")
# Variables a cell receives from the shell that launched the fan-out: a Ray worker's own
# environment is whatever its node was started with, not the user's shell.
FORWARDED_PREFIXES = ("STRUCTINIT_", "DVC_", "DVCLIVE_")
USER_OMP_VAR = "STRUCTINIT_USER_OMP_NUM_THREADS"   # the launching shell's OMP_NUM_THREADS ("" = unset)
NPROC_VAR = "STRUCTINIT_NPROC"        # processes of one cell's DDP run; the training stage reads it
# DVC runs a stage's cmd with the user's $SHELL minus its rc files (dvc/stage/run.py): so do we,
# so that a cmd means the same thing under `dvc repro` and here.
SHELL_NO_RC_FLAGS = {"bash": ["--noprofile", "--norc"], "zsh": ["--no-rcs"]}


class FanoutError(Exception):
    """A problem found before any cell ran: the message says what to change."""


@dataclass(frozen=True)
class Cell:
    """One stale stage to run: what DVC would run for it, and where."""
    address: str                 # DVC's name for it: train_impulse@digits-3
    commands: tuple[str, ...]    # stage.cmd (DVC allows a list: run in order, stop at a failure)
    wdir: str                    # the stage's working directory, absolute
    log: str                     # relative to the repository root
    depends_on: tuple[str, ...]  # other stale cells it reads (Ray starts it after them)


class CellResult(NamedTuple):
    """What a cell's Ray task reports back."""
    address: str
    returncode: int | None       # None: the command never ran (see error)
    seconds: float
    log: str
    node: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


# --- arguments ------------------------------------------------------------------------------

RESOURCE_RULE = ("use 0, a fraction up to 1 (e.g. 0.25: four cells share one) or a whole number "
                 "(Ray accepts fractions only below 1)")


def resource_amount(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: {RESOURCE_RULE}") from None
    if not math.isfinite(value) or value < 0 or (value > 1 and not value.is_integer()):
        raise argparse.ArgumentTypeError(f"{text}: {RESOURCE_RULE}")
    return value


def process_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: use a whole number of processes, 1 or more")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m scale.fanout",
        description="Run every stale training cell at once on Ray, then record them in dvc.lock "
                    "(dvc commit -f), so that `dvc repro` only aggregates.")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the upstream stages and the stale cells with their commands; run nothing")
    ap.add_argument("--stages", nargs="+", default=list(DEFAULT_STAGES), metavar="GLOB",
                    help="which stages are cells, as globs over stage names (default: %(default)s)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster to use: 'auto' for one started with `ray start --head`, or "
                         "host:port; default: RAY_ADDRESS, else a local cluster already running, "
                         "else a new local one")
    ap.add_argument("--gpus-per-cell", type=resource_amount, default=None, metavar="G",
                    help="GPUs each cell reserves, e.g. 1 or 0.25 (default: 1, or the --nproc-per-cell "
                         "count, when the cluster has GPUs; else 0)")
    ap.add_argument("--cpus-per-cell", type=resource_amount, default=1.0, metavar="C",
                    help="CPUs each cell reserves (default: %(default)s)")
    ap.add_argument("--nproc-per-cell", type=process_count, default=None, metavar="N",
                    help=f"run each cell as N DDP processes (sets {NPROC_VAR}=N for the stage); "
                         "each cell then reserves N GPUs on one node")
    ap.add_argument("--then-repro", action="store_true",
                    help="after committing, run `dvc repro` (aggregates and reports) if every cell succeeded")
    a = ap.parse_args(argv)
    if a.nproc_per_cell and a.gpus_per_cell not in (None, 0, a.nproc_per_cell):
        ap.error(f"--nproc-per-cell {a.nproc_per_cell} runs one process per GPU: --gpus-per-cell must be "
                 f"{a.nproc_per_cell} (or 0 for processes on CPU), got {a.gpus_per_cell:g}")
    if a.cpus_per_cell == 0 and a.gpus_per_cell == 0:
        ap.error("--cpus-per-cell 0 with --gpus-per-cell 0 reserves nothing, so Ray would start every "
                 "cell at once: give at least one of them a value above 0")
    return a


# --- what to run (DVC) ----------------------------------------------------------------------

def log_path(address: str) -> str:
    """logs/fanout/<address>.log, with characters a file name should not carry replaced."""
    return str(LOG_DIR / (re.sub(r"[^\w.-]", "_", address) + ".log"))


def select_stages(repo, patterns) -> list:
    """The stages whose address matches one of the globs; every glob must match something."""
    stages = [s for s in repo.index.stages if s.cmd and not s.frozen]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(s.addressing, pattern) for s in stages):
            groups = sorted({s.addressing.split("@")[0] for s in stages})
            raise FanoutError(f"--stages {pattern!r} matches no stage; the stages are "
                              f"{', '.join(groups)} (a matrix stage's cells are <name>@<key>)")
    return [s for s in stages if any(fnmatch.fnmatchcase(s.addressing, p) for p in patterns)]


def upstream_of(repo, cells) -> set:
    """Every stage the cells need that is not a cell itself. DVC's graph points from a stage
    to the stages it depends on, so that is everything reachable from the cells."""
    graph, cell_set = repo.index.graph, set(cells)
    upstream = set().union(*(nx.descendants(graph, c) for c in cells)) - cell_set
    for stage in upstream:          # a stage between two cells cannot run before all the cells
        inner = cell_set & nx.descendants(graph, stage)
        if inner:
            raise FanoutError(
                f"stage {stage.addressing} depends on {min(c.addressing for c in inner)} and "
                f"another selected stage depends on it: add it to --stages, or run the fan-out "
                f"once for each side")
    return upstream


def stale_addresses(repo, stages) -> set[str]:
    if not stages:
        return set()
    return set(repo.status(targets=[s.addressing for s in stages]))


def direct_upstream(repo, cells, upstream) -> list[str]:
    """The upstream stages the cells read directly: `dvc repro` of these brings the whole
    upstream up to date (each target with its own upstream, stale ones only, in order)."""
    graph = repo.index.graph
    return sorted({s.addressing for c in cells for s in graph.successors(c) if s in upstream})


def make_cells(repo, stages, root: Path) -> list[Cell]:
    """The stale stages as Cells, a cell after every stale cell it depends on."""
    graph = repo.index.graph
    chosen = set(stages)
    # edges point at dependencies: on the reversed graph a topological order lists a cell after
    # the cells it reads; by name otherwise, so that listings are stable
    order = nx.lexicographical_topological_sort(graph.subgraph(chosen).reverse(), key=lambda s: s.addressing)
    cells = []
    for stage in order:
        commands = stage.cmd if isinstance(stage.cmd, list) else [stage.cmd]
        needs = sorted(s.addressing for s in nx.descendants(graph, stage) if s in chosen)
        cells.append(Cell(stage.addressing, tuple(commands), str(Path(stage.wdir).resolve()),
                          log_path(stage.addressing), tuple(needs)))
    assert {c.address for c in cells} == {s.addressing for s in stages}
    return cells


def dvc(root: Path, *args: str) -> int:
    """A DVC command, by the DVC this Python has (the one whose API chose the cells)."""
    print("$ dvc " + " ".join(args), flush=True)
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, check=False).returncode


# --- running (Ray) --------------------------------------------------------------------------

def run_cell(root: str, cell: Cell, env: dict[str, str], gpus: float, *upstream: CellResult) -> CellResult:
    """One cell, on whichever Ray node the task landed: its commands as DVC would run them,
    output to its log. Never raises for a failing cell: the result says what happened."""
    node = socket.gethostname()
    if not os.path.isdir(root):
        return CellResult(cell.address, None, 0.0, cell.log, node,
                          f"the repository {root} is not visible on Ray node {node}: every node must "
                          f"see it at the same path (a shared filesystem)")
    failed = [r.address for r in upstream if not r.ok]
    if failed:
        return CellResult(cell.address, None, 0.0, cell.log, node,
                          f"not run: it needs {', '.join(failed)}, which failed")
    cell_env = dict(os.environ)
    cell_env.update(env)
    # Ray sets OMP_NUM_THREADS to a task's reserved CPUs. A cell's bytes depend on torch's
    # thread count, so the cell gets what the launching shell had (unset: the node's default),
    # as `dvc repro` there would (docs/reproducibility.md).
    user_omp = cell_env.pop(USER_OMP_VAR, "")
    cell_env.pop("OMP_NUM_THREADS", None)
    if user_omp:
        cell_env["OMP_NUM_THREADS"] = user_omp
    # `python` and `dvc` in a cmd: the environment this worker runs in, as `dvc repro` under
    # ./run.sh would find them in .venv/bin
    cell_env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + cell_env.get("PATH", "")
    cell_env.update(DVC_ROOT=root, DVC_STAGE=cell.address,   # what `dvc repro` tells a stage
                    PYTHONUNBUFFERED="1")                    # the log shows progress as it happens
    if gpus == 0:
        # a cell that reserved no GPU must not use one that Ray gave to another cell (Ray
        # leaves CUDA_VISIBLE_DEVICES alone for tasks without GPUs)
        cell_env["CUDA_VISIBLE_DEVICES"] = ""
    log = Path(root) / cell.log
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    returncode = 0
    with open(log, "w") as out:
        out.write(f"# {cell.address} on {node}, CUDA_VISIBLE_DEVICES="
                  f"{cell_env.get('CUDA_VISIBLE_DEVICES', '(unset)')}, started {time.time():.3f}\n")
        try:
            for command in cell.commands:
                out.write(f"> {command}\n")
                out.flush()
                returncode = run_shell(command, cell.wdir, cell_env, out)
                if returncode:
                    break
        except KeyboardInterrupt:        # ray.cancel: run_shell has stopped the command
            out.write(f"# cancelled after {time.monotonic() - start:.1f} s, ended {time.time():.3f}\n")
            raise
        out.write(f"# exit {returncode} after {time.monotonic() - start:.1f} s, ended {time.time():.3f}\n")
    return CellResult(cell.address, returncode, time.monotonic() - start, cell.log, node)


def run_shell(command: str, cwd: str, env: dict[str, str], out) -> int:
    shell = os.environ.get("SHELL") or "/bin/sh"
    argv = [shell, *SHELL_NO_RC_FLAGS.get(os.path.basename(shell), []), "-c", command]
    # its own session: a cancelled cell (Ctrl-C on the driver) stops with everything it started
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        while True:       # short waits: Ray delivers a cancel as an exception between two of them
            try:
                return proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                continue
    finally:
        if proc.poll() is None:
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
                out.write(f"# stopping it: {sig.name}\n")
                out.flush()
                os.killpg(proc.pid, sig)
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue


def forwarded_env(nproc: int | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
    env[USER_OMP_VAR] = os.environ.get("OMP_NUM_THREADS", "")     # what the user's shell set, if anything
    if nproc:
        env[NPROC_VAR] = str(nproc)
    return env


def check_feasible(ray, cpus: float, gpus: float) -> None:
    """Ray waits forever for a task no node can hold: refuse it up front instead."""
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if not any(r.get("CPU", 0) >= cpus and r.get("GPU", 0) >= gpus for r in nodes):
        sizes = ", ".join(f"{r.get('CPU', 0):g} CPU/{r.get('GPU', 0):g} GPU" for r in nodes)
        raise FanoutError(f"a cell reserves {cpus:g} CPU and {gpus:g} GPU, but no Ray node has that "
                          f"much (nodes: {sizes}): lower --cpus-per-cell / --gpus-per-cell, or add a node")


def connect(ray, a: argparse.Namespace) -> float:
    """Join (or start) the Ray cluster; the GPUs each cell reserves, checked against its nodes."""
    try:
        ray.init(address=a.address)
    except ConnectionError as e:
        raise FanoutError(f"no Ray cluster at --address {a.address}: {e}. Start one with `ray start --head`, "
                          f"or leave --address out to start a local one") from None
    has_gpus = ray.cluster_resources().get("GPU", 0) > 0
    gpus = a.gpus_per_cell if a.gpus_per_cell is not None else (a.nproc_per_cell or 1) if has_gpus else 0
    if a.cpus_per_cell == 0 and gpus == 0:
        raise FanoutError("--cpus-per-cell 0 on a cluster without GPUs reserves nothing, so Ray would "
                          "start every cell at once: give --cpus-per-cell a value above 0")
    check_feasible(ray, a.cpus_per_cell, gpus)
    return gpus


def submit(ray, cells: list[Cell], root: Path, a: argparse.Namespace, gpus: float) -> dict:
    """One Ray task per cell; a cell that reads another stale cell gets that cell's result as an
    argument, so Ray starts it only once that one has finished. Returns {ref: cell}."""
    print(f"Ray at {ray.get_runtime_context().gcs_address}: {len(cells)} cell(s), each reserving "
          f"{a.cpus_per_cell:g} CPU and {gpus:g} GPU", flush=True)
    task = ray.remote(run_cell).options(num_cpus=a.cpus_per_cell, num_gpus=gpus)
    env, refs, cell_of = forwarded_env(a.nproc_per_cell), {}, {}
    for cell in cells:                # make_cells lists a cell after the cells it reads
        ref = task.remote(str(root), cell, env, gpus, *(refs[d] for d in cell.depends_on))
        refs[cell.address], cell_of[ref] = ref, cell
    return cell_of


def collect(ray, cell_of: dict) -> tuple[list[CellResult], bool]:
    """Each cell's result as it finishes, one progress line each; Ctrl-C cancels the rest.
    Returns the results and whether it was interrupted."""
    pending, results = list(cell_of), []
    try:
        while pending:
            # a timeout: while Ray blocks in its own code, Python does not see Ctrl-C
            done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
            for ref in done:
                results.append(result_of(ray, ref, cell_of[ref]))
                report(results[-1], len(results), len(cell_of))
    except KeyboardInterrupt:
        print(f"\ninterrupted: cancelling {len(pending)} cell(s) not finished", flush=True)
        for ref in pending:
            ray.cancel(ref)
        for ref in pending:
            results.append(result_of(ray, ref, cell_of[ref]))
        return results, True
    return results, False


def result_of(ray, ref, cell: Cell) -> CellResult:
    try:
        return ray.get(ref)
    except ray.exceptions.TaskCancelledError:
        return CellResult(cell.address, None, 0.0, cell.log, "?", "cancelled")
    except ray.exceptions.RayError as e:           # its worker or node was lost, say
        last_line = (str(e).strip().splitlines() or [""])[-1]
        return CellResult(cell.address, None, 0.0, cell.log, "?", f"{type(e).__name__}: {last_line}")


def report(r: CellResult, i: int, n: int) -> None:
    status = "ok" if r.ok else "FAILED"
    why = r.error or (f"exit {r.returncode}" if not r.ok else "")
    print(f"[{i}/{n}] {status:<6} {r.address}  {r.seconds:.1f} s on {r.node}  "
          f"log {r.log}{'  ' + why if why else ''}", flush=True)


# --- the command ----------------------------------------------------------------------------

def plan(root: Path, patterns, dry_run: bool) -> list[Cell]:
    """Bring the upstream stages up to date (unless dry_run), then the stale cells."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        candidates = select_stages(repo, patterns)
        upstream = upstream_of(repo, candidates)
        stale_upstream = stale_addresses(repo, upstream)
        targets = direct_upstream(repo, candidates, upstream)
        if dry_run:
            graph = repo.index.graph
            # a cell whose upstream is stale will be too once the upstream has run
            waiting = {c for c in candidates
                       if any(s.addressing in stale_upstream for s in nx.descendants(graph, c))}
            stale = stale_addresses(repo, candidates) | {c.addressing for c in waiting}
            cells = make_cells(repo, [c for c in candidates if c.addressing in stale], root)
            if stale_upstream:
                print(f"First, serially: dvc repro {' '.join(targets)}\n  (stale upstream: "
                      f"{', '.join(sorted(stale_upstream))})")
            return cells
    if stale_upstream:
        print(f"Upstream stages first ({len(stale_upstream)} stale), serially with DVC:", flush=True)
        if dvc(root, "repro", *targets):
            raise FanoutError(f"dvc repro of the upstream stages failed (above); no cell ran. Fix it "
                              f"and run this again, or see: dvc repro {' '.join(targets)}")
    with Repo(str(root)) as repo:          # re-read: the upstream outputs may have changed
        candidates = select_stages(repo, patterns)
        stale_now = stale_addresses(repo, candidates)
        stale = [c for c in candidates if c.addressing in stale_now]
        return make_cells(repo, stale, root)


def remove_outputs(root: Path, cells: list[Cell]) -> None:
    """What `dvc repro` does before it runs a stage: its old outputs go (persistent ones stay),
    so that nothing stale survives into the new ones (a seed dropped from the grid, say)."""
    from dvc.repo import Repo

    addresses = {c.address for c in cells}
    with Repo(str(root)) as repo, repo.lock:
        for stage in repo.index.stages:
            if stage.addressing in addresses:
                stage.remove_outs(ignore_remove=False, force=False)
    for cell in cells:                  # nor an earlier run's log: it would pass for this run's
        (root / cell.log).unlink(missing_ok=True)


def fan_out(root: Path, a: argparse.Namespace) -> int:
    patterns = a.stages
    cells = plan(root, patterns, a.dry_run)
    if not cells:
        print(f"Every stage matching {' '.join(patterns)} is up to date: nothing to run.")
        return dvc(root, "repro") if a.then_repro and not a.dry_run else 0
    if a.dry_run:
        print(f"{len(cells)} stale cell(s) would run on Ray, then be committed:")
        for cell in cells:
            after = f"   (after {', '.join(cell.depends_on)})" if cell.depends_on else ""
            print(f"  {cell.address}{after}\n" + "".join(f"      {c}\n" for c in cell.commands), end="")
        return 0
    import ray

    try:
        gpus = connect(ray, a)
        remove_outputs(root, cells)
        results, interrupted = collect(ray, submit(ray, cells, root, a, gpus))
    finally:
        ray.shutdown()
    succeeded = [r.address for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    committed = True
    if succeeded:
        print(f"Recording the {len(succeeded)} cell(s) that succeeded:", flush=True)
        committed = dvc(root, "commit", "-f", *succeeded) == 0
        if not committed:
            print("error: dvc commit failed (above): the cells ran, but dvc.lock does not record them",
                  file=sys.stderr)
    if failed:
        print(f"\n{len(failed)} cell(s) failed, not committed (run this again to retry only them):",
              file=sys.stderr)
        for r in failed:
            log = f"log {r.log}" if (root / r.log).exists() else "no log: it never started"
            print(f"  {r.address}: {r.error or f'exit {r.returncode}'}; {log}", file=sys.stderr)
    if interrupted:
        return 130                      # the shell's code for "stopped by Ctrl-C"
    if failed or not committed:
        return 1
    if a.then_repro:
        return dvc(root, "repro")
    print("\nNext: dvc repro   (every committed cell is skipped; it aggregates and reports)")
    return 0


def main(argv=None) -> None:
    a = parse_args(argv)
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        root = Path(Repo.find_root()).resolve()
    except NotDvcRepoError:
        sys.exit(f"error: {Path.cwd()} is not inside a DVC repository: run this from the project")
    try:
        sys.exit(fan_out(root, a))
    except FanoutError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    # through the importable module, not __main__: Ray workers then load run_cell by name
    from scale.fanout import main as _main

    _main()
