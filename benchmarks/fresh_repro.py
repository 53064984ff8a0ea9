"""End to end: the default `dvc repro` in a fresh clone, timed stage by stage.

    python -m benchmarks.fresh_repro [--target aggregate] [--repo .] [--keep] [--write FILE]

Clones the repository's committed HEAD into a temporary folder (what a user gets: no DVC
cache, nothing run yet; commit first to measure local changes), runs `dvc repro <target>`
there with this environment's Python on PATH, and prints each stage family's count and
seconds (from the moments DVC announces each stage) and the whole wall time. The default
target, `aggregate`, is the main table alone (download -> preoptimize -> train -> aggregate);
`--target ''` runs everything, every study included. Last line: `wall: <seconds> s`.

`--write FILE` also writes the figures as markdown after the run (docs/pipeline.md quotes
benchmarks/fresh_repro.md, written by `--target '' --write benchmarks/fresh_repro.md`; the
README states its minutes, checked by tests/test_first_screen.py): the
commit, the CPU, the threads, each stage's seconds and the dtype its training computed in (as
the trainer printed it). The file lives outside DVC's outputs: a time is not the same bytes
twice.
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
DTYPE_LINE = re.compile(r"training \d+ model\(s\) .* in (bf16|fp32)")   # trainer.py's announcement


def timed_repro(repo: Path, target: str) -> tuple[list[tuple[str, float, str]], float]:
    """Run `dvc repro target` in repo; returns [(stage, seconds, dtypes)] in run order (dtypes:
    what the stage's training computed in, "" where it trained nothing) and the wall time."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               DVC_NO_ANALYTICS="1")
    cmd = ["dvc", "repro"] + ([target] if target else [])
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    starts, dtypes, tail = [], [], collections.deque(maxlen=40)
    for line in proc.stdout:
        tail.append(line)
        if match := STAGE_LINE.search(line):
            starts.append((match[1], time.perf_counter()))
            dtypes.append(set())
            print(f"{starts[-1][1] - t0:7.1f} s  {match[1]}", flush=True)
        elif (match := DTYPE_LINE.search(line)) and dtypes:
            dtypes[-1].add(match[1])
    if proc.wait():
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{''.join(tail)}")
    end = time.perf_counter()
    stages = [(name, (starts[i + 1][1] if i + 1 < len(starts) else end) - t, "+".join(sorted(dtypes[i])))
              for i, (name, t) in enumerate(starts)]
    return stages, end - t0


def machine() -> dict:
    """The CPU and threads the stages ran with (each stage is a child of this machine's Python,
    with torch's default threads: one per core)."""
    import torch

    from structinit.numerics import numerics_record

    rec = numerics_record()
    cpuinfo = Path("/proc/cpuinfo")
    ids = {}
    if cpuinfo.exists():   # "AMD EPYC" alone does not tell Zen 3 from Zen 4
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("cpu family", "model") and key.strip() not in ids:
                ids[key.strip()] = value.strip()
    rec["cpu_id"] = ", ".join(f"{k} {v}" for k, v in ids.items())
    rec["cores"] = os.cpu_count()
    rec["cuda"] = torch.cuda.is_available()
    return rec


def report(stages: list[tuple[str, float, str]], wall: float, head: str, target: str, rec: dict) -> str:
    """The run's figures as markdown: machine, per stage family, per stage, wall time."""
    by_family = collections.defaultdict(list)
    for name, seconds, dtype in stages:
        by_family[name.split("@")[0]].append((seconds, dtype))
    families = [[fam, len(s), f"{sum(t for t, _ in s):.1f}", f"{sum(t for t, _ in s) / len(s):.1f}",
                 "+".join(sorted({d for _, d in s if d})) or "-"] for fam, s in by_family.items()]
    families.append(["total", len(stages), f"{sum(t for _, t, _ in stages):.1f}", "", ""])
    each = [[name, f"{seconds:.1f}", dtype or "-"] for name, seconds, dtype in stages]
    device = "a CUDA GPU" if rec["cuda"] else f"{rec['cores']} CPU cores, no GPU"
    lines = [
        f"`dvc repro {target or ''}`".replace(" `", "`") + f" in a fresh clone of `{head}` "
        f"(what a user's first `./run.sh repro` runs, on an empty DVC cache; the `.venv` set-up "
        f"not counted): **{wall / 60:.1f} min** "
        f"({wall:.0f} s wall).",
        "",
        f"Machine: {rec['cpu']} ({rec['cpu_id']}), {device}, {rec['threads']} threads, "
        f"ATen {rec['aten_capability']}, native bf16 {'yes' if rec['native_bf16'] else 'no'}, "
        f"torch {rec['torch']}. Written by `python -m benchmarks.fresh_repro --target '{target}' "
        f"--write benchmarks/fresh_repro.md` after the run; dtype: what each stage's training "
        f"computed in, as the trainer printed it.",
        "",
        tabulate(families, headers=["stage", "runs", "seconds", "seconds per run", "dtype"],
                 tablefmt="github"),
        "",
        "<details><summary>Every stage</summary>",
        "",
        tabulate(each, headers=["stage", "seconds", "dtype"], tablefmt="github"),
        "",
        "</details>",
        "",
    ]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="aggregate", help="dvc repro target ('' = every stage)")
    ap.add_argument("--repo", default=".", help="repository to clone (default: this one)")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument("--write", type=Path, help="also write the figures as markdown to this file")
    a = ap.parse_args()
    if a.write and not a.write.parent.is_dir():   # before an hour of training, not after
        raise SystemExit(f"--write {a.write}: folder {a.write.parent} does not exist")
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
    text = report(stages, wall, head, a.target, machine())
    print(text)
    if a.write:
        a.write.write_text(text)
        print(f"written: {a.write}")
    print(f"wall: {wall:.1f} s ({wall / 60:.1f} min)")


if __name__ == "__main__":
    main()
