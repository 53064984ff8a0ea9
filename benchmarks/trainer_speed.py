"""Trainer throughput: today's trainer against an earlier commit's, on the default digits cell.

    python -m benchmarks.trainer_speed [--baseline 896fbb7] [--dtypes fp32 bf16] [--epochs 4]
                                       [--repeats 3] [--portable] [--train-size N]

Each contender trains the default digits cell (5 seeds stacked, as `dvc repro` does) for a few
epochs in a process of its own, with its commit's code (the baseline from a `git worktree`
under .cache/), once per --dtypes entry; repeats alternate between contenders. Each child also
measures the GEMM rate for its dtype (a 1024^3 matmul and the model's own Linear shapes) and the
FLOPs of one training image. Prints model-images/s (min / median), GFLOP/s and its share of
both GEMM rates, and last `speedup: X` = median today / median baseline. --portable adds the
baseline under MKL's portable path (MKL_CBWR=COMPATIBLE with the AVX2 pin; docs/reproducibility.md).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PINNED_PORTABLE = {"STRUCTINIT_CPU_NUMERICS": "native", "ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE",
                   "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}


def child(epochs: int, data_path: str, params_path: str, amp: str = "auto", train_size: int | None = None) -> dict:
    """Runs inside the contender's process, with its commit's structinit first on sys.path.
    Imports by either layout: the package's (structinit.pipeline, structinit.training) or the
    flat one of commits before the restructure (6634bb3: structinit.build, structinit.trainer)."""
    import time

    import torch
    import yaml
    from torch.utils.flop_counter import FlopCounterMode

    import structinit as si
    try:
        from structinit.pipeline.build import build_model
        from structinit.training.trainer import train_models
    except ModuleNotFoundError:
        from structinit.build import build_model
        from structinit.trainer import train_models

    rec = yaml.safe_load(Path(params_path).read_text())["recipes"]["digits"]
    data = si.ImageData.load(data_path)
    cfgs = [si.TrainConfig(**dict(rec["train"], epochs=epochs, eval_every=epochs, amp=amp), seed=s)
            for s in range(5)]
    device = si.default_device()
    probe = build_model(rec["model"], data.spec).to(device)
    try:                      # the precision rule, where the contender has it on its own
        from structinit.training.stacked import compute_dtype
        bf16 = compute_dtype(cfgs[0], device) == "bf16"
    except ImportError:
        try:
            from structinit.training.trainer import autocast
        except ModuleNotFoundError:
            from structinit.trainer import autocast
        with autocast(cfgs[0], device):
            bf16 = torch.is_autocast_enabled(device.type)
    dtype = torch.bfloat16 if bf16 else torch.float32

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def best_seconds(op) -> float:
        """op's time: 3 warm-up calls, then the best of 7 timings of 4 calls each."""
        for _ in range(3):
            op()
        best = float("inf")
        for _ in range(7):
            sync()
            t = time.perf_counter()
            for _ in range(4):
                op()
            sync()
            best = min(best, (time.perf_counter() - t) / 4)
        return best

    # GEMM ceiling for this dtype, under this process's settings
    n = 4096 if device.type == "cuda" else 1024
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    gemm_gflops = 2 * n ** 3 / best_seconds(lambda: a @ b) / 1e9

    # GEMM rate at the model's own shapes: its Linear layers, batched over the 5 models as the
    # stack runs them ((5, rows, in) @ (5, in, out), rows = batch x tokens)
    m = rec["model"]
    width, tokens = m["embed_dim"], (data.spec.image_size // m["patch_size"]) ** 2
    rows = min(rec["train"]["batch_size"], train_size or len(data.train_labels)) * tokens
    shapes = [(width, 3 * width), (width, width), (width, 4 * width), (4 * width, width)]
    flops = seconds = 0.0
    for k, o in shapes:
        p, q = torch.randn(5, rows, k, device=device).to(dtype), torch.randn(5, k, o, device=device).to(dtype)
        flops, seconds = flops + 2 * 5 * rows * k * o, seconds + best_seconds(lambda p=p, q=q: torch.bmm(p, q))
    shape_gflops = flops / seconds / 1e9

    # FLOPs per training image: one model, forward + backward (attention unfused: the counter
    # counts its matmuls; the same FLOPs whichever kernel runs them)
    for m in probe.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    x = data.test_images[:8].float().to(device)
    with FlopCounterMode(display=False) as fc:
        probe(x).float().logsumexp(-1).sum().backward()
    flop_per_image = fc.get_total_flops() / len(x)

    models = []
    for s in range(5):
        models.append(build_model(rec["model"], data.spec))
        si.initialize(models[-1], "trunc_normal", seed=s)
    subset = torch.arange(train_size) if train_size else None
    hist = train_models(models, data, cfgs, progress=False, train_indices=subset)[0]
    rates = [h["images_per_s"] * len(models) for h in hist[1:]] or [hist[0]["images_per_s"] * len(models)]
    return {"model_images_per_s": statistics.median(rates), "gemm_gflops": gemm_gflops, "shape_gflops": shape_gflops,
            "flop_per_image": flop_per_image, "dtype": str(dtype).replace("torch.", ""),
            "device": device.type, "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "structinit": str(Path(si.__file__).parent)}


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    import platform
    return platform.processor() or platform.machine()


def worktree(rev: str) -> Path:
    """A detached worktree of `rev` under .cache/ (made once, reused)."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip()
    path = REPO / ".cache" / f"worktree-{sha}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(path), sha], cwd=REPO, check=True,
                       capture_output=True)
    return path


def run_child(code_root: Path, env_extra: dict, epochs: int, data_path: Path, amp: str,
              train_size: int | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in PINNED_PORTABLE and k != "PYTHONPATH"}
    env.update(env_extra, PYTHONPATH=str(code_root), PYTHONDONTWRITEBYTECODE="1")
    # this file's child(), loaded by path: the worktree has a benchmarks/ of its own
    script = (f"import importlib.util, json, sys; sys.path.insert(0, {str(code_root)!r}); "
              f"spec = importlib.util.spec_from_file_location('speed_child', {__file__!r}); "
              "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod); "
              f"print('RESULT ' + json.dumps(mod.child({epochs}, {str(data_path)!r}, {str(REPO / 'params.yaml')!r}, "
              f"{amp!r}, {train_size!r})))")
    r = subprocess.run([sys.executable, "-c", script], cwd=code_root, env=env, capture_output=True, text=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode or not lines:
        raise SystemExit(f"contender in {code_root} failed:\n{r.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


AMP = {"fp32": "off", "bf16": "bf16"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="896fbb7", help="the commit whose trainer is the baseline")
    ap.add_argument("--dtypes", nargs="+", choices=sorted(AMP), default=["fp32", "bf16"])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--train-size", type=int, help="train on the first N images (a quick check)")
    ap.add_argument("--portable", action="store_true", help="also the baseline under MKL_CBWR=COMPATIBLE")
    ap.add_argument("--data", type=Path, default=REPO / "data/prepared/digits.pt", help="the prepared digits")
    a = ap.parse_args(argv)
    from tabulate import tabulate

    data_path = a.data.resolve()
    if not data_path.exists():
        raise SystemExit(f"{data_path} is missing: run `./run.sh repro download@digits` first")
    base = worktree(a.baseline)
    contenders = {}
    for dtype in a.dtypes:
        contenders[f"baseline {a.baseline}, {dtype}"] = (base, {}, dtype)
        contenders[f"today, {dtype}"] = (REPO, {}, dtype)
        if a.portable:
            contenders[f"baseline {a.baseline}, {dtype}, MKL_CBWR=COMPATIBLE"] = (base, PINNED_PORTABLE, dtype)
    results = {name: [] for name in contenders}
    for r in range(a.repeats):
        for name, (root, env, dtype) in contenders.items():
            results[name].append(run_child(root, env, a.epochs, data_path, AMP[dtype], a.train_size))
            print(f"repeat {r + 1}/{a.repeats} {name}: {results[name][-1]['model_images_per_s']:.0f} "
                  "model-images/s", flush=True)
    rows = []
    for name, rs in results.items():
        rates = [x["model_images_per_s"] for x in rs]
        med, flop = statistics.median(rates), rs[0]["flop_per_image"]
        gemm = statistics.median(x["gemm_gflops"] for x in rs)
        shape = statistics.median(x["shape_gflops"] for x in rs)
        rows.append([name, rs[0]["dtype"], rs[0]["capability"], rs[0]["threads"], f"{min(rates):.0f}", f"{med:.0f}",
                     f"{med * flop / 1e9:.1f}", f"{gemm:.0f}", f"{med * flop / 1e9 / gemm:.2f}", f"{shape:.0f}",
                     f"{med * flop / 1e9 / shape:.2f}"])
    first = results[next(iter(results))][0]
    print(f"\n{cpu_model()} ({first['device']}); default digits cell, 5 seeds stacked, {a.epochs} epochs"
          f"{f', {a.train_size} images' if a.train_size else ''}, {a.repeats} alternating repeats; "
          f"{first['flop_per_image'] / 1e6:.1f} MFLOP per training image (fwd + bwd)")
    print(tabulate(rows, headers=["trainer", "dtype", "ATen ISA", "threads", "model-img/s min", "median",
                                  "GFLOP/s", "GEMM 1024^3 GFLOP/s", "fraction", "GEMM model shapes GFLOP/s",
                                  "fraction"], tablefmt="github"))
    # the speedup of the precision amp=auto runs in on this CPU (fp32 without native bf16)
    picked = "bf16" if first["device"] == "cuda" or _native_bf16() else "fp32"
    auto = picked if picked in a.dtypes else a.dtypes[0]
    speed = (statistics.median(x["model_images_per_s"] for x in results[f"today, {auto}"])
             / statistics.median(x["model_images_per_s"] for x in results[f"baseline {a.baseline}, {auto}"]))
    why = ": what amp=auto computes in here" if auto == picked else f"; amp=auto computes in {picked} here"
    print(f"speedup: {speed:.2f} ({auto}{why})")
    return speed


def _native_bf16() -> bool:
    from structinit.numerics import cpu_has_native_bf16
    return cpu_has_native_bf16()


if __name__ == "__main__":
    main()
