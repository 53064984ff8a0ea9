"""The one way to run the pipeline in a scratch copy of this repository.

A command that must run `dvc repro` without touching this checkout's results and reports (the
quick look, tools/quick.py; the fresh-clone timing, benchmarks/fresh_repro.py; a run on other
seeds or params) makes its copy here, runs DVC there with this environment's Python first on
PATH, and deletes the copy after:

    from structinit.pipeline import scratch

    with scratch.Scratch("quick", keep=False) as s:        # a temporary folder; s.repo is the copy
        scratch.copy_working_tree(s.repo)                   # code and params, none of the outputs
        (s.repo / "params.yaml").write_text(...)            # what this run changes
        scratch.commit(s.repo)                              # dvclive records a base commit
        code = scratch.run_dvc(s.repo, "repro", "aggregate", on_line=print, log=s.root / "dvc.log")
        if code:
            s.keep = True                                   # keep a failed run's copy to read

or, for what a user gets from a clone (committed HEAD, no DVC cache): `head = clone_head(s.repo)`.
Every call that runs something in the copy takes its environment from `pipeline_env(copy)`.
tools/ never imports benchmarks/; a benchmark may import this.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# what the pipeline writes, by first path component: a copy without them is as if nothing had run
OUTPUTS = ("results", "reports", "dvc.lock", "artifacts", "models", "data", "logs")
# but the frozen stages' committed outputs are inputs: `dvc repro` fails on a frozen stage whose
# outputs are missing, and a copy cannot remake them in hours (structinit/evidence), nor a GPU's
# analyses without its weights (results/analysis_gpu)
FROZEN_OUTPUTS = ("results/evidence/", "results/analysis_gpu/")


class Scratch:
    """A temporary folder (`root`) for one run, the copy at `root / "repo"` (`repo`), removed on
    exit unless `keep` (which a caller may set on the way, e.g. after a failure); a kept folder's
    path is printed."""

    def __init__(self, who: str = "scratch", keep: bool = False):
        self.who, self.keep = who, keep

    def __enter__(self) -> Scratch:
        self.root = Path(tempfile.mkdtemp(prefix=f"structinit-{self.who}-"))
        self.repo = self.root / "repo"
        return self

    def __exit__(self, *exc) -> bool:
        if self.keep:
            print(f"kept {self.root}", flush=True)
        else:
            shutil.rmtree(self.root, ignore_errors=True)
        return False


def working_tree_files(root: Path = REPO) -> list[str]:
    """The working tree's files as git sees them: tracked, and untracked but not ignored."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    return [f for f in out.split("\n") if f]


def _frozen_stages(root: Path) -> dict[str, dict]:
    import yaml

    path = root / "dvc.yaml"
    stages = yaml.safe_load(path.read_text()).get("stages", {}) if path.exists() else {}
    return {name: stage for name, stage in stages.items() if stage.get("frozen")}


def _frozen_lock_entries(root: Path) -> dict[str, dict]:
    """dvc.lock's entries of the frozen stages: a plain stage's by its name, a matrix or foreach
    stage's (the GPU datasets' train_gpu_*) by <name>@<key>."""
    import yaml

    frozen, lock = _frozen_stages(root), root / "dvc.lock"
    if not frozen or not lock.exists():
        return {}
    entries = (yaml.safe_load(lock.read_text()) or {}).get("stages", {})
    return {name: entry for name, entry in entries.items() if name.split("@")[0] in frozen}


def frozen_outputs(root: Path = REPO, entries: dict | None = None) -> list[str]:
    """The outputs of dvc.yaml's frozen stages: committed results that DVC never remakes (the
    costly evidence, a GPU dataset's cells), which stages downstream read, so even a copy as if
    nothing had run needs them. A templated stage's come from its dvc.lock entries (`entries`:
    _frozen_lock_entries(root), when the caller has read them)."""
    outs = [next(iter(o)) if isinstance(o, dict) else o
            for stage in _frozen_stages(root).values() for o in stage.get("outs", [])]
    entries = _frozen_lock_entries(root) if entries is None else entries
    locked = [o["path"] for entry in entries.values() for o in entry.get("outs", [])]
    return list(dict.fromkeys([o for o in outs if "${" not in o] + locked))


def _frozen_lock(root: Path, dest: Path, stages: dict) -> None:
    """dest/dvc.lock with the frozen stages' entries of root's alone (`stages`:
    _frozen_lock_entries(root)): DVC then takes their committed outputs as they are (a frozen
    stage without a lock entry would be verified, and its inputs, the main grid's cells, do not
    exist yet in a copy as if nothing had run)."""
    import yaml

    if (dest / "dvc.lock").exists():
        return
    if stages:
        schema = (yaml.safe_load((root / "dvc.lock").read_text()) or {}).get("schema", "2.0")
        (dest / "dvc.lock").write_text(yaml.safe_dump({"schema": schema, "stages": stages}, sort_keys=False))


def copy_working_tree(dest: Path, root: Path = REPO, skip: Iterable[str] = OUTPUTS,
                      with_outputs: Iterable[str] = (), frozen: bool = True) -> Path:
    """Copy the working tree of `root` (working_tree_files) to `dest`, but the files whose first
    path component is in `skip` (default: every output, as if nothing had run); then the paths
    in `with_outputs` (folders or files, relative to root; e.g. "data/prepared", or "dvc.lock"
    and "results" for a copy in which the main grid is up to date), where they exist; and
    (`frozen`) the frozen stages' outputs (frozen_outputs) with their dvc.lock entries, which
    DVC never remakes. Returns dest."""
    skip = set(skip)
    entries = _frozen_lock_entries(root) if frozen else {}      # dvc.lock read once
    with_outputs = [*with_outputs, *(frozen_outputs(root, entries) if frozen else ())]
    for f in working_tree_files(root):
        if (f.split("/")[0] in skip and not f.startswith(FROZEN_OUTPUTS)) or not (root / f).is_file():
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, dest / f)
    for path in with_outputs:
        source = root / path
        if source.is_dir():
            shutil.copytree(source, dest / path, dirs_exist_ok=True)
        elif source.is_file():
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / path)
    if frozen:
        _frozen_lock(root, dest, entries)
    return dest


def evidence_frozen(dest: Path, root: Path = REPO) -> None:
    """Put back, in a copy made while an evidence stage runs in `root` (`dvc unfreeze <stage> &&
    dvc repro -f -s <stage>`: its dvc.yaml entry unfrozen there, its outputs removed by DVC), what
    the copy's own `dvc repro` needs: dvc.yaml as root's HEAD commits it (every evidence
    stage frozen) and the frozen stages' committed outputs (root's HEAD) where the copy lacks
    them. Without it the copy's `dvc repro aggregate` ran the unfrozen stage again, inside itself
    (the replication stage did, and failed, an hour in)."""
    (dest / "dvc.yaml").write_bytes(subprocess.run(["git", "-C", str(root), "show", "HEAD:dvc.yaml"],
                                                   capture_output=True, check=True).stdout)
    for path in frozen_outputs(dest):
        if not (dest / path).exists():
            archive = subprocess.run(["git", "-C", str(root), "archive", "HEAD", "--", path], capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def clone_head(dest: Path, root: Path = REPO) -> str:
    """Clone the committed HEAD of `root` into `dest` (what a user gets: no DVC cache, nothing
    run; uncommitted changes are not in it). Returns HEAD's short commit."""
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", str(root), str(dest)], check=True)
    return head


def pipeline_env(copy: Path, who: str = "scratch", **extra: str) -> dict[str, str]:
    """The environment DVC and the stages run with in `copy`: this process's, with this
    Python's folder first on PATH (the project's environment: its dvc and python), DVC's
    analytics off, training checkpoints inside the copy, and a git identity (`who`) for the
    copy's commit; then `extra`."""
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                DVC_NO_ANALYTICS="1", STRUCTINIT_CKPT_DIR=str(Path(copy) / ".ckpt"),
                GIT_AUTHOR_NAME=who, GIT_AUTHOR_EMAIL=f"{who}@localhost",
                GIT_COMMITTER_NAME=who, GIT_COMMITTER_EMAIL=f"{who}@localhost", **extra)


def commit(copy: Path, message: str = "scratch copy", env: dict | None = None) -> None:
    """Make the copy a git repository with one commit of everything in it (dvclive records the
    experiment's base commit, and DVC wants a git repository)."""
    env = env or pipeline_env(copy)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", message]):
        subprocess.run(cmd, cwd=copy, env=env, check=True, stdout=subprocess.DEVNULL)


TIMED_OUT = 124             # run_dvc's status when its timeout ended it (as timeout(1)'s)


def run_dvc(copy: Path, *args: str, env: dict | None = None, on_line: Callable[[str], object] | None = None,
            log: Path | None = None, timeout: float | None = None) -> int:
    """Run `dvc *args` in `copy` (env: pipeline_env(copy) by default), its output (stdout and
    stderr, one stream) handed line by line to `on_line` as it comes and written to `log`;
    returns its exit status. timeout: seconds after which dvc and every process it started (a
    process group of their own) are ended (SIGTERM, SIGKILL 10 s later); the status is then
    TIMED_OUT."""
    env = env or pipeline_env(copy)
    out = open(log, "w") if log is not None else None
    ended = []

    def end(proc, sig):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
            ended.append(sig)

    timers = []
    try:
        with subprocess.Popen(["dvc", *args], cwd=copy, env=env, text=True, bufsize=1, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=timeout is not None) as proc:
            if timeout is not None:
                timers = [threading.Timer(max(timeout, 0), end, (proc, signal.SIGTERM)),
                          threading.Timer(max(timeout, 0) + 10, end, (proc, signal.SIGKILL))]
                for t in timers:
                    t.daemon = True
                    t.start()
            for line in proc.stdout:
                if out is not None:
                    out.write(line)
                if on_line is not None:
                    on_line(line)
    finally:
        for t in timers:
            t.cancel()
        if out is not None:
            out.close()
    return TIMED_OUT if ended else proc.returncode
