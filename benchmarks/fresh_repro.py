"""End to end: the default `dvc repro` in a fresh clone, timed stage by stage.

    python -m benchmarks.fresh_repro [--target aggregate] [--repo .] [--keep] [--write FILE]
                                     [--out-dir benchmarks] [--deadline SECONDS]

Clones the committed HEAD into a temporary folder (structinit/pipeline/scratch.py: no DVC cache, nothing run
yet; commit first to measure local changes), runs `dvc repro <target>` there (`--target ''`:
everything, every study included) and prints each stage family's count and seconds and the
wall time (last line: `wall: <seconds> s`). `--write FILE` also writes them as markdown with
the commit, the CPU, the threads and each training stage's dtype (benchmarks/fresh_repro.md,
which the README and docs quote). On a GPU machine `--out-dir benchmarks` writes
benchmarks/fresh_repro-<card>-<commit>.md instead (readme_gpu_default: the README's GPU minutes
come from the newest complete one). `--deadline` ends dvc and its stages at that moment; the
file then says the run was cut short.
"""
import argparse
import collections
import os
import re
import subprocess
import time
from pathlib import Path

from tabulate import tabulate

from structinit.pipeline import scratch
from tools.gpu_hours import PROBES, REPO, card_slug

STAGE_LINE = re.compile(r"Running stage '([^']+)'")
DTYPE_LINE = re.compile(r"training \d+ model\(s\) .* in (bf16|fp32)")   # trainer.py's announcement
FRESH_GPU = "python -m benchmarks.fresh_repro --target '' --out-dir benchmarks"   # the command that times a GPU


def fresh_repro_name(card: str, commit: str) -> str:
    """Named as the probe's files (probe_name), with fresh_repro in front of the card."""
    return f"fresh_repro-{card_slug(card)}-{commit}.md"


def fresh_repro_files(folder: Path = PROBES) -> list[Path]:
    """The GPU fresh-clone files (the CPU's fresh_repro.md is not one)."""
    return sorted(folder.glob("fresh_repro-*.md"))


def read_fresh_repro(path: str | Path) -> dict:
    """A GPU fresh-clone file's card, commit, date (UTC) and minutes (None: the run was cut short,
    its headline has no "**N min**")."""
    text = Path(path).read_text()
    card = re.search(r"^Machine: one (.+?) \(", text, re.M)
    date = re.search(r"\bon (\d{4}-\d\d-\d\d \d\d:\d\d) UTC\b", text)
    commit = re.search(r"in a fresh clone of `([0-9a-f]{4,40})`", text)
    minutes = re.search(r"\*\*([\d.]+) min\*\*", text.split("\n", 1)[0])
    return {"card": card[1] if card else None, "date": date[1] if date else "", "commit": commit[1] if commit else None,
            "minutes": float(minutes[1]) if minutes else None}


def gpu_default_run(folder: Path = PROBES) -> tuple[Path, dict] | None:
    """The newest (by its date) complete GPU fresh-clone file with its figures; None where there is none."""
    runs = [(path, read_fresh_repro(path)) for path in fresh_repro_files(folder)]
    runs = [(path, run) for path, run in runs if run["minutes"] is not None and run["card"]]
    return max(runs, key=lambda r: (r[1]["date"], r[0].name)) if runs else None


def readme_gpu_default(folder: Path = PROBES) -> str:
    """The README's sentence on the default's `dvc repro` on a GPU (without its closing period)."""
    found = gpu_default_run(folder)
    if found is None:
        return f"The default's `dvc repro` on a GPU has not been timed yet by `{FRESH_GPU}`"
    path, run = found
    where = path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else path.name
    return (f"The default's `dvc repro` from a fresh clone took {run['minutes']:.1f} minutes on one "
            f"{run['card']} (`{where}`)")


def timed_repro(repo: Path, target: str, timeout: float | None = None
                ) -> tuple[list[tuple[str, float, str]], float, bool]:
    """Run `dvc repro target` in repo; returns [(stage, seconds, dtypes)] in run order (dtypes:
    what the stage's training computed in, "" where it trained nothing), the wall time, and
    whether it ran to its end: False where `timeout` (seconds) ended it (the last stage listed is
    then the one it stopped in)."""
    args = ["repro"] + ([target] if target else [])
    t0 = time.perf_counter()
    starts, dtypes, tail = [], [], collections.deque(maxlen=40)

    def said(line: str) -> None:
        tail.append(line)
        if match := STAGE_LINE.search(line):
            starts.append((match[1], time.perf_counter()))
            dtypes.append(set())
            print(f"{starts[-1][1] - t0:7.1f} s  {match[1]}", flush=True)
        elif (match := DTYPE_LINE.search(line)) and dtypes:
            dtypes[-1].add(match[1])
    code = scratch.run_dvc(repo, *args, on_line=said, timeout=timeout)
    complete = code != scratch.TIMED_OUT
    if code and complete:
        raise SystemExit(f"dvc {' '.join(args)} failed ({code}):\n{''.join(tail)}")
    end = time.perf_counter()
    stages = [(name, (starts[i + 1][1] if i + 1 < len(starts) else end) - t, "+".join(sorted(dtypes[i])))
              for i, (name, t) in enumerate(starts)]
    return stages, end - t0, complete


def gpu_card() -> tuple[str, str] | None:
    """(name, memory) of the GPU torch sees, or None. Asked of nvidia-smi, so that this process,
    which trains nothing, holds no CUDA context while the stages run; torch where there is no
    nvidia-smi."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader", "-i", index],
                           capture_output=True, text=True, timeout=20)
        name, memory = (c.strip() for c in r.stdout.strip().splitlines()[0].split(","))
        return name, memory
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        props = torch.cuda.get_device_properties(0)
        return props.name, f"{props.total_memory / 2 ** 30:.1f} GiB"


def out_file(out_dir: Path, card: str | None, head: str) -> Path:
    """Where --out-dir writes: out_dir/fresh_repro-<card>-<commit>.md (one file per card and
    commit). A machine without a GPU has benchmarks/fresh_repro.md (--write): refused here."""
    if card is None:
        raise SystemExit("--out-dir names a GPU's own file and torch sees no GPU here; on the CPU use "
                         "--write benchmarks/fresh_repro.md")
    return out_dir / fresh_repro_name(card, head)


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
    rec["card"] = gpu_card()
    rec["cuda_version"] = torch.version.cuda
    return rec


def report(stages: list[tuple[str, float, str]], wall: float, head: str, target: str, rec: dict,
           complete: bool = True, command: str | None = None, when: str | None = None) -> str:
    """The run's figures as markdown: machine, per stage family, per stage, wall time. A run
    that did not complete (cut at its deadline) gives no minutes: it says which stages finished.
    command: how the file was written (default: --write benchmarks/fresh_repro.md); when: the
    run's date (UTC; default now)."""
    by_family = collections.defaultdict(list)
    for name, seconds, dtype in stages:
        by_family[name.split("@")[0]].append((seconds, dtype))
    families = [[fam, len(s), f"{sum(t for t, _ in s):.1f}", f"{sum(t for t, _ in s) / len(s):.1f}",
                 "+".join(sorted({d for _, d in s if d})) or "-"] for fam, s in by_family.items()]
    families.append(["total", len(stages), f"{sum(t for _, t, _ in stages):.1f}", "", ""])
    each = [[name, f"{seconds:.1f}", dtype or "-"] for name, seconds, dtype in stages]
    if not complete and each:
        each[-1][0] += " (ended at the deadline, unfinished)"
    when = when or time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    command = command or f"python -m benchmarks.fresh_repro --target '{target}' --write benchmarks/fresh_repro.md"
    what = (f"`dvc repro {target or ''}`".replace(" `", "`") + f" in a fresh clone of `{head}` "
            f"(what a user's first `./run.sh repro` runs, on an empty DVC cache; the `.venv` set-up not counted)")
    if complete:
        headline = f"{what}: **{wall / 60:.1f} min** ({wall:.0f} s wall)."
    else:
        done = max(len(stages) - 1, 0)
        headline = (f"{what}: **cut short** at the command's deadline after {wall:.0f} s wall: {done} stage(s) "
                    f"finished, the last one below did not; not the default's time.")
    if rec.get("card"):
        name, memory = rec["card"]
        device = (f"one {name} ({memory}), CUDA {rec.get('cuda_version')}; {rec['cores']} CPU cores: "
                  f"{rec['cpu']} ({rec['cpu_id']})")
    else:
        device = f"{rec['cpu']} ({rec['cpu_id']}), " + ("a CUDA GPU" if rec["cuda"]
                                                        else f"{rec['cores']} CPU cores, no GPU")
    lines = [
        headline,
        "",
        f"Machine: {device}, {rec['threads']} threads, "
        f"ATen {rec['aten_capability']}, native bf16 {'yes' if rec['native_bf16'] else 'no'}, "
        f"torch {rec['torch']}; on {when} UTC. Written by `{command}` after the run; dtype: what each stage's "
        f"training computed in, as the trainer printed it.",
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
    started = time.monotonic()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="aggregate", help="dvc repro target ('' = every stage)")
    ap.add_argument("--repo", default=".", help="repository to clone (default: this one)")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument("--write", type=Path, help="also write the figures as markdown to this file")
    ap.add_argument("--out-dir", type=Path, help="on a GPU machine: also write DIR/fresh_repro-<card>-<commit>.md")
    ap.add_argument("--deadline", type=float, help="seconds for the whole command: dvc and its stages are ended "
                                                   "then, and what ran is written as a run cut short")
    a = ap.parse_args()
    for folder in ([a.write.parent] if a.write else []) + ([a.out_dir] if a.out_dir else []):
        if not folder.is_dir():                   # before an hour of training, not after
            raise SystemExit(f"folder {folder} does not exist")
    rec = machine()                               # before the run: the card is known, no CUDA context held
    card = rec["card"][0] if rec["card"] else None
    if a.out_dir:
        out_file(a.out_dir, card, "0")            # refused without a GPU, before the run
    with scratch.Scratch("repro", keep=a.keep) as s:
        head = scratch.clone_head(s.repo, Path(a.repo))
        print(f"dvc repro {a.target or '(all stages)'} in a fresh clone of {head} ({s.repo})"
              + (f" on {card}" if card else ""), flush=True)
        timeout = a.deadline - (time.monotonic() - started) if a.deadline else None
        stages, wall, complete = timed_repro(s.repo, a.target, timeout=timeout)
    targets = ([(a.write, f"--write {a.write}")] if a.write else [])
    if a.out_dir:
        targets.append((out_file(a.out_dir, card, head), f"--out-dir {a.out_dir}"))
    text = ""
    for path, how in targets or [(None, "")]:
        command = f"python -m benchmarks.fresh_repro --target '{a.target}' {how}".strip()
        text = report(stages, wall, head, a.target, rec, complete=complete, command=command)
        if path is not None:
            path.write_text(text)
            print(f"written: {path}")
    print(text)
    print(f"wall: {wall:.1f} s ({wall / 60:.1f} min)" + ("" if complete else ": cut short at the deadline"))


if __name__ == "__main__":
    main()
