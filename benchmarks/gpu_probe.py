"""GPU probe: the figures the README and docs quote from a GPU, measured by one command.

    python -m benchmarks.gpu_probe                              # on a GPU: benchmarks/gpu_probe-<card>-<commit>.md
    python -m benchmarks.gpu_probe --tiny --out /tmp/probe.md   # every part at toy sizes, on the CPU

The machine, then (a) the suite's GPU-relevant tests; (b) the trainer's step on ViT-T/2 (the
cifar10 recipe, batch 512) for one model and a cell's 5, with the FLOPs per image; (c) the
trainer end to end with the paper's CIFAR recipe on synthetic data: images/s of epoch 2 (what
tools/gpu_hours.py prices the grid with), peak memory against the trainer's estimate; (d) the
default digits cell as its stage trains it, and 20 epochs of it with `cuda_graph: off`.
(Fashion-MNIST's recipe is measured on its real images by benchmarks/gpu_session.py.)
Parts run in the order c, b, a, d, each within its share of --budget; the file is rewritten
after every part. --tiny's file says so, and gpu_hours refuses it (tests/test_gpu_probe.py).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import torch

import structinit as si
from structinit.data.specs import get_spec
from structinit.data.tensors import stratified_subset, synthetic_data
from structinit.pipeline.build import CellModel, build_cell_model, build_model
from structinit.pipeline.load import load_params
from tools.gpu_hours import (ESTIMATE_ROW, FLOPS_ROW, PEAK_ROW, PROBES, RATE_ROW, STACK_ROW, TINY_LABEL,
                             count_train_flops, probe_name)

REPO = Path(__file__).resolve().parents[1]
GiB = 2 ** 30
SECTIONS = {"a": "## (a) The suite's GPU-relevant tests", "b": "## (b) One training step alone",
            "c": "## (c) The trainer end to end, CIFAR-shaped data, the paper's recipe",
            "d": "## (d) One digits cell: 5 seeds x 160 epochs, Imp.-3"}


# How big each part is: the real measurement (FULL), or toy sizes that only exercise the code.
# parts: (part, seconds expected, seconds at most), most wanted first (the H200's at 02d9857).
FULL = SimpleNamespace(
    batch=512, model=None, trainer_batches=8, trainer_epochs=4, stack=5,     # (b), model: cifar10's overrides
    e2e_train=50_000, e2e_test=10_000, e2e_batch=None, e2e_epochs=4,         # (c), batch None: the recipe's
    digits_epochs=None, digits_images=None,                                  # (d), None: the stage's
    tests=("tests/test_fake_cuda.py", "tests/test_step_graph.py", "tests/test_memory.py", "tests/test_numerics.py",
           "tests/test_distributed_plan.py", "tests/test_analysis.py", "tests/test_stacked.py"), test_filter=None,
    budget=360.0, parts=(("c", 50, 80), ("b", 50, 100), ("a", 66, 100), ("d", 40, 110)))
TINY = SimpleNamespace(**{**vars(FULL), **dict(
    batch=16, model=dict(patch_size=8, embed_dim=24, depth=1, num_heads=2), trainer_batches=2, trainer_epochs=3,
    e2e_train=256, e2e_test=64, e2e_batch=32, e2e_epochs=3, digits_epochs=2, digits_images=128,
    tests=("tests/test_distributed_plan.py",), test_filter="not two_processes", budget=240.0,
    parts=(("c", 5, 60), ("b", 10, 60), ("a", 10, 60), ("d", 10, 60)))})
T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[probe {time.perf_counter() - T0:5.0f} s] {msg}", flush=True)


def table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]) + "\n"


def n(x: float | None, digits: int = 0) -> str:
    return "not measured" if x is None else f"{x:,.{digits}f}"


def min_median(xs: list[float], digits: int, scale: float = 1.0) -> str:
    return f"{n(min(xs) * scale, digits)} / {n(statistics.median(xs) * scale, digits)}" if xs else "not measured"


def expire(signum, frame):
    """A part that overruns its share of the budget ends with an error, not the later parts' time."""
    raise TimeoutError("did not finish within its share of the budget")


def fresh(device) -> None:
    """Drop what the last run left on the device, so that the next peak is its own."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else None


def train(models, data, cfgs, device, **kw) -> tuple[list[list[dict]], str, float | None]:
    """train_models, and what it said: (histories, how it trained in its own words, its memory estimate)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        histories = si.train_models(models, data, cfgs, device=device, progress=True, **kw)
    said = out.getvalue()
    keep = [line.strip() for line in said.splitlines()
            if line.startswith(("training ", "warning: torch.compile", "warning: capturing"))]
    how = " / ".join(dict.fromkeys(keep)).replace("|", "/")[:400] or "-"
    if "one after another" in said:        # the plan's line: the seeds train one model at a time
        how = "one after another: " + how
    estimate = re.search(r"memory estimate ([\d.]+) GiB", said)
    return histories, how, float(estimate[1]) if estimate else None


def machine_rows(device, tiny: bool) -> tuple[list[list[str]], str, str]:
    import timm

    def git(*args) -> str | None:
        r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    name, card, cuda = "the CPU", "none: the CPU", "-"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name, card = props.name, f"{props.name} ({props.total_memory / GiB:.1f} GiB, {props.multi_processor_count} SMs)"
        cuda = f"{torch.version.cuda} (torch's build), cuDNN {torch.backends.cudnn.version()}"
    head, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    commit = "unknown (no git)" if head is None else f"{head} ({'dirty' if dirty else 'clean'})"
    rows = [["mode", TINY_LABEL if tiny else "full"], ["card", card], ["CUDA", cuda], ["torch", torch.__version__],
            ["timm", timm.__version__], ["Python", sys.version.split()[0]], ["commit", commit],
            ["CPU cores", str(os.cpu_count())]]
    return rows, name, head or "unknown"


def part_tests(sizes, limit: float, tiny: bool) -> str:
    """pytest in a subprocess on the GPU-relevant files: counts from its JUnit XML."""
    import importlib.util
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", *sizes.tests, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"]
        cmd += ["-k", sizes.test_filter] if sizes.test_filter else []
        if not tiny and importlib.util.find_spec("xdist"):
            cmd += ["-n", str(min(8, os.cpu_count() or 1))]
        t, r = time.perf_counter(), subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                                                   timeout=limit)
        seconds = time.perf_counter() - t
        if not xml.exists():
            raise RuntimeError(f"pytest exited {r.returncode} without a report: {(r.stdout + r.stderr)[-200:]}")
        counts, failures = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}, []
        for case in ET.parse(xml).getroot().iter("testcase"):
            kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
            counts[{"failure": "failed", "error": "errors", "skipped": "skipped", None: "passed"}[kind]] += 1
            if kind in ("failure", "error"):
                said = ((next(c for c in case if c.tag == kind).get("message") or "").splitlines() or [""])[0][:200]
                failures.append(f"- {kind}: `{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}`: "
                                f"{said}\n")
    return (f"`pytest {' '.join(sizes.tests)}` ({seconds:.0f} s, exit {r.returncode})\n\n"
            + table(list(counts), [list(counts.values())]) + "\nFailures:\n\n" + "".join(failures or ["- none\n"]))


def part_step(device, sizes) -> str:
    """The trainer's seconds per step for one model and a cell's stack (epochs after the first, its compile)."""
    recipe = load_params(REPO / "params.yaml")["recipes"]["cifar10"]
    model_cfg, spec = {**recipe["model"], **(sizes.model or {})}, get_spec("cifar10")
    gflop = count_train_flops(build_model(model_cfg, spec), spec.image_size, spec.channels) / 1e9
    data = synthetic_data(spec, sizes.trainer_batches * sizes.batch, sizes.batch)
    rows = []
    for label, models_n in (("the project's trainer, 1 model", 1), (f"{STACK_ROW} {sizes.stack}", sizes.stack)):
        fresh(device)
        cfgs = [si.TrainConfig(**{**recipe["train"], "epochs": sizes.trainer_epochs, "batch_size": sizes.batch,
                                  "eval_every": sizes.trainer_epochs, "randaugment": None, "hflip": False,
                                  "warmup_epochs": 1, "seed": s}) for s in range(models_n)]
        histories, how, _ = train([build_model(model_cfg, spec) for _ in range(models_n)], data, cfgs, device)
        one_by_one = how.startswith("one after another")
        seconds = [sum(h[e]["train_seconds"] for h in (histories if one_by_one else histories[:1]))
                   / sizes.trainer_batches for e in range(1, sizes.trainer_epochs)]
        rows.append([label, models_n, sizes.batch, *min_median(seconds, 1, 1e3).split(" / "), n(peak_gib(device), 2),
                     how])
        log(f"(b) {label}: {min(seconds) * 1e3:.1f} ms per step")
    return (table(["what", "value"], [["model", f"ViT ({model_cfg}): params.yaml's cifar10 recipe"],
                                      [FLOPS_ROW, f"{gflop:.3g} (forward + backward)"]])
            + f"\nstructinit.train_models, {sizes.trainer_batches} synthetic batches, RandAugment and flips off: "
              f"train_seconds of epochs 2-{sizes.trainer_epochs} per step.\n\n"
            + table(["step", "models", "batch per model", "ms per step, min", "ms per step, median", "peak GiB",
                     "how"], rows))


def part_end_to_end(device, sizes, state: dict) -> str:
    recipe = load_params(REPO / "params.yaml")["recipes"]["cifar10"]
    model_cfg, spec, epochs = {**recipe["model"], **(sizes.model or {})}, get_spec("cifar10"), sizes.e2e_epochs
    batch = sizes.e2e_batch or recipe["train"]["batch_size"]
    model = build_model(model_cfg, spec)
    si.initialize(model, "trunc_normal", seed=0)
    cfg = si.TrainConfig(**{**recipe["train"], "epochs": epochs, "batch_size": batch, "eval_every": epochs})
    fresh(device)
    (history,), how, estimate = train([model], synthetic_data(spec, sizes.e2e_train, sizes.e2e_test), [cfg], device)
    peak, state["rate"] = peak_gib(device), history[1]["images_per_s"]
    log(f"(c) epoch 2: {state['rate']:,.0f} img/s; peak {n(peak, 2)} GiB, estimate {n(estimate, 2)} GiB")
    ratio = f"{estimate / peak:.3f}" if peak and estimate else "-"
    rows = [[RATE_ROW, n(state["rate"]), f"training images / train_seconds of epoch 2 of {epochs}"],
            ["images/s, epochs 2 and later: min / median", min_median([h["images_per_s"] for h in history[1:]], 0),
             f"epochs 2-{epochs}"],
            ["epoch 1 (warm-up), s", f"{history[0]['train_seconds']:.1f}", "torch.compile, kernels, allocator"],
            [PEAK_ROW, n(peak, 2), "reset before the run"], [ESTIMATE_ROW, n(estimate, 2), "the trainer's own line"],
            ["estimate / peak", ratio, "tests/test_memory.py holds 1.00-1.25 on a GPU"],
            ["how the trainer trained", how, "its own log line"]]
    return (f"{sizes.e2e_train:,} train + {sizes.e2e_test:,} test synthetic uint8 images (3x32x32), one model "
            f"(Trunc Normal), batch {batch}, RandAugment {recipe['train'].get('randaugment')}, flips "
            f"{recipe['train'].get('hflip')}, {epochs} epochs.\n\n" + table(["what", "value", "how"], rows))


def digits_cell(params, seeds, epochs, images, device, **override):
    """The default digits cell as stages/train.py builds and trains it (Imp.-3 solved here)."""
    data = si.prepare_dataset("digits")
    subset = stratified_subset(data.train_labels, params["data"]["train_size"], seed=params["data"]["subset_seed"])
    recipe = {**params["recipes"]["digits"]["train"], **({"epochs": epochs} if epochs else {}), **override}
    models = [build_cell_model(CellModel(dataset="digits", init="impulse3"), params, data.spec, s)[0] for s in seeds]
    t = time.perf_counter()
    histories, how, _ = train(models, data, [si.TrainConfig(**recipe, seed=s) for s in seeds], device,
                              train_indices=subset[:images] if images else subset)
    fresh(device)
    return histories, time.perf_counter() - t, how


def part_digits(device, sizes) -> str:
    params = load_params(REPO / "params.yaml")
    seeds = params["grid"]["seeds"][:5]
    histories, seconds, how = digits_cell(params, seeds, sizes.digits_epochs, sizes.digits_images, device)
    on = [h["seconds"] for h in histories[0][1:]]
    off_epochs = min(len(histories[0]), 20)
    off_histories, _, off_how = digits_cell(params, seeds, off_epochs, sizes.digits_images, device, cuda_graph="off")
    off = [h["seconds"] for h in off_histories[0][1:]]
    log(f"(d) {len(seeds)} seeds x {len(histories[0])} epochs: {seconds:.1f} s")
    gain = f"{statistics.median(off) / statistics.median(on):.2f}x" if on and off else "not measured"
    return table(["what", "value"], [
        ["seeds x epochs", f"{len(seeds)} x {len(histories[0])}, as the stage"],
        ["the cell's training, s (warm-up included)", f"{seconds:.1f}"],
        ["seconds per epoch, epochs 2 and later: min / median", min_median(on, 3)],
        [f"the same with cuda_graph: off ({off_epochs} epochs): min / median", min_median(off, 3)],
        ["the whole-step graph's gain per epoch (median off / median on)", gain],
        ["final test acc per seed, %", ", ".join(f"{h[-1]['test_acc'] * 100:.2f}" for h in histories)],
        ["how the trainer trained", how], ["how it trained with cuda_graph: off", off_how]])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the file to write (default: benchmarks/gpu_probe-<card>-<commit>.md)")
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU: tests the probe, measures nothing")
    ap.add_argument("--budget", type=float, help="seconds for the whole probe (default 360; tiny 240)")
    ap.add_argument("--skip", nargs="*", default=[], choices=list("abcdefgh"),
                    help="parts not to run (e to h: parts since cut, accepted for older commands)")
    a = ap.parse_args()
    sizes = TINY if a.tiny else FULL
    parts, budget = sizes.parts, a.budget or sizes.budget
    device = torch.device("cpu") if a.tiny else si.default_device()
    if device.type != "cuda" and not a.tiny:
        sys.exit("gpu_probe: no GPU visible to torch; --tiny runs every part at toy sizes on the CPU")
    machine, card, commit = machine_rows(device, a.tiny)
    default = f"gpu_probe_tiny-{device.type}.md" if a.tiny else probe_name(card, commit)
    out = Path(a.out) if a.out else PROBES / default
    command = " ".join(["python -m benchmarks.gpu_probe", *sys.argv[1:]])
    label = TINY_LABEL if a.tiny else f"{card}, torch {torch.__version__}, project at {commit}"
    log(f"{label}; writing {out}; budget {budget:.0f} s")
    bodies, state = {}, {}

    def write(seconds=None):
        took = f" in {seconds:.0f} s" if seconds is not None else " (running: parts not yet run say so)"
        text = [f"# GPU probe: {label}\n", f"Written by `{command}`{took}. What each part measures and how: the "
                "docstring of benchmarks/gpu_probe.py.\n", "## Machine\n", table(["what", "value"], machine)]
        out.write_text("\n".join(text + [x for k in SECTIONS for x in (SECTIONS[k] + "\n",
                                                                          bodies.get(k, "not run yet\n"))]))
    write()
    signal.signal(signal.SIGALRM, expire)
    runners = {"a": lambda limit: part_tests(sizes, limit, a.tiny), "b": lambda _: part_step(device, sizes),
               "c": lambda _: part_end_to_end(device, sizes, state), "d": lambda _: part_digits(device, sizes)}
    expected = {k: e for k, e, _ in parts}
    for i, (key, _, cap) in enumerate(parts):
        if key in a.skip:
            bodies[key] = "skipped (--skip)\n"
            continue
        # the later parts' expected seconds are kept in reserve, the least wanted giving theirs up first
        later = [expected[k] for k, _, _ in parts[i + 1:] if k not in a.skip]
        left = T0 + budget - time.perf_counter()
        while later and left - sum(later) < expected[key]:
            later.pop()
        limit = min(cap, left - sum(later))
        if limit < expected[key] / 2:
            bodies[key] = f"skipped: {limit:.0f} s of the {budget:.0f} s budget left for it\n"
            continue
        log(f"({key}) at most {limit:.0f} s")
        signal.setitimer(signal.ITIMER_REAL, limit + 5)          # subprocesses: their own timeout first
        try:
            bodies[key] = runners[key](limit)
        except Exception as e:             # subprocess.TimeoutExpired, TimeoutError, a failed part
            bodies[key] = f"error: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}\n"
            log(f"({key}) {bodies[key]}")
        signal.setitimer(signal.ITIMER_REAL, 0)
        fresh(device)
        write()
    write(time.perf_counter() - T0)
    log(f"wrote {out}" + (f": the trainer end to end {state['rate']:,.0f} img/s" if "rate" in state else ""))


if __name__ == "__main__":
    main()
