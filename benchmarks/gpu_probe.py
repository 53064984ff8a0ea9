"""GPU probe: what one GPU does with this project, measured by one command in at most 6 minutes on an H100.

    python -m benchmarks.gpu_probe                              # on a GPU: benchmarks/gpu_probe-<card>-<commit>.md
    python -m benchmarks.gpu_probe --tiny --out /tmp/probe.md   # every part at toy sizes, on the CPU
    python -m benchmarks.gpu_probe --skip a b c d e f g --fm-depths 4 3 2
        # Fashion-MNIST's recipe at other depths alone: fashion_mnist_depths-<card>-<commit>.md in benchmarks/

It writes one markdown file: the machine (card, driver, CUDA, torch, timm, the commit and whether
the tree was dirty), then
  (a) the suite's GPU-relevant tests (pytest in a subprocess): passed / failed / skipped, failures named;
  (b) one training step alone: ViT-T/2 (params.yaml's cifar10 recipe) at batch 512, bf16 autocast,
      fused AdamW, the recipe's clip, as a plain timm module (eager and under torch.compile) and
      as the project's trainer with one model and with a cell's 5 (stacked, or one after another
      where the trainer's plan says one model fills the GPU: the row says which): ms per step,
      TFLOP/s (FLOPs per image counted by tools.gpu_hours.count_train_flops, times images)
      and that as a share of the card's bf16 matmul rate (8192^3, measured in the same run);
  (c) the trainer end to end on CIFAR-shaped synthetic data (50,000 + 10,000 uint8 images) with the
      paper's recipe (RandAugment, flips, batch 512), 4 epochs: images/s of epoch 2 (the figure
      gpu_hours prices with), and min / median of epochs 2-4 (epoch 1 is warm-up); peak memory
      (torch.cuda.max_memory_allocated) against the estimate the trainer printed;
  (d) one digits cell as `dvc repro train_impulse@digits-3` trains it: 5 seeds x 160 epochs, Imp.-3,
      stacked (the cell's whole training, warm-up included, as the stage pays it); then the same
      cell for 20 epochs with `cuda_graph: off`: what capturing the whole step gains per epoch;
  (e) one process under torchrun: the launcher, the device plan, the process group's backend;
  (f) one digits cell (2 seeds, 3 epochs) trained twice in this process: the same bytes or not;
  (g) where the time goes: one ViT-T/2 step (the paper's CIFAR recipe, the model as (b) builds it)
      and one digits-stack step (the default cell's 5 seeds of Imp.-3, as (d)), each the
      trainer's own (train_models, after warm-up epochs), under torch.profiler (CPU and CUDA
      activity): the 15 kernels with the most device time (names shortened), each one's
      microseconds and share of the step's device time, the step's wall and device time, the
      kernels per step and the host's launch calls (a kernel each, or a CUDA graph). --tiny runs
      it on the CPU, where it lists CPU ops (aten, by self time) instead, labelled so;
  (h) Fashion-MNIST's recipe (params.yaml, recipes.fashion_mnist: the model and batch the main
      grid trains) as a cell trains it: every seed of grid.seeds stacked (or as the trainer
      plans), on synthetic 28x28 images, a few epochs with the test set (10,000) every epoch:
      the cell's images/s, and from it the main grid's time on this card (its cells x the
      recipe's epochs x 60,000 images, plus each cell's first epoch and evaluations; the stages'
      start-ups are not in it); then one model of it trained alone (how a cell trains when the
      plan says one after another): which way trains a cell's seeds faster. With --fm-depths D...,
      the recipe at each of those depths too (width and heads kept), and the main grid's time at
      each as DVC runs it (adding the stages' own cost that the H200's grid record measured),
      against the 10-minute target: what to cut the recipe to. tools/fashion_mnist.py measures
      the grid itself.
Timings exclude warm-up (on a GPU the trainer's torch.compile runs in its first epoch) and give
min and median over repeats. The parts run in the order c, b, a, d, h, g, f, e (most wanted first). A
part that fails writes its error (one line) and the others still run; each part has a share of
the budget (--budget, 360 s), and a part whose share is gone is skipped, so the command ends in
time: a later part's expected time is kept in reserve only as far as the budget allows (the
least wanted give theirs up first). The file is rewritten after every part: a run cut short
still leaves what it measured. `python -m benchmarks.gpu_session` runs the probe and then the
default's fresh-clone `dvc repro` (benchmarks/fresh_repro.py) as one command of at most 10 minutes.

Where it writes: benchmarks/gpu_probe-<card>-<commit>.md by default (tools/probe_file.py's
probe_name: the card's name lower case and dashed, without "NVIDIA", and the short commit), one
file per card and commit, committed beside the others. tools/gpu_hours.py prices the paper's grid
from the one tools/probe_file.py names as PRICED (read_probe: its ViT-T/2 rate, card and commit;
the file's layout is defined there too); to price from a new run, name its file there and run
`python -m tools.gpu_hours --write` and `python -m tools.readme_answer --write` (the README and
docs quote both).

--tiny runs every part at toy sizes on the CPU in well under a minute (the suite runs it:
tests/test_gpu_probe.py): a tiny ViT, a few images, torch.compile with the eager backend (no C++
compiler needed), only tests/test_distributed_plan.py's one-process tests. Its file says "tiny
(CPU): not a measurement", and gpu_hours refuses it. Without a GPU and without --tiny it stops.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import gc
import hashlib
import io
import math
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

import torch
import torch.nn.functional as F

from structinit.data.tensors import synthetic_data

from tools.probe_file import (CARD_ROW, COMMIT_ROW, COMPILED_ROW, EAGER_ROW, ESTIMATE_ROW, FIRST_ROW, FLOPS_ROW,
                              FM_ALONE_ROW, FM_DEEPEST_ROW, FM_DEPTHS_HEADING, FM_GRID_ROW, FM_RATE_ROW,
                              LAUNCHES_ROW, MATMUL_ROW, MODE_ROW, NOT_MEASURED, PEAK_ROW, PROBES, PROFILE_HEADINGS,
                              PROFILE_TOP, RATE_ROW, RATES_ROW, RATIO_ROW, SECTIONS, SHARE_COLUMN, STACK_ROW,
                              TINY_LABEL, TRAINER_ROW, probe_name)

REPO = Path(__file__).resolve().parents[1]
GPU_TESTS = ["tests/test_fake_cuda.py", "tests/test_step_graph.py", "tests/test_memory.py", "tests/test_numerics.py",
             "tests/test_distributed_plan.py", "tests/test_analysis.py", "tests/test_stacked.py"]
GiB = 2 ** 30


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How big each part is: the real measurement, or toy sizes that only exercise the code."""
    batch: int = 512
    model: dict | None = None          # overrides of the cifar10 recipe's model (tiny: a toy ViT)
    warmup: int = 3                    # steps before timing: allocator, kernels, cuBLAS heuristics
    repeats: int = 5
    steps_per_repeat: int = 10
    compile_backend: str = "inductor"
    trainer_batches: int = 8           # the synthetic set of (b): this many batches per epoch
    trainer_epochs: int = 4            # epoch 1 is warm-up, the others are the repeats
    stack: int = 5
    e2e_train: int = 50_000
    e2e_test: int = 10_000
    e2e_batch: int | None = None       # None: the recipe's (512)
    e2e_epochs: int = 4
    digits_epochs: int | None = None   # None: the recipe's (160)
    digits_images: int | None = None   # None: the recipe's training set (all 1,437)
    same_epochs: int = 3
    same_images: int | None = None
    profile_batches: int | None = None        # (g)'s ViT epoch: this many batches (None: trainer_batches)
    profile_digits_images: int | None = None  # (g)'s digits epoch: this many images (None: the recipe's, all 1,437)
    profile_digits_batch: int | None = None   # (g)'s digits batch (None: the recipe's, 64)
    fm_images: int = 20_000            # (h): synthetic training images per epoch (the rate is per image)
    fm_test: int = 10_000              # (h): the test set, evaluated every epoch as the recipe does
    fm_epochs: int = 3                 # (h): epoch 1 compiles and warms up, the others are the repeats
    fm_batch: int | None = None        # (h): None: the recipe's (512)
    fm_model: dict | None = None       # (h): overrides of the recipe's model (tiny: a toy ViT)
    fm_depths: tuple = ()              # (h): other depths to train the recipe at (--fm-depths): the grid's time at each
    matmul_n: int = 8192
    matmul_repeats: int = 10
    matmul_inner: int = 5
    tests: tuple = tuple(GPU_TESTS)
    test_filter: str | None = None     # pytest -k
    torchrun_train_images: int = 512
    budget: float = 360.0
    # per part, in the order they run (most wanted first: (c) is the rate gpu_hours prices with):
    # (seconds it is expected to take, seconds it may take at most). The expectations are what
    # the later parts keep in reserve, as far as the budget allows (main): the H200's figures at
    # 02d9857 (whole probe 253 s: (a) 66, (c) ~50 with its 36 s compile, (d) 37, (e) 16), and (g)'s
    # two compiles, far shorter once Inductor's FX graph cache has (b) and (c)'s.
    parts: tuple = (("c", 50, 80), ("b", 70, 120), ("a", 66, 100), ("d", 40, 110), ("h", 75, 150),
                    ("g", 30, 75), ("f", 15, 60), ("e", 16, 45))


TINY = Sizes(batch=16, model=dict(patch_size=8, embed_dim=24, depth=1, num_heads=2), warmup=2, repeats=3,
             steps_per_repeat=2, compile_backend="eager", trainer_batches=2, trainer_epochs=3,
             e2e_train=256, e2e_test=64, e2e_batch=32, e2e_epochs=3, digits_epochs=2, digits_images=128,
             same_epochs=1, same_images=128, profile_batches=1, profile_digits_images=16, profile_digits_batch=16,
             matmul_n=256, matmul_repeats=3, matmul_inner=2,
             fm_images=64, fm_test=16, fm_epochs=2, fm_batch=16,
             fm_model=dict(patch_size=7, embed_dim=12, depth=1, num_heads=3), fm_depths=(2,),
             tests=("tests/test_distributed_plan.py",), torchrun_train_images=0,
             # the plan's own tests; the two-process one starts processes (15 s on 2 cores)
             test_filter="not two_processes", budget=240.0,
             parts=(("c", 5, 60), ("b", 10, 60), ("a", 10, 60), ("d", 10, 60), ("h", 5, 60), ("g", 10, 60),
                    ("f", 5, 60), ("e", 15, 60)))


# ---- small tools: timing, limits, formatting --------------------------------------------------

T0 = time.perf_counter()


def log(msg: str) -> None:
    print(f"[probe {time.perf_counter() - T0:5.0f} s] {msg}", flush=True)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_repeats(fn, device: torch.device, *, warmup: int, repeats: int, inner: int) -> list[float]:
    """Seconds per call of fn, one figure per repeat of `inner` calls, after `warmup` calls.
    On a GPU, CUDA events on the stream: the GPU's timeline, idle gaps included (a host that
    cannot keep the GPU fed shows up as time, as it should)."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1e3 / inner)
        else:
            t = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append((time.perf_counter() - t) / inner)
    return out


class PartTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise PartTimeout in this (the main) thread after `seconds`: a part that overruns its
    share of the budget ends with a one-line error instead of eating the later parts' time."""
    def expire(signum, frame):
        raise PartTimeout(f"did not finish within its {seconds:.0f} s share of the budget")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


def table(headers: list[str], rows: list[list]) -> str:
    """A github table; cells are written as given (formatting is the caller's)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def n(x: float | None, digits: int = 0) -> str:
    return NOT_MEASURED if x is None else f"{x:,.{digits}f}"


def sig(x: float) -> str:
    """Three significant figures: TFLOP/s of an H100 (133) and of a toy model on a CPU (0.0012) alike."""
    return f"{x:.3g}"


def min_median(xs: list[float], digits: int, scale: float = 1.0) -> tuple[str, str]:
    return n(min(xs) * scale, digits), n(statistics.median(xs) * scale, digits)


def free_memory() -> None:
    """Drop what the last part left on the device, so that the next part's peak is its own."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / GiB if device.type == "cuda" else None


def extended_pythonpath() -> dict:
    """The environment for a child process: the repository put in front of PYTHONPATH, never in
    place of it (a GPU image may keep the project's packages in a folder named there)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


# ---- the recipe's model and data -----------------------------------------------------------

def load_recipe(dataset: str, sizes: Sizes) -> tuple[dict, dict, dict]:
    """(params, model shape, train settings) of params.yaml's recipe; tiny: a toy model."""
    from structinit.pipeline.load import load_params
    params = load_params(REPO / "params.yaml")
    rec = params["recipes"][dataset]
    return params, {**rec["model"], **(sizes.model or {})}, dict(rec["train"])


def train_config(train: dict, **override):
    import structinit as si
    return si.TrainConfig(**{**train, **override})


# ---- the parts -----------------------------------------------------------------------------

def machine_rows(device: torch.device, tiny: bool) -> tuple[list[list[str]], str, str]:
    """The Machine table's rows, the card's name and the short commit."""
    import timm

    def run(*cmd) -> str | None:
        try:
            r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=20)
            return r.stdout.strip() if r.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        name = props.name
        card = f"{name} ({props.total_memory / GiB:.1f} GiB, {props.multi_processor_count} SMs)"
        driver = run("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader") or "unknown (no nvidia-smi)"
        cuda = f"{torch.version.cuda} (torch's build), cuDNN {torch.backends.cudnn.version()}"
    else:
        name, driver, cuda = "the CPU", "-", "-"
        card = "none: " + name
    head = run("git", "rev-parse", "--short", "HEAD")
    dirty = run("git", "status", "--porcelain", "--untracked-files=no")
    commit = ("unknown (no git)" if head is None
              else f"{head} ({'dirty: tracked files differ from it' if dirty else 'clean'})")
    mode = TINY_LABEL if tiny else "full"
    rows = [[MODE_ROW, mode], [CARD_ROW, card], ["driver", driver], ["CUDA", cuda], ["torch", torch.__version__],
            ["timm", timm.__version__], ["Python", sys.version.split()[0]],
            [COMMIT_ROW, commit], ["CPU cores", str(os.cpu_count())]]
    return rows, name, head or "unknown"


def part_tests(device, sizes: Sizes, limit: float, tiny: bool) -> str:
    """pytest in a subprocess on the GPU-relevant files: counts from its JUnit XML."""
    import importlib.util
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", *sizes.tests, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
               f"--junitxml={xml}"]
        if sizes.test_filter:
            cmd += ["-k", sizes.test_filter]
        if not tiny and importlib.util.find_spec("xdist"):
            cmd += ["-n", str(min(8, os.cpu_count() or 1))]   # 44 s with -n 8 on the H100 machine's 16 cores
        t = time.perf_counter()
        r = subprocess.run(cmd, cwd=REPO, env=extended_pythonpath(), capture_output=True, text=True,
                           timeout=limit)
        seconds = time.perf_counter() - t
        if not xml.exists():
            tail = (r.stdout + r.stderr).strip().splitlines()
            raise RuntimeError(f"pytest exited {r.returncode} without a report: {tail[-1] if tail else ''}")
        counts, failures = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}, []
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
            kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
            counts[{"failure": "failed", "error": "errors", "skipped": "skipped", None: "passed"}[kind]] += 1
            if kind in ("failure", "error"):
                message = (next(c for c in case if c.tag == kind).get("message") or "").splitlines()
                failures.append(f"- {kind}: `{name}`: {message[0][:200] if message else ''}")
    only = f" -k '{sizes.test_filter}'" if sizes.test_filter else ""
    body = f"`{' '.join(['pytest', *sizes.tests])}{only}` ({seconds:.0f} s, exit {r.returncode})\n\n"
    body += table(["passed", "failed", "errors", "skipped"], [list(counts.values())])
    return body + ("\nFailures:\n\n" + "\n".join(failures) + "\n" if failures else "\nNo failures.\n")


def matmul_rate(device, sizes: Sizes) -> tuple[float, float]:
    """The card's bf16 matrix-product rate (TFLOP/s, max and median over repeats): what the
    step's TFLOP/s is a share of. Max: the rate the card can reach, not its clock's bad moment."""
    k = sizes.matmul_n
    a, b = (torch.randn(k, k, device=device, dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty_like(a)
    times = time_repeats(lambda: torch.matmul(a, b, out=out), device, warmup=3, repeats=sizes.matmul_repeats,
                         inner=sizes.matmul_inner)
    rates = [2 * k ** 3 / t / 1e12 for t in times]
    return max(rates), statistics.median(rates)


def plain_step(model, x, y, train: dict, device, compile_backend: str | None):
    """One training step of a plain timm module, as a straightforward script writes it: bf16
    autocast, cross-entropy with the recipe's label smoothing, clip, fused AdamW (no decay on
    1-D parameters, as the trainer)."""
    model.to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim > 1], "weight_decay": train["weight_decay"]},
              {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=train["lr"], eps=train["adam_eps"], fused=True)
    forward = torch.compile(model, backend=compile_backend) if compile_backend else model
    clip = train.get("grad_clip") or math.inf

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            logits = forward(x)
        loss = F.cross_entropy(logits.float(), y, label_smoothing=train["label_smoothing"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
    return step


class Tee(io.TextIOBase):
    """stdout that also keeps what went through it (stream None: keeps it only): the trainer
    says how it trains (stacked or one model after another, compiled or not) and its memory
    estimate in lines it prints."""

    def __init__(self, stream=None):
        self.stream, self.parts = stream, []

    def write(self, s):
        self.parts.append(s)
        return self.stream.write(s) if self.stream else len(s)

    def flush(self):
        if self.stream:
            self.stream.flush()

    def text(self) -> str:
        return "".join(self.parts)


def train_and_listen(models, data, cfgs, device, echo: bool, **kw) -> tuple[list[list[dict]], str]:
    """structinit.train_models with its log on (progress bars dropped): (histories, what it printed)."""
    import structinit as si
    tee = Tee(sys.stdout if echo else None)
    with contextlib.redirect_stdout(tee), contextlib.redirect_stderr(io.StringIO()):
        histories = si.train_models(models, data, cfgs, device=device, progress=True, **kw)
    return histories, tee.text()


def how_it_trained(said: str) -> str:
    """The trainer's own account: its 'training ...' lines, a plan to train one after another,
    a compile or a step's capture that failed."""
    keep = [line.strip() for line in said.splitlines()
            if line.startswith(("training ", "warning: torch.compile", "warning: capturing"))]
    return " / ".join(dict.fromkeys(keep)).replace("|", "/")[:400]


def trainer_step_seconds(models_n: int, spec, model_cfg: dict, train: dict, device,
                         sizes: Sizes) -> tuple[list[float], str]:
    """Seconds per step of the project's trainer for all `models_n` models, through its public
    API: train_models on a synthetic set of `trainer_batches` batches, RandAugment and flips off
    (the step alone, but for the trainer's batch gather and normalization), evaluation only after
    the last epoch (outside train_seconds anyway); one figure per epoch after the first (which
    holds the compilation on a GPU). The trainer decides how N models train: stacked, every
    model's history then carries the stack's time, or one after another (on a GPU, when one
    model's step fills it), each history its own model's time, summed here. Returns (seconds,
    what the trainer said)."""
    from structinit.pipeline.build import build_model
    data = synthetic_data(spec, sizes.trainer_batches * sizes.batch, sizes.batch)
    epochs = sizes.trainer_epochs
    cfgs = [train_config(train, epochs=epochs, batch_size=sizes.batch, eval_every=epochs, randaugment=None,
                         hflip=False, warmup_epochs=1, seed=s) for s in range(models_n)]
    models = [build_model(model_cfg, spec) for _ in range(models_n)]
    histories, said = train_and_listen(models, data, cfgs, device, echo=False)
    one_by_one = "one after another" in said
    seconds = [sum(h[e]["train_seconds"] for h in (histories if one_by_one else histories[:1]))
               / sizes.trainer_batches for e in range(1, epochs)]
    return seconds, ("one after another: " if one_by_one else "") + how_it_trained(said)


def part_step(device, sizes: Sizes, state: dict) -> str:
    from tools.gpu_hours import count_train_flops
    from structinit.data.specs import get_spec
    from structinit.pipeline.build import build_model

    _, model_cfg, train = load_recipe("cifar10", sizes)
    spec = get_spec("cifar10")
    gflop = count_train_flops(build_model(model_cfg, spec), spec.image_size, spec.channels) / 1e9
    state["gflop"] = gflop
    log(f"(b) {sig(gflop)} GFLOP per training image; the bf16 matmul rate ...")
    peak_rate, median_rate = matmul_rate(device, sizes)
    state["matmul"] = peak_rate
    log(f"(b) matmul {sizes.matmul_n}^3 bf16: max {sig(peak_rate)} TFLOP/s")
    shape = ", ".join(f"{k} {v}" for k, v in model_cfg.items())
    intro = table(["what", "value"], [
        ["model", f"ViT ({shape}), 32x32 RGB, 10 classes: params.yaml's cifar10 recipe"
                  + (", its shape made a toy's (--tiny)" if sizes.model else "")],
        [MATMUL_ROW, f"{sig(peak_rate)} / {sig(median_rate)}"],
        ["how the matmul rate was timed", f"torch.matmul of {sizes.matmul_n}^3 bf16 into a preallocated output, "
                                          f"{sizes.matmul_repeats} repeats of {sizes.matmul_inner}, "
                                          f"{'CUDA events' if device.type == 'cuda' else 'perf_counter'}"],
        [FLOPS_ROW, f"{sig(gflop)} (forward + backward, tools.gpu_hours.count_train_flops)"]])
    rows = []
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sizes.batch, spec.channels, spec.image_size, spec.image_size, generator=g).to(device)
    y = torch.randint(0, spec.num_classes, (sizes.batch,), generator=g).to(device)

    def row(label, seconds: list[float], models_n: int, how: str):
        tflops = gflop * 1e9 * sizes.batch * models_n / min(seconds) / 1e12
        peak = peak_gib(device)
        rows.append([label, models_n, sizes.batch, *min_median(seconds, 1, 1e3), sig(tflops),
                     f"{tflops / peak_rate:.3f}", n(peak, 2), how])
        log(f"(b) {label}: {min(seconds) * 1e3:.1f} ms per step, {sig(tflops)} TFLOP/s")

    out_of_time = []

    def attempt(label, fn):
        if out_of_time:                    # the alarm fires once: what is left is skipped, not unlimited
            rows.append([label, "", "", "skipped: the part's share of the budget was spent", "", "", "", "", ""])
            return
        free_memory()
        try:
            fn()
        except Exception as e:            # one row failing (out of memory, out of time) leaves the others
            rows.append([label, "", "", f"error: {one_line(e)}", "", "", "", "", ""])
            log(f"(b) {label}: {one_line(e)}")
            if isinstance(e, PartTimeout):
                out_of_time.append(label)
        free_memory()

    timing = dict(warmup=sizes.warmup, repeats=sizes.repeats, inner=sizes.steps_per_repeat)
    how_plain = (f"one fixed batch; {sizes.warmup} warm-up steps, {sizes.repeats} repeats of "
                 f"{sizes.steps_per_repeat} steps")

    def eager():
        step = plain_step(build_model(model_cfg, spec), x, y, train, device, None)
        row(EAGER_ROW, time_repeats(step, device, **timing), 1, how_plain)

    def compiled():
        step = plain_step(build_model(model_cfg, spec), x, y, train, device, sizes.compile_backend)
        try:
            t = time.perf_counter()
            step()                         # the compilation: timed apart, never in the rate
            sync(device)
            first = time.perf_counter() - t
            row(COMPILED_ROW, time_repeats(step, device, **timing), 1,
                f"the model under torch.compile (backend {sizes.compile_backend}; first step {first:.1f} s, "
                f"not counted); {how_plain}")
        finally:
            torch._dynamo.reset()          # drop the compiled graphs and what they hold

    def trainer(label, models_n):
        def run():
            seconds, said = trainer_step_seconds(models_n, spec, model_cfg, train, device, sizes)
            row(label, seconds, models_n,
                f"{said}; structinit.train_models, a synthetic set of {sizes.trainer_batches} batches, RandAugment "
                f"and flips off, {sizes.trainer_epochs} epochs: train_seconds of epochs 2-{sizes.trainer_epochs} "
                f"(of every model, where they train one after another) / steps")
        return run

    attempt(EAGER_ROW, eager)
    attempt(COMPILED_ROW, compiled)
    attempt(TRAINER_ROW, trainer(TRAINER_ROW, 1))
    stack = f"{STACK_ROW} {sizes.stack}"
    attempt(stack, trainer(stack, sizes.stack))
    steps = table(["step", "models", "batch per model", "ms per step, min", "ms per step, median",
                   "TFLOP/s (at the min)", "share of the matmul rate", "peak GiB", "how"], rows)
    return (intro + "\nbf16 autocast, fused AdamW, clip at the recipe's grad_clip, label smoothing "
            "as the recipe; TFLOP/s = counted FLOPs per image x images per step / seconds per step.\n\n" + steps)


def part_end_to_end(device, sizes: Sizes, state: dict) -> str:
    import structinit as si
    from structinit.data.specs import get_spec
    from structinit.pipeline.build import build_model
    from structinit.training.memory import estimate_training_memory

    _, model_cfg, train = load_recipe("cifar10", sizes)
    spec = get_spec("cifar10")
    batch = sizes.e2e_batch or train["batch_size"]
    data = synthetic_data(spec, sizes.e2e_train, sizes.e2e_test)
    model = build_model(model_cfg, spec)
    si.initialize(model, "trunc_normal", seed=0)
    epochs = sizes.e2e_epochs
    # the recipe as it stands (RandAugment, flips, amp auto: bf16 on a GPU); evaluation once,
    # after the last epoch: it is outside train_seconds, and every epoch's would only cost time
    cfg = train_config(train, epochs=epochs, batch_size=batch, eval_every=epochs)
    free_memory()
    before = torch.cuda.memory_allocated(device) / GiB if device.type == "cuda" else None
    histories, said = train_and_listen([model], data, [cfg], device, echo=True)
    history = histories[0]
    peak = peak_gib(device)
    printed = re.search(r"memory estimate ([\d.]+) GiB", said)
    dtype = re.search(r" in (bf16|fp32|fp16)\b", said)
    if printed:
        estimate, source = float(printed[1]), "the trainer's own line"
    else:                                  # the trainer printed none: the same call, made here
        dtype_name = dtype[1] if dtype else ("bf16" if device.type == "cuda" else "fp32")
        est = estimate_training_memory([model], data.train_images[:8].float(), batch=batch, micro_batch=None,
                                       dtype=dtype_name, data_bytes=data.train_images.nbytes + data.test_images.nbytes,
                                       test_images=sizes.e2e_test, device_type=device.type)
        estimate, source = est.total_bytes / GiB, "estimate_training_memory called by the probe (no line printed)"
    rates = [h["images_per_s"] for h in history[1:]]
    state["rate"] = history[1]["images_per_s"]
    log(f"(c) epoch 2: {history[1]['images_per_s']:.0f} img/s; peak (GiB) {n(peak, 2)}, estimate {estimate:.2f} GiB")
    ratio = f"{estimate / peak:.3f}" if peak else "- (no CUDA peak on the CPU)"
    rows = [[RATE_ROW, n(history[1]["images_per_s"]), f"training images / train_seconds of epoch 2 of {epochs}"],
            [RATES_ROW, " / ".join(min_median(rates, 0)), f"epochs 2-{epochs}"],
            [FIRST_ROW, f"{history[0]['train_seconds']:.1f}",
             "torch.compile (on a GPU), kernels, allocator, cuBLAS heuristics"],
            [PEAK_ROW, n(peak, 2), "reset before the run" + (f" ({before:.2f} GiB held before it)" if before else "")],
            [ESTIMATE_ROW, f"{estimate:.2f}", source],
            [RATIO_ROW, ratio, "tests/test_memory.py holds 1.00-1.25 on a GPU"],
            ["how the trainer trained", how_it_trained(said) or "-", "its own log line"]]
    what = (f"{sizes.e2e_train:,} train + {sizes.e2e_test:,} test synthetic uint8 images (3x32x32), "
            f"`structinit.train_models`, one model (Trunc Normal), batch {batch}, RandAugment "
            f"{train.get('randaugment')}, flips {train.get('hflip')}, precision "
            f"{dtype[1] if dtype else 'as the trainer chose'}, {epochs} epochs.\n\n")
    return what + table(["what", "value", "how"], rows)


@functools.cache
def digits_data():
    import structinit as si
    return si.prepare_dataset("digits")


def digits_cell(params, seeds, epochs: int | None, images: int | None, device, override: dict | None = None, **kw):
    """One cell of the main grid on digits, Imp.-3, as its training stage builds and trains it
    (stages/train.py): the recipe, the stratified subset, the cell's models solved here with
    the closed form (preoptimize's solver), every seed stacked (or as the trainer plans).
    override: recipe settings changed (the profile's evaluation interval); kw: train_models's
    (on_epoch_end). Returns (models, histories, solve seconds, training seconds, what the
    trainer printed)."""
    import structinit as si
    from structinit.data.tensors import stratified_subset
    from structinit.pipeline.build import CellModel, build_cell_model

    data = digits_data()
    subset = stratified_subset(data.train_labels, params["data"]["train_size"], seed=params["data"]["subset_seed"])
    if images:
        subset = subset[:images]
    train = dict(params["recipes"]["digits"]["train"])
    if epochs:
        train["epochs"] = epochs
    train.update(override or {})
    cfgs = [si.TrainConfig(**train, seed=s) for s in seeds]
    t = time.perf_counter()
    models = [build_cell_model(CellModel(dataset="digits", init="impulse3"), params, data.spec, s)[0] for s in seeds]
    solve = time.perf_counter() - t
    t = time.perf_counter()
    histories, said = train_and_listen(models, data, cfgs, device, echo=False, train_indices=subset, **kw)
    sync(device)
    return models, histories, solve, time.perf_counter() - t, said


def part_digits(device, sizes: Sizes, state: dict) -> str:
    params, _, train = load_recipe("digits", sizes)
    seeds = params["grid"]["seeds"][:5]
    _, histories, solve, seconds, said = digits_cell(params, seeds, sizes.digits_epochs, sizes.digits_images, device)
    epochs = len(histories[0])
    per_epoch = [h["seconds"] for h in histories[0][1:]]
    state["digits"] = seconds
    log(f"(d) {len(seeds)} seeds x {epochs} epochs: {seconds:.1f} s")
    accs = ", ".join(f"{h[-1]['test_acc'] * 100:.2f}" for h in histories)
    # The same cell with the step not captured (cuda_graph: off: the compiled forward's own
    # graphs, the rest eager), fewer epochs: what the whole-step graph buys per epoch.
    off_epochs = min(epochs, 20)
    _, off_histories, _, off_seconds, off_said = digits_cell(params, seeds, off_epochs, sizes.digits_images, device,
                                                             override={"cuda_graph": "off"})
    off_per_epoch = [h["seconds"] for h in off_histories[0][1:]]
    log(f"(d) the same cell, cuda_graph off, {off_epochs} epochs: {off_seconds:.1f} s")
    gain = (f"{statistics.median(off_per_epoch) / statistics.median(per_epoch):.2f}x"
            if per_epoch and off_per_epoch else NOT_MEASURED)
    return table(["what", "value"], [
        ["seeds x epochs", f"{len(seeds)} x {epochs} (batch {train['batch_size']}, evaluation every "
                           f"{train.get('eval_every', 1)} epochs, as the stage)"],
        ["the cell's training, s (train_models, warm-up included)", f"{seconds:.1f}"],
        ["seconds per epoch, epochs 2 and later: min / median (evaluation included where due)",
         " / ".join(min_median(per_epoch, 3)) if per_epoch else NOT_MEASURED],
        [f"the same with cuda_graph: off ({off_epochs} epochs): min / median",
         " / ".join(min_median(off_per_epoch, 3)) if off_per_epoch else NOT_MEASURED],
        ["the whole-step graph's gain per epoch (median off / median on)", gain],
        ["how it trained with cuda_graph: off", how_it_trained(off_said) or "-"],
        ["model-img/s, epochs 2 and later: median",
         n(statistics.median(h["images_per_s"] for h in histories[0][1:]) * len(seeds)) if per_epoch else NOT_MEASURED],
        ["Imp.-3 solves (closed form, here; the stage reads preoptimize's), s", f"{solve:.2f}"],
        ["final test acc per seed, %", accs], ["how the trainer trained", how_it_trained(said) or "-"]])


# What the main grid pays per stage beyond its epochs, measured where a GPU ran the grid
# (benchmarks/fashion_mnist_grid-h200-17f4fe7, derived in its README and docs/fashion-mnist.md):
# DVC, the process start, the data, the memory estimate and saving, ~30 s a stage; and a later
# stage's epoch 1 beyond a later epoch (Inductor's cache holds the graph), ~5 s. The probe
# measures neither (it trains in one process); (h)'s depth rows add them to its own rates.
FM_STAGE_SECONDS, FM_CACHED_FIRST_SECONDS = 30.0, 5.0
# (h)'s expected and longest seconds per depth of --fm-depths: a cold compile (~33 s for the
# recipe on the H200) and fm_epochs epochs of fm_images (~2.5 s each at the H200's rate)
FM_DEPTH_SECONDS = (45, 75)
FM_TARGET_MINUTES = 10.0               # issue 51: the main grid on one H100-class GPU as DVC runs it


def fm_cell(model_cfg: dict, seeds: list[int], cfgs: list, data, device, spec) -> dict:
    """One cell of the Fashion-MNIST recipe at `model_cfg` as the trainer trains it (its seeds
    stacked, or one after another where it plans so), Trunc Normal: its training images/s
    (epochs 2 and later, median), test-set seconds per epoch (median, on the probe's test
    images), epoch 1's seconds beyond a later one, and the trainer's account."""
    import structinit as si
    from structinit.pipeline.build import build_model

    models = [build_model(model_cfg, spec) for _ in seeds]
    for model, seed in zip(models, seeds):
        si.initialize(model, "trunc_normal", seed=seed)
    histories, said = train_and_listen(models, data, cfgs, device, echo=False)
    one_by_one = "one after another" in said
    runs = histories if one_by_one else histories[:1]        # stacked: each history has the stack's time
    epochs = len(runs[0])

    def summed(epoch, key):
        return sum(h[epoch][key] for h in runs)
    train_s = [summed(e, "train_seconds") for e in range(1, epochs)]
    evaluate_s = [summed(e, "seconds") - summed(e, "train_seconds") for e in range(1, epochs)]
    first_extra = summed(0, "seconds") - statistics.median(train_s) - statistics.median(evaluate_s)
    return {"rate": len(data.train_labels) / statistics.median(train_s), "evaluate": statistics.median(evaluate_s),
            "first_extra": first_extra, "said": said, "one_by_one": one_by_one}


def fm_grid_seconds(cell: dict, cells: int, epochs: int, test_images: int, *, as_dvc_runs_it: bool) -> float:
    """The main grid's seconds at a cell's measured rate: every epoch's training on the full set
    and its evaluation of the full test set (measured on test_images, scaled). Its cells alone
    (as_dvc_runs_it False): each cell's epoch 1 as measured here (cold). As DVC runs it: one cold
    epoch 1, the later stages' cached one, and every stage's own cost (FM_STAGE_SECONDS)."""
    from structinit.data.specs import TEST_IMAGES, TRAIN_IMAGES

    epoch = TRAIN_IMAGES["fashion_mnist"] / cell["rate"] + cell["evaluate"] * TEST_IMAGES["fashion_mnist"] / test_images
    first = max(cell["first_extra"], 0.0)
    if not as_dvc_runs_it:
        return cells * (epochs * epoch + first)
    return cells * (epochs * epoch + FM_STAGE_SECONDS) + first + (cells - 1) * min(first, FM_CACHED_FIRST_SECONDS)


def deepest_fitting(minutes: dict[int, float], target: float = FM_TARGET_MINUTES) -> int | None:
    """The deepest depth whose grid takes at most `target` minutes ({depth: minutes}); None: none does."""
    return max((d for d, m in minutes.items() if m <= target), default=None)


def part_fashion_mnist(device, sizes: Sizes, state: dict) -> str:
    from structinit.data.specs import TEST_IMAGES, TRAIN_IMAGES, get_spec
    from structinit.pipeline.cells import main_inits

    params, _, train = load_recipe("fashion_mnist", Sizes())          # the recipe's own model
    model_cfg = {**params["recipes"]["fashion_mnist"]["model"], **(sizes.fm_model or {})}
    spec, seeds, epochs = get_spec("fashion_mnist"), params["grid"]["seeds"], sizes.fm_epochs
    batch = sizes.fm_batch or train["batch_size"]
    data = synthetic_data(spec, sizes.fm_images, sizes.fm_test)
    cfgs = [train_config(train, epochs=epochs, batch_size=batch, warmup_epochs=1, eval_every=1, seed=s)
            for s in seeds]
    recipe_epochs, cells = train["epochs"], len(main_inits(params))
    cell = fm_cell(model_cfg, seeds, cfgs, data, device, spec)
    rate, one_by_one = cell["rate"], cell["one_by_one"]
    grid_min = fm_grid_seconds(cell, cells, recipe_epochs, sizes.fm_test, as_dvc_runs_it=False) / 60
    state["fashion_mnist_grid_min"] = grid_min
    log(f"(h) {rate:,.0f} cell images/s; the main grid's cells {grid_min:.1f} min")
    # the same recipe, one model alone: how a cell trains when the plan says one after another.
    # The plan stacks below FILLS_A_GPU_FLOPS per model-step, a threshold no GPU has measured
    # for this size; this row says whether stacking is the faster way here.
    alone_rate = fm_cell(model_cfg, seeds[:1], cfgs[:1], data, device, spec)["rate"]
    planned_rate = rate * len(seeds)                 # model-images/s of the cell as the trainer planned it
    planned = "one after another, as planned" if one_by_one else "stacked"
    faster = planned if planned_rate >= alone_rate else "one model alone"
    log(f"(h) one model alone {alone_rate:,.0f} images/s against {planned_rate:,.0f} model-images/s ({planned})")
    body = (f"recipes.fashion_mnist ({model_cfg}), {len(seeds)} seeds stacked as a cell (trunc_normal), batch "
            f"{batch}, {sizes.fm_images:,} synthetic training images and {sizes.fm_test:,} test images per "
            f"epoch, {epochs} epochs (evaluation every epoch).\n\n"
            + table(["what", "value"], [
                [FM_RATE_ROW, n(rate)],
                ["model-images/s (x seeds)", n(rate * len(seeds))],
                ["evaluation of the test set, s per epoch: median", f"{cell['evaluate']:.2f}"],
                ["epoch 1 beyond a later one (compile, warm-up), s", f"{cell['first_extra']:.1f}"],
                [FM_GRID_ROW, f"{grid_min:.1f}"],
                ["the grid", f"{cells} cells x {recipe_epochs} epochs x {TRAIN_IMAGES['fashion_mnist']:,} images, "
                             f"the test set ({TEST_IMAGES['fashion_mnist']:,}) every epoch"],
                ["how the trainer trained", how_it_trained(cell["said"]) or "-"],
                [FM_ALONE_ROW, n(alone_rate)],
                ["the faster way to train a cell's seeds (model-images/s)",
                 f"{faster} ({n(max(planned_rate, alone_rate))} against {n(min(planned_rate, alone_rate))})"
                 + ("; stacking was not measured (the trainer planned one after another)" if one_by_one else "")]]))
    if not sizes.fm_depths:
        return body
    # the recipe at other depths (--fm-depths), its width and heads kept: the softness law's
    # held-out check covers the shape by its grid, width and heads (depth does not enter it)
    rows, fits = [], {}
    for depth in dict.fromkeys([model_cfg["depth"], *sizes.fm_depths]):
        if depth == model_cfg["depth"]:
            at = cell
        else:
            # compiled afresh, as a stage's process compiles it (not from this process's graphs,
            # nor with the model count dynamic after the one-model cell); the cold compile is
            # charged as at least the recipe's, whose first compile nothing cached
            torch.compiler.reset()
            at = fm_cell({**model_cfg, "depth": depth}, seeds, cfgs, data, device, spec)
        charged = {**at, "first_extra": max(at["first_extra"], cell["first_extra"])}
        cells_min = fm_grid_seconds(charged, cells, recipe_epochs, sizes.fm_test, as_dvc_runs_it=False) / 60
        dvc_min = fm_grid_seconds(charged, cells, recipe_epochs, sizes.fm_test, as_dvc_runs_it=True) / 60
        fits[depth] = dvc_min
        rows.append([depth, n(at["rate"]), f"{at['first_extra']:.1f}", f"{cells_min:.1f}", f"{dvc_min:.1f}",
                     "yes" if dvc_min <= FM_TARGET_MINUTES else "no"])
        log(f"(h) depth {depth}: {at['rate']:,.0f} cell images/s; the grid as DVC runs it ~{dvc_min:.1f} min")
    state["fashion_mnist_depths_min"] = fits
    deepest = deepest_fitting(fits)
    return (body + f"\n{FM_DEPTHS_HEADING}\n\nThe recipe at other depths (`--fm-depths`; width "
            f"{model_cfg['embed_dim']} and {model_cfg['num_heads']} heads kept, so the softness law's held-out "
            f"check still covers the shape), each trained as above and compiled afresh; its epoch 1 is charged "
            f"as at least the recipe's (the first compile of this process, from an empty in-memory cache). As DVC "
            f"runs it: its cells, one cold epoch 1 "
            f"(the later stages' ~{FM_CACHED_FIRST_SECONDS:.0f} s, Inductor's cache warm) and "
            f"~{FM_STAGE_SECONDS:.0f} s per stage (DVC, the process start, the data, the memory estimate, saving: "
            "derived from the H200's grid record, benchmarks/fashion_mnist_grid-h200-17f4fe7; not measured here) "
            f"at the recipe's {recipe_epochs} epochs (provisional).\n\n"
            + table(["depth", "cell images/s", "epoch 1 beyond a later one, s", "the grid's cells, min",
                     "the grid as DVC runs it, min", f"<= {FM_TARGET_MINUTES:g} min"], rows)
            + "\n" + (f"{FM_DEEPEST_ROW}: {deepest}\n" if deepest is not None
                      else f"{FM_DEEPEST_ROW}: none of these\n"))


# ---- (g) where the time goes: one epoch of the trainer under torch.profiler --------------------

# The trainer runs PROFILE_EPOCHS epochs: 1 compiles and captures (not profiled), 2 is the
# profiler's warm-up, 3 is recorded, 4 runs unprofiled (its wall per step is the one without the
# profiler's overhead; the evaluation comes after it, outside every figure).
PROFILE_EPOCHS = 4
RECORDED_EPOCH = 3
# host calls that launch device work: a kernel each, or a whole CUDA graph
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                   "cudaLaunchCooperativeKernel")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
# kernels whose name alone says little (a template over an elementwise functor): the name gets
# the first telling identifier of its template arguments
GENERIC_KERNELS = re.compile(r"elementwise|reduce_kernel|^Kernel2?$|^kernel$|^unrolled|^vectorized")
TELLING = re.compile(r"[A-Za-z_]\w*(?:Functor|functor|_kernel|Kernel|_cuda|gemm|Op)\w*")


def _strip_groups(text: str) -> str:
    """text without its balanced <...> and (...) groups."""
    out, depth = [], 0
    for ch in text:
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


def short_kernel_name(name: str, width: int = 72) -> str:
    """A kernel's name for a table: no return type, namespaces, template arguments or parameter
    list ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>,
    ...>(...)" -> "vectorized_elementwise_kernel[CUDAFunctor_add]"), at most `width` characters,
    no "|"."""
    text = name.replace("(anonymous namespace)", "anon").strip()
    text = text[5:] if text.startswith("void ") else text
    base = _strip_groups(text).strip().split("::")[-1].strip() or text
    if GENERIC_KERNELS.search(base) and "<" in text:
        hint = next((h for h in TELLING.findall(text[text.index("<"):]) if h != base and "gpu_kernel" not in h), None)
        base += f"[{hint}]" if hint else ""
    base = base.replace("|", "/")
    return base if len(base) <= width else base[:width - 1] + "…"


def profile_summary(prof, steps: int, cuda: bool) -> dict:
    """What one recorded epoch of `steps` steps says, per step. On CUDA: the device's events
    (kernels, copies, sets) by name with their time, the kernels the device ran, and the host's
    launch calls (a kernel each, or a CUDA graph). On the CPU: aten ops by their self time (CPU
    ops, not kernels: what --tiny can show)."""
    from torch.autograd import DeviceType

    events = prof.events()
    rows: dict[str, list] = {}
    if cuda:
        device = [e for e in events if e.device_type == DeviceType.CUDA]
        kernels = [e for e in device if not e.name.startswith(("Memcpy", "Memset"))]
        for e in device:
            row = rows.setdefault(short_kernel_name(e.name), [0.0, 0, set()])
            row[0] += e.time_range.elapsed_us()
            row[1] += 1
            row[2].add(e.name)
        host = collections.Counter(e.name for e in events if e.device_type == DeviceType.CPU)
        launches = sum(host[k] for k in KERNEL_LAUNCHES)
        graphs = sum(host[k] for k in GRAPH_LAUNCHES)
        count = len(kernels)
    else:
        for avg in prof.key_averages():
            if avg.key.startswith("aten::"):
                rows[avg.key] = [avg.self_cpu_time_total, avg.count, {avg.key}]
        count = sum(r[1] for r in rows.values())
        launches = graphs = None
    total = sum(r[0] for r in rows.values())
    top = sorted(rows.items(), key=lambda kv: -kv[1][0])[:PROFILE_TOP]
    return {"steps": steps, "total_us": total / steps, "count": count / steps,
            "launches": None if launches is None else launches / steps,
            "graphs": None if graphs is None else graphs / steps,
            "top": [(name, us / steps, us / total if total else 0.0, calls / steps, len(names))
                    for name, (us, calls, names) in top]}


def profiled_training(run, steps: int, device) -> tuple[dict, list[list[dict]], str]:
    """run(on_epoch_end) trains PROFILE_EPOCHS epochs through train_models; the profiler
    records epoch RECORDED_EPOCH (CPU and CUDA activity on a GPU, CPU alone on the CPU).
    Returns (profile_summary, histories, what the trainer said)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    summary = {}

    def ready(prof):                       # after the recorded epoch, before the next one starts
        summary.update(profile_summary(prof, steps, cuda))

    with profile(activities=activities, schedule=schedule(wait=RECORDED_EPOCH - 2, warmup=1, active=1, repeat=1),
                 on_trace_ready=ready) as prof:
        def epoch_done(i, metrics):
            if i == 0:                     # model 0's epochs (every model's, stacked)
                prof.step()
        histories, said = run(epoch_done)
    if not summary:
        raise RuntimeError(f"the profiler recorded nothing (the trainer ran {len(histories[0])} epochs)")
    return summary, histories, said


def profile_body(title: str, note: str, summary: dict, history: list[dict], said: str, cuda: bool) -> str:
    """One profile's heading, its figures and its top table."""
    steps = summary["steps"]
    recorded, plain = history[RECORDED_EPOCH - 1], history[RECORDED_EPOCH]
    wall, wall_plain = recorded["train_seconds"] / steps * 1e3, plain["train_seconds"] / steps * 1e3
    busy = summary["total_us"] / 1e3
    if cuda:
        what = "kernel"
        rows = [["steps recorded", str(steps), f"epoch {RECORDED_EPOCH} of {PROFILE_EPOCHS} (1: compile and "
                 "capture, 2: the profiler's warm-up, 4: unprofiled)"],
                ["wall per step, ms (profiled)", f"{wall:.2f}", "train_seconds of the recorded epoch / steps"],
                ["wall per step, ms (unprofiled)", f"{wall_plain:.2f}",
                 f"train_seconds of epoch {PROFILE_EPOCHS} / steps"],
                ["device time per step, ms", f"{busy:.2f}", "kernels, copies and sets on the GPU, summed"],
                ["device busy, share of the wall", f"{busy / wall:.2f}" if wall else "-",
                 "device time / wall (profiled): well under 1, the host sets the pace"],
                [LAUNCHES_ROW, f"{summary['count']:.0f}", "kernels the GPU ran (CUDA kernel events) / steps"],
                ["host launch calls per step", f"{summary['launches']:.0f} kernel, {summary['graphs']:.1f} CUDA graph",
                 f"{'/'.join(KERNEL_LAUNCHES[:3])}, ... and {'/'.join(GRAPH_LAUNCHES)} calls / steps "
                 "(a graph's kernels run on one launch)"]]
        share_head, time_head = SHARE_COLUMN, "µs per step"
    else:
        what = "CPU op (aten, self time; no GPU: not kernels)"
        rows = [["steps recorded", str(steps), f"epoch {RECORDED_EPOCH} of {PROFILE_EPOCHS}"],
                ["wall per step, ms (profiled)", f"{wall:.2f}", "train_seconds of the recorded epoch / steps"],
                ["wall per step, ms (unprofiled)", f"{wall_plain:.2f}",
                 f"train_seconds of epoch {PROFILE_EPOCHS} / steps"],
                ["CPU op time per step, ms", f"{busy:.2f}", "self time of the aten ops, summed"],
                [LAUNCHES_ROW, f"{summary['count']:.0f}",
                 "on the CPU: aten op calls (CPU op events, no kernels) / steps"]]
        share_head, time_head = SHARE_COLUMN + " (CPU: of the aten ops' time)", "µs per step (CPU self)"
    rows.append(["how the trainer trained", how_it_trained(said) or "-", "its own log line"])
    top = [[i + 1, f"`{name}`", f"{us:,.1f}", f"{share * 100:.1f} %", f"{calls:g}", variants]
           for i, (name, us, share, calls, variants) in enumerate(summary["top"])]
    shown = sum(share for _, _, share, _, _ in summary["top"])
    return (f"{title}\n\n{note}\n\n" + table(["what", "value", "how"], rows) + "\n"
            + table(["#", what, time_head, share_head, "calls per step", "variants"], top)
            + f"\nThe {len(top)} listed: {shown * 100:.1f} % of the step's "
            + ("device time" if cuda else "aten op time") + ".\n")


def part_profile(device, sizes: Sizes, state: dict) -> str:
    """One ViT-T/2 step (the paper's CIFAR recipe, as (b) builds the model, RandAugment and flips
    on) and one digits-stack step (the default cell: 5 seeds of Imp.-3, as (d)), each the
    trainer's own (train_models, the step its epoch loop calls), profiled over one epoch."""
    from structinit.data.specs import get_spec
    from structinit.data.tensors import stratified_subset
    from structinit.pipeline.build import build_model
    from structinit.training.steps import steps_per_epoch

    cuda = device.type == "cuda"
    activity = "CPU and CUDA activity" if cuda else "CPU activity alone: no GPU, so CPU ops, not kernels"
    how = (f"`torch.profiler` ({activity})"
           f" over one epoch of the trainer's own loop (`structinit.train_models`): {PROFILE_EPOCHS} epochs, epoch 1 "
           f"compiles and captures (not profiled), 2 is the profiler's warm-up, {RECORDED_EPOCH} is recorded, "
           f"{PROFILE_EPOCHS} runs unprofiled; the evaluation comes after the last, outside every figure. Per step: "
           f"the recorded epoch / its steps. The {PROFILE_TOP} {'kernels' if cuda else 'ops'} with the most time, "
           "names shortened (namespaces, template arguments and parameters dropped; a generic elementwise kernel "
           "keeps its functor in brackets; `variants`: distinct full names under one short name).")
    if not cuda:
        how += " Tiny sizes on the CPU: this tests the part, it measures nothing."
    out = [how + "\n"]
    errors = []

    # ViT-T/2 with the paper's CIFAR recipe
    try:
        _, model_cfg, train = load_recipe("cifar10", sizes)
        spec = get_spec("cifar10")
        batches = sizes.profile_batches or sizes.trainer_batches
        data = synthetic_data(spec, batches * sizes.batch, sizes.batch)
        cfg = train_config(train, epochs=PROFILE_EPOCHS, batch_size=sizes.batch, eval_every=PROFILE_EPOCHS,
                           warmup_epochs=1, seed=0)
        model = build_model(model_cfg, spec)
        steps = steps_per_epoch(batches * sizes.batch, sizes.batch)
        summary, histories, said = profiled_training(
            lambda done: train_and_listen([model], data, [cfg], device, echo=False, on_epoch_end=done), steps, device)
        state["profile_vit"] = summary
        shape = ", ".join(f"{k} {v}" for k, v in model_cfg.items())
        out.append(profile_body(
            f"{PROFILE_HEADINGS['vit']}: 1 model, batch {sizes.batch}",
            f"ViT ({shape}){', a toy (--tiny)' if sizes.model else ''}, synthetic CIFAR-shaped images, the recipe as "
            f"it stands (RandAugment {train.get('randaugment')}, flips {train.get('hflip')}, amp as the trainer "
            "decides).",
            summary, histories[0], said, cuda))
        log(f"(g) ViT-T/2: {summary['count']:.0f} {'kernels' if cuda else 'CPU ops'} per step, "
            f"{summary['total_us'] / 1e3:.2f} ms {'device' if cuda else 'CPU op'} time per step")
    except Exception as e:                 # one profile failing leaves the other
        errors.append(f"{PROFILE_HEADINGS['vit']}\n\nerror: {one_line(e)}\n")
        log(f"(g) ViT-T/2: {one_line(e)}")
        if isinstance(e, PartTimeout):
            raise
    free_memory()

    # the default digits cell's stack
    try:
        params, _, dtrain = load_recipe("digits", sizes)
        seeds = params["grid"]["seeds"][:5]

        def run(done):
            # on the CPU, one chunk: the profiler records the calling thread's ops, not the chunks' threads
            override = {"eval_every": PROFILE_EPOCHS, "batch_size": batch, **({} if cuda else {"cpu_chunks": 1})}
            _, histories, _, _, said = digits_cell(params, seeds, PROFILE_EPOCHS, sizes.profile_digits_images,
                                                   device, override=override, on_epoch_end=done)
            return histories, said
        data = digits_data()
        n = len(stratified_subset(data.train_labels, params["data"]["train_size"], seed=params["data"]["subset_seed"]))
        n = min(n, sizes.profile_digits_images or n)
        batch = sizes.profile_digits_batch or dtrain["batch_size"]
        steps = steps_per_epoch(n, batch)
        summary, histories, said = profiled_training(run, steps, device)
        state["profile_digits"] = summary
        out.append(profile_body(
            f"{PROFILE_HEADINGS['digits']}: {len(seeds)} seeds of Imp.-3, batch {batch}",
            f"The default cell `train_impulse@digits-3` trains: seeds {seeds} stacked (as the trainer plans), "
            f"{n:,} training images ({steps} step(s) an epoch), the recipe's augmentation"
            + ("." if cuda else "; on the CPU in one chunk (the profiler sees the calling thread's ops alone)."),
            summary, histories[0], said, cuda))
        log(f"(g) digits stack: {summary['count']:.0f} {'kernels' if cuda else 'CPU ops'} per step, "
            f"{summary['total_us'] / 1e3:.2f} ms {'device' if cuda else 'CPU op'} time per step")
    except Exception as e:
        errors.append(f"{PROFILE_HEADINGS['digits']}\n\nerror: {one_line(e)}\n")
        log(f"(g) digits stack: {one_line(e)}")
        if isinstance(e, PartTimeout):
            raise
    if errors and len(out) == 1:
        raise RuntimeError("; ".join(e.split("error: ", 1)[1].strip() for e in errors))
    return "\n".join(out + errors)


def torchrun_job(tiny: bool) -> None:
    """What the probe runs under torchrun (--torchrun-job): the device plan, a process group on
    its backend, one all-reduce on the device, and a few steps of the trainer with the context."""
    import torch.distributed as dist

    import structinit as si
    from structinit.distributed import DistributedContext

    ctx = DistributedContext.from_env()
    plan = ctx.plan()
    device = ctx.device()
    # ctx.start() joins a group only for 2+ processes; join here so the backend itself starts
    dist.init_process_group(plan.backend)
    t = torch.full((1,), float(ctx.rank + 1), device=device)
    dist.all_reduce(t)
    said = (f"rank {ctx.rank} of {ctx.world_size}, LOCAL_RANK {ctx.local_rank}, backend {plan.backend}, "
            f"device {device}, all_reduce {t.item():g}")
    images = (TINY if tiny else Sizes()).torchrun_train_images
    if images:                             # tiny: the launcher alone (timm's import is seconds on 2 cores)
        from structinit.models.vit import create_vit
        data = si.prepare_dataset("digits")
        model = create_vit(img_size=8, patch_size=1, embed_dim=24, depth=1, num_heads=2, num_classes=10, in_chans=1)
        # compile off: the job checks the launcher, and a compilation would be most of its time
        cfg = si.TrainConfig(epochs=1, batch_size=64, warmup_epochs=0, randaugment=None, hflip=False, compile="off")
        history = si.train_models([model], data, [cfg], device=device, train_indices=torch.arange(images), ctx=ctx,
                                  progress=False)[0]
        said += f", trained {len(history)} epoch of {images} digits: train loss {history[-1]['train_loss']:.3f}"
    dist.destroy_process_group()
    print(f"torchrun job: {said}", flush=True)


def part_torchrun(device, sizes: Sizes, limit: float, tiny: bool) -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
           "-m", "benchmarks.gpu_probe", "--torchrun-job", *(["--tiny"] if tiny else [])]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=extended_pythonpath(), capture_output=True, text=True, timeout=limit)
    seconds = time.perf_counter() - t
    said = [line for line in r.stdout.splitlines() if line.startswith("torchrun job:")]
    if r.returncode != 0 or not said:
        tail = (r.stdout + r.stderr).strip().splitlines()
        raise RuntimeError(f"torchrun exited {r.returncode}: {tail[-1] if tail else 'no output'}")
    log(f"(e) {said[0]}")
    two = ("NCCL itself (2 processes, one GPU each) needs 2 GPUs: not tested here; on one GPU, "
           "STRUCTINIT_NPROC=2 is refused by design (structinit.distributed.plan_devices)")
    return table(["what", "value"], [
        ["command", "`python -m torch.distributed.run --standalone --nproc-per-node=1 -m benchmarks.gpu_probe "
                    "--torchrun-job`"],
        ["exit status", str(r.returncode)], ["wall, s (launcher and imports included)", f"{seconds:.1f}"],
        ["the job said", said[0].removeprefix("torchrun job: ")], ["two processes", two]])


def state_sha256(models) -> str:
    """sha256 of every model's state dict, keys in order, bytes as stored (any dtype)."""
    h = hashlib.sha256()
    for model in models:
        for key, t in model.state_dict().items():
            h.update(key.encode())
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def part_same_bytes(device, sizes: Sizes, state: dict) -> str:
    params, _, _ = load_recipe("digits", sizes)
    seeds = params["grid"]["seeds"][:2]
    digests = []
    for _ in range(2):
        models, *_ = digits_cell(params, seeds, sizes.same_epochs, sizes.same_images, device)
        digests.append(state_sha256(models))
        del models
    same = digests[0] == digests[1]
    state["same"] = same
    log(f"(f) same bytes: {same}")
    return table(["what", "value"], [
        ["cell", f"digits, Imp.-3, seeds {seeds}, {sizes.same_epochs} epochs, stacked, trained twice in this "
                 "process (tests/test_numerics.py runs two fresh processes)"],
        ["sha256, run 1", f"`{digests[0][:16]}...`"], ["sha256, run 2", f"`{digests[1][:16]}...`"],
        ["the same bytes", "yes" if same else "no"]])


# ---- the file --------------------------------------------------------------------------------

def render(label: str, machine: list[list[str]], bodies: dict[str, str], command: str, seconds: float | None) -> str:
    took = f" in {seconds:.0f} s" if seconds is not None else " (running: parts not yet run say so)"
    out = [f"# GPU probe: {label}\n", f"Written by `{command}`{took}. What each part measures and how: the "
           "docstring of benchmarks/gpu_probe.py.\n", SECTIONS["machine"] + "\n", table(["what", "value"], machine)]
    for key in "abcdefgh":
        out += [SECTIONS[key] + "\n", bodies.get(key, "not run yet\n")]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the file to write (default: benchmarks/gpu_probe-<card>-<commit>.md)")
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU: tests the probe, measures nothing")
    ap.add_argument("--budget", type=float, help="seconds for the whole probe (default 360; tiny 240)")
    ap.add_argument("--skip", nargs="*", default=[], choices=list("abcdefgh"), help="parts not to run")
    ap.add_argument("--fm-depths", nargs="+", type=int, metavar="DEPTH",
                    help="(h) also trains Fashion-MNIST's recipe at these depths and gives the main grid's time at "
                         "each as DVC runs it (what to cut the recipe to: docs/fashion-mnist.md)")
    ap.add_argument("--torchrun-job", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torchrun_job:
        return torchrun_job(a.tiny)
    sizes = TINY if a.tiny else Sizes()
    if a.fm_depths:
        bad = [d for d in a.fm_depths if d < 1]
        if bad:
            ap.error(f"--fm-depths {' '.join(map(str, a.fm_depths))}: depths are positive whole numbers (not {bad})")
        if "h" in a.skip:
            ap.error("--fm-depths is part (h): do not skip h")
        a.fm_depths = list(dict.fromkeys(a.fm_depths))
        # each depth is one more cell's compile and epochs: (h)'s share grows by as much
        parts = tuple((k, e + FM_DEPTH_SECONDS[0] * len(a.fm_depths), cap + FM_DEPTH_SECONDS[1] * len(a.fm_depths))
                      if k == "h" else (k, e, cap) for k, e, cap in sizes.parts)
        sizes = dataclasses.replace(sizes, fm_depths=tuple(a.fm_depths), parts=parts)
    # the depths' time is added to the budget, so the other parts keep their shares
    budget = a.budget or sizes.budget + FM_DEPTH_SECONDS[1] * len(sizes.fm_depths if a.fm_depths else ())
    import structinit as si
    device = si.default_device()
    if a.tiny:
        device = torch.device("cpu")       # toy sizes on a GPU would measure nothing either
    elif device.type != "cuda":
        sys.exit("gpu_probe: no GPU visible to torch; --tiny runs every part at toy sizes on the CPU")
    machine, card, commit = machine_rows(device, a.tiny)
    # a tiny file is no measurement: its default name (gpu_probe_<slug>) is outside the committed
    # probe files' pattern (gpu_probe-<card>-<commit>)
    slug = "tiny-cpu"
    # --fm-depths: a file of its own (the sizing of Fashion-MNIST's recipe), outside the probe
    # files gpu_hours prices from
    default = f"gpu_probe_{slug}.md" if a.tiny else probe_name(card, commit)
    if a.fm_depths and not a.tiny:
        default = default.replace("gpu_probe-", "fashion_mnist_depths-", 1)
    out = Path(a.out) if a.out else PROBES / default
    command = ("python -m benchmarks.gpu_probe" + (" --tiny" if a.tiny else "")
               + (f" --skip {' '.join(a.skip)}" if a.skip else "")
               + (f" --fm-depths {' '.join(map(str, a.fm_depths))}" if a.fm_depths else "")
               + (f" --out {a.out}" if a.out else ""))
    label = TINY_LABEL if a.tiny else f"{card}, torch {torch.__version__}, project at {commit}"
    log(f"{label}; writing {out}; budget {budget:.0f} s")
    bodies, state = {}, {}

    def write(seconds=None):            # after every part: a run cut short keeps what it measured
        out.write_text(render(label, machine, bodies, command, seconds))
    write()
    deadline = T0 + budget
    expected = dict((k, e) for k, e, _ in sizes.parts)
    runners = {"a": lambda limit: part_tests(device, sizes, limit, a.tiny),
               "b": lambda limit: part_step(device, sizes, state),
               "c": lambda limit: part_end_to_end(device, sizes, state),
               "d": lambda limit: part_digits(device, sizes, state),
               "e": lambda limit: part_torchrun(device, sizes, limit, a.tiny),
               "f": lambda limit: part_same_bytes(device, sizes, state),
               "g": lambda limit: part_profile(device, sizes, state),
               "h": lambda limit: part_fashion_mnist(device, sizes, state)}
    order = [k for k, _, _ in sizes.parts]
    for i, (key, _, cap) in enumerate(sizes.parts):
        if key in a.skip:
            bodies[key] = "skipped (--skip)\n"
            continue
        # the later parts' expectations are kept in reserve, but never at this part's cost: where
        # the budget cannot hold them all, the least wanted (last) give their share up first, and
        # are skipped when their turn finds too little left
        later = [expected[k] for k in order[i + 1:] if k not in a.skip]
        left = deadline - time.perf_counter()
        while later and left - sum(later) < expected[key]:
            later.pop()
        limit = min(cap, left - sum(later))
        if limit < expected[key] / 2:
            bodies[key] = f"skipped: {limit:.0f} s of the {budget:.0f} s budget left for it\n"
            log(f"({key}) skipped: out of budget")
            continue
        log(f"({key}) {SECTIONS[key].split(') ')[1]} (at most {limit:.0f} s)")
        free_memory()
        try:
            # subprocess parts get their timeout; the alarm is a backstop a little later
            with time_limit(limit + 5):
                bodies[key] = runners[key](limit)
        except subprocess.TimeoutExpired:
            bodies[key] = f"error: timed out after {limit:.0f} s (its share of the budget)\n"
            log(f"({key}) timed out")
        except Exception as e:
            bodies[key] = f"error: {one_line(e)}\n"
            log(f"({key}) error: {one_line(e)}")
        write()
    write(time.perf_counter() - T0)
    said = {"matmul": "bf16 matmul {:.3g} TFLOP/s", "rate": "the trainer end to end {:,.0f} img/s",
            "digits": "digits cell {:.1f} s", "same": "same bytes twice: {}",
            "fashion_mnist_grid_min": "Fashion-MNIST's grid {:.1f} min"}
    log(f"wrote {out}: " + "; ".join(f.format(state[k]) for k, f in said.items() if k in state))


if __name__ == "__main__":
    main()
