"""The GPU window: one unattended command on a lent GPU machine, and the two commands around it here.

    python -m benchmarks.gpu_session --pack                      # here: build what to send; prints its size
    python3 -m benchmarks.gpu_session --limit 570 --out "$OUT"   # there, in the repository root
    python -m benchmarks.gpu_session --adopt DIR                 # here: what came back, into place to commit
    python -m benchmarks.gpu_session --tiny --limit 240 --out DIR   # the whole run at toy sizes on a CPU

The run, in order, ending itself MARGIN s before --limit (each step gets what is left):
0. set-up from .cache/gpu_window/ (what --pack built; carry that one folder): its wheels into
   /tmp/site, its shallow git as .git where the copy has none, its four .gz into
   datasets/fashion_mnist/, and a `python` on PATH (every stage's command calls it);
1. (a) the CUDA-only tests (CUDA_TESTS), among them the CUDA graph's check: the captured step
   against the uncaptured one, 240 steps of the Fashion-MNIST recipe, every loss within float
   noise (tests/test_step_graph.py::test_on_cuda_the_replayed_step_trains_as_the_eager_one);
2. (b) what the repository's state calls for next. While the recipe is provisional (its budget
   not measured at B and 2B for every arm), the budget: `python -m tools.fashion_mnist --budget`,
   the primary pair first, each arm at B then 2B, resuming from the committed
   results/evidence/fashion_mnist_budget/epochs.csv, and not starting a run it cannot finish.
   Once measured, the grid's cells come next: not built yet (the run says so and stops).

It writes into --out as it goes, so a run cut short keeps what finished: session.log (all of it),
cuda_tests.txt, epochs.csv and epochs.md (the budget's), window.md (machine, commit, each step's
seconds, the graph's verdict). --adopt puts the records in benchmarks/gpu_window-<card>-<commit>/
and the budget's two files in results/evidence/fashion_mnist_budget/, then says what to commit.
Standard library only before step 1: it runs before the packages are installed.
"""
from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACK = REPO / ".cache/gpu_window"                   # what --pack builds and the call carries (git ignores it)
SITE, SHIM = Path("/tmp/site"), Path("/tmp/structinit-bin")
WHEELS = REPO / "benchmarks/gpu_wheels.txt"         # the packages a stock PyTorch CUDA image lacks
FM_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
FM_ROUTES = (REPO / "datasets/fashion_mnist", Path("/usr/share/datasets/fashion-mnist"))
CARRY_MIB = 64                                      # what one call may carry, the working tree included
MARGIN = 20.0                                       # seconds kept before --limit: the call's own end
CUDA_TESTS = ("tests/test_step_graph.py", "tests/test_memory.py", "tests/test_stacked.py", "tests/test_fake_cuda.py")
TINY_TESTS = ("tests/test_step_graph.py::test_on_cuda_the_replayed_step_trains_as_the_eager_one",)
GAP = re.compile(r"largest per-step loss gap, captured vs uncaptured, over (\d+) steps: (\S+) nats")
OUTCOME = re.compile(r"^(PASSED|FAILED|SKIPPED|ERROR) \S*test_on_cuda_the_replayed_step", re.M)


# --- here: what to send ---------------------------------------------------------------------------
def pins(names: list[str], constraints: Path = REPO / "constraints.txt") -> list[str]:
    """Each name at the version constraints.txt pins (compared as pip compares names)."""
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()                                       # noqa: E731
    pinned = {norm(line.split("==")[0]): line.strip() for line in constraints.read_text().splitlines()
              if "==" in line and not line.startswith("#")}
    missing = [n for n in names if norm(n) not in pinned]
    if missing:
        raise SystemExit(f"error: {WHEELS.name} names {missing}, which constraints.txt does not pin")
    return [pinned[norm(n)] for n in names]


def pip_download(requirements: list[str], dest: Path) -> None:
    """Wheels for the GPU image's Python (3.12, manylinux x86-64); a package that exists only as a
    source archive (antlr4-python3-runtime, for hydra's `-S`) is built into a wheel here."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    platform = [a for p in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
                for a in ("--platform", p)]
    binary, source = [], []
    for req in requirements:
        (source if req.startswith("antlr4-python3-runtime") else binary).append(req)
    subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                    "--implementation", "cp", *platform, "-d", str(dest), *binary], check=True)
    if source:
        subprocess.run([*pip, "wheel", "--no-deps", "-w", str(dest), *source], check=True)


def gzipped(name: str) -> bytes:
    """A Fashion-MNIST file as .gz from the first route that holds it (its bytes are checked on use)."""
    for folder in FM_ROUTES:
        if (folder / f"{name}.gz").is_file():
            return (folder / f"{name}.gz").read_bytes()
        if (folder / name).is_file():
            return gzip.compress((folder / name).read_bytes(), mtime=0)
    raise SystemExit(f"error: {name}: in none of {', '.join(map(str, FM_ROUTES))} (docs/fashion-mnist.md)")


def tree_bytes(root: Path = REPO) -> int:
    """What the call sends besides the carried folder: the tracked and the unignored untracked files."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    return sum((root / f).stat().st_size for f in files if f and (root / f).is_file())


def pack(dest: Path = PACK, download=pip_download) -> int:
    """Build dest/ (whl/, git.tar.gz: a shallow clone's .git, fashion_mnist/: the four .gz) and print
    its size beside the working tree's; exit status 1 when both pass CARRY_MIB."""
    if subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                      text=True).stdout.strip():
        print("warning: the working tree differs from HEAD: the shallow git is HEAD's; commit first")
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "whl").mkdir(parents=True)
    download(pins([n for n in WHEELS.read_text().split("\n")[1:] if n.strip()]), dest / "whl")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "clone", "-q", "--depth", "1", REPO.as_uri(), tmp], check=True)
        subprocess.run(["tar", "czf", str(dest / "git.tar.gz"), "-C", tmp, ".git"], check=True)
    (dest / "fashion_mnist").mkdir()
    for name in FM_FILES:
        (dest / "fashion_mnist" / f"{name}.gz").write_bytes(gzipped(name))
    mib = lambda b: b / 2**20                                                                 # noqa: E731
    part = {p.name: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else p.stat().st_size
            for p in sorted(dest.iterdir())}
    tree = tree_bytes()
    total = sum(part.values()) + tree
    for what, size in [*part.items(), ("the working tree", tree), ("in all", total)]:
        print(f"{what:>18}: {mib(size):6.1f} MiB")
    rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
    if mib(total) > CARRY_MIB:
        print(f"over the {CARRY_MIB} MiB one call carries: send the data first, carry [\"{rel}/fashion_mnist\"] "
              f"with `mkdir -p /tmp/gpu_window && cp -r {rel}/fashion_mnist /tmp/gpu_window/`, then at once the "
              f"rest (move {rel}/fashion_mnist aside first); the run looks in both places")
        return 1
    print(f"carry [\"{rel}\"]; run: python3 -m benchmarks.gpu_session --limit 570 --out \"$OUT\" (timeout_s 600)")
    return 0


# --- there: the run -------------------------------------------------------------------------------
class Window:
    """The run's clock, its log (session.log in --out, line by line) and its summary (window.md)."""

    def __init__(self, out: Path, limit: float):
        self.out, self.start, self.ends = out, time.monotonic(), time.monotonic() + limit - MARGIN
        out.mkdir(parents=True, exist_ok=True)
        self.log_file = open(out / "session.log", "a", buffering=1)
        self.lines: list[str] = []

    def left(self) -> float:
        return self.ends - time.monotonic()

    def say(self, line: str) -> None:
        line = f"[{time.monotonic() - self.start:5.0f} s] {line}"
        print(line, flush=True)
        self.log_file.write(line + "\n")

    def note(self, line: str) -> None:                  # a line of window.md, written at once
        self.lines.append(line)
        (self.out / "window.md").write_text("\n".join(self.lines) + "\n")

    def run(self, what: str, cmd: list[str], env: dict, cap: float | None = None, also: Path | None = None) -> tuple:
        """cmd, cut at min(cap, what is left); its output to session.log (and `also`) as it comes.
        Returns (exit status or "cut", seconds, output)."""
        budget = self.left() if cap is None else min(cap, self.left())
        if budget < 5:
            self.say(f"{what}: not started, {self.left():.0f} s left")
            return "not started", 0.0, ""
        self.say(f"{what}, at most {budget:.0f} s: {' '.join(cmd)}")
        t, out = time.monotonic(), []
        sinks = [self.log_file] + ([open(also, "a", buffering=1)] if also else [])
        sinks[-1].write(f"$ {' '.join(cmd)}\n")
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        timer = threading.Timer(budget, proc.kill)
        timer.start()
        for line in proc.stdout:
            out.append(line)
            for sink in sinks:
                sink.write(line)
        code, cut = proc.wait(), not timer.is_alive()
        timer.cancel()
        seconds = time.monotonic() - t
        self.say(f"{what}: {'cut at its limit' if cut else f'exit {code}'} after {seconds:.0f} s")
        return ("cut" if cut else code), seconds, "".join(out)


def set_up(w: Window) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", DVC_NO_ANALYTICS="1")
    wheels = sorted((PACK / "whl").glob("*.whl"))
    if wheels and subprocess.run([sys.executable, "-c", "import dvc, pydantic, tabulate"], capture_output=True
                                 ).returncode:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", str(SITE), *map(str, wheels)], check=True)
        w.say(f"installed {len(wheels)} wheels into {SITE}")
    if SITE.is_dir():     # appended to, never replaced: the tests' subprocesses keep it
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH")) if p)
        env["PATH"] = f"{SITE / 'bin'}{os.pathsep}{env['PATH']}"
    if shutil.which("python", path=env["PATH"]) is None:
        SHIM.mkdir(parents=True, exist_ok=True)
        (SHIM / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
        (SHIM / "python").chmod(0o755)
        env["PATH"] = f"{SHIM}{os.pathsep}{env['PATH']}"
        w.say(f"`python` on PATH: {SHIM / 'python'}")
    if not (REPO / ".git").exists() and (PACK / "git.tar.gz").is_file():
        subprocess.run(["tar", "xzf", str(PACK / "git.tar.gz"), "-C", str(REPO)], check=True)
        subprocess.run(["git", "config", "--global", "--add", "safe.directory", str(REPO)], check=False)
        w.say("the shallow git unpacked as .git")
    for folder in (PACK / "fashion_mnist", Path("/tmp/gpu_window/fashion_mnist")):
        for gz in sorted(folder.glob("*.gz")):
            target = REPO / "datasets/fashion_mnist" / gz.name
            if not target.exists():
                shutil.copy2(gz, target)
                w.say(f"{gz.name} into datasets/fashion_mnist/")
    return env


def machine(env: dict) -> tuple[str, str, str]:
    """The card (or the CPU, where there is none), torch, and the commit (marked when the tree differs)."""
    probe = ("import torch; from structinit.numerics import numerics_record as r; print(torch.__version__); "
             "print(torch.cuda.get_device_name() if torch.cuda.is_available() else r()['cpu'])")
    got = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True)
    torch_version, card = (got.stdout.splitlines() + ["unknown", f"unknown ({got.stderr.strip()[-200:]})"])[:2]
    git = lambda *a: subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()  # noqa: E731
    commit = (git("rev-parse", "--short", "HEAD") or "unknown") + (
        " (uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")
    return card, torch_version, commit


def graph_verdict(output: str) -> str:
    """The CUDA graph's check as its test reported it (-rA's outcome line, -s's gap line)."""
    outcome, gap = OUTCOME.search(output), GAP.search(output)
    skipped = re.search(r"^SKIPPED \[\d+\] tests/test_step_graph.py:\d+: (no CUDA.*)$", output, re.M)
    said = outcome[1] if outcome else f"SKIPPED ({skipped[1]})" if skipped else "not run to its end"
    if gap:
        said += f": the largest per-step loss gap over {gap[1]} steps, captured against uncaptured, {gap[2]} nats"
    return said


def window(out: Path, limit: float, tiny: bool) -> int:
    w = Window(out, limit)
    env = set_up(w)
    card, torch_version, commit = machine(env)
    w.note(f"# GPU window: {card}, commit {commit}")
    w.note("")
    w.note(f"torch {torch_version}; Python {sys.version.split()[0]}.")
    w.note(f"`python3 -m benchmarks.gpu_session --limit {limit:g}{' --tiny' if tiny else ''}` "
           f"({'tiny (CPU): not a measurement' if tiny else 'the prepared run'}); set-up "
           f"{time.monotonic() - w.start:.0f} s.")
    tests = TINY_TESTS if tiny else CUDA_TESTS
    code, seconds, output = w.run("(a) the CUDA-only tests", [sys.executable, "-m", "pytest", "-q", "-s", "-rA",
                                  "-p", "no:cacheprovider", *tests, *([] if tiny else ["-k", "cuda"])],
                                  env, cap=None if tiny else 240, also=out / "cuda_tests.txt")
    summary = next((ln for ln in reversed(output.splitlines()) if re.search(r"\d+ (passed|failed|skipped)", ln)), "")
    w.note(f"- (a) the CUDA-only tests, {seconds:.0f} s, {code}: {summary.strip('= ') or 'no summary'} "
           f"(cuda_tests.txt). The CUDA graph: {graph_verdict(output)}.")
    budget_dir = REPO / "results/evidence/fashion_mnist_budget"
    for name in ("epochs.csv", "epochs.md"):            # resumed from what is committed, written in --out
        if (budget_dir / name).is_file() and not (out / name).exists() and not tiny:
            shutil.copy2(budget_dir / name, out / name)
    deadline = max(w.left() - 10, 0)
    code, seconds, output = w.run("(b) the budget", [sys.executable, "-m", "tools.fashion_mnist", "--budget",
                                  "--out", str(out), "--deadline", f"{deadline:.0f}", *(["--tiny"] if tiny else [])],
                                  env)
    state = next((ln for ln in reversed(output.splitlines()) if ln.startswith("budget: ")), "budget: not reported")
    w.note(f"- (b) the budget at B and 2B on the validation split, {seconds:.0f} s, {code}: {state[8:]} "
           "(epochs.csv, epochs.md).")
    if state == "budget: measured":
        w.note("- next, the grid's missing cells: not built yet (cells committed one by one: issue 65's item 1).")
    w.note(f"\nEnded {w.left() + MARGIN:.0f} s before its limit.")
    w.say(f"written in {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


# --- here: what came back -------------------------------------------------------------------------
def adopt(returned: Path, root: Path = REPO) -> int:
    head = (returned / "window.md").read_text().split("\n", 1)[0]
    m = re.match(r"# GPU window: (.+), commit (\w+)", head)
    if not m:
        raise SystemExit(f"error: {returned / 'window.md'} does not start with '# GPU window: <card>, commit <c>'")
    from tools.gpu_hours import card_slug          # here, not on the GPU: the packages are installed

    records = root / f"benchmarks/gpu_window-{card_slug(m[1])}-{m[2]}"
    budget = root / "results/evidence/fashion_mnist_budget"
    records.mkdir(parents=True, exist_ok=True)
    budget.mkdir(parents=True, exist_ok=True)
    placed = []
    for f in sorted(returned.iterdir()):
        dest = (budget if f.name in ("epochs.csv", "epochs.md") else records) / f.name
        shutil.copy2(f, dest)
        placed.append(dest.relative_to(root).as_posix())
    print("commit: " + " ".join(placed))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--pack", action="store_true", help=f"build {PACK.relative_to(REPO)}/ and print its size")
    what.add_argument("--out", type=Path, help="run the window, writing here as it goes (on the GPU: $OUT)")
    what.add_argument("--adopt", type=Path, metavar="DIR", help="put a window's returned files in place")
    ap.add_argument("--limit", type=float, default=570.0, help="seconds the run may take (default 570)")
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU: tests the run, measures nothing")
    a = ap.parse_args(argv)
    if a.pack:
        return pack()
    if a.adopt:
        return adopt(a.adopt)
    return window(a.out.resolve(), a.limit, a.tiny)


if __name__ == "__main__":
    raise SystemExit(main())
