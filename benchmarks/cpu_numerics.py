"""CPU numerics: which instruction-set settings a cell's bytes depend on, and what the pin costs.

    python -m benchmarks.cpu_numerics [--epochs 3] [--repeats 3] [--skip-timing]

Each run is a fresh process that trains one digits cell of the embedded default's recipe
(seed 0, --epochs epochs) and prints a SHA-256 of its final weights and per-epoch losses:
a ViT with the structured init (the closed-form solve included) and a ConvMixer (whose
convolutions run in oneDNN). The environments:

    pinned            the project's default (structinit/numerics.py)
    native            STRUCTINIT_CPU_NUMERICS=native: whatever this CPU picks
    generic           native with ATEN_CPU_CAPABILITY=default (no vector kernels in ATen)
    pinned - <VAR>    native with all pin variables but <VAR>: is <VAR> needed here?
    pinned, shell X   the pin with the shell (or the code) asking for something else: it must
                      not matter
    pinned ISA, N threads   the three ISA variables but N intra-op threads (ViT: 2 chunks each)
    pinned, cpu_chunks=1    the ViT's batch in one piece instead of two

A table shows each environment's digest per model, "=" where it equals the pinned one. Then,
unless --skip-timing, the pinned and native ViT runs alternate --repeats times and the last line
is `pinned/native time: min X median Y` (training seconds, so > 1 means the pin is slower).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

from structinit.numerics import OPT_OUT_VAR, PINNED_CPU_ENV

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
PIN = {k: v for k, v in PINNED_CPU_ENV.items() if k not in THREAD_VARS}   # the instruction-set part


def child(model: str, epochs: int, threads: int, chunks: str) -> None:
    import structinit as si
    import torch
    import yaml
    from structinit.numerics import check_cpu_numerics
    from structinit.build import build_model

    if threads:                              # 0: leave it to the environment (and the pin)
        torch.set_num_threads(threads)
    params = yaml.safe_load(open("params.yaml"))
    rec = params["recipes"]["digits"]
    data = si.prepare_dataset("digits")
    train = {**rec["train"], "epochs": epochs, "eval_every": epochs}
    # ConvMixer's BatchNorm cannot be chunked (cpu_chunks.py): it runs on intra-op threads
    train["cpu_chunks"] = "auto" if chunks == "auto" or model == "convmixer" else int(chunks)
    cfg = si.TrainConfig(**train, seed=0)
    if model == "vit":
        net = build_model(rec["model"], data.spec)
        si.initialize(net, "impulse", seed=0, kernel=3)
    else:
        net = si.create_convmixer(**params["convmixer_sizes"]["cm64d4k3"], num_classes=10, in_chans=1,
                                  filter_mode="learned", seed=0)
    hist = si.train_model(net, data, cfg, progress=False)
    digest = hashlib.sha256()
    for name, t in net.state_dict().items():
        digest.update(name.encode() + t.detach().cpu().contiguous().numpy().tobytes())
    digest.update(repr([h["train_loss"] for h in hist]).encode())
    print(json.dumps({"digest": digest.hexdigest()[:16], "capability": check_cpu_numerics(),
                      "seconds": sum(h["train_seconds"] for h in hist)}))


def run(env_changes: dict, model: str, epochs: int, threads: int = 2, chunks="auto") -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in (*PINNED_CPU_ENV, OPT_OUT_VAR)}
    env.update(env_changes)
    out = subprocess.run([sys.executable, "-m", "benchmarks.cpu_numerics", "--child", model,
                          "--epochs", str(epochs), "--threads", str(threads), "--chunks", str(chunks)],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--only", nargs="+", metavar="ENV", help="these environments (and pinned) only")
    ap.add_argument("--child", choices=["vit", "convmixer"], help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--chunks", default="auto", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.epochs, a.threads, a.chunks)

    from tabulate import tabulate

    native = {OPT_OUT_VAR: "native"}
    envs = {
        "pinned": ({}, 2, 2),
        "native": (native, 2, 2),
        "generic (ATEN_CPU_CAPABILITY=default)": ({**native, "ATEN_CPU_CAPABILITY": "default"}, 2, 2),
        **{f"pinned - {var}": ({**native, **{k: v for k, v in PIN.items() if k != var}}, 2, 2) for var in PIN},
        "pinned, shell asks avx512/AVX512/AVX512_CORE": (
            {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, 2, 2),
        "pinned, shell asks default, 4 threads": (
            {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "4"}, 4, 2),
        "pinned ISA, 1 thread": ({**native, **PIN}, 1, 2),
        "pinned ISA, 4 threads": ({**native, **PIN}, 4, 2),
        "pinned, cpu_chunks=1": ({}, 2, 1),
    }
    rows, first = [], {}
    only = [e for e in a.only or envs if e not in envs]
    if only:
        raise SystemExit(f"--only {only}: not an environment here; choose from {list(envs)}")
    for name, (env, threads, chunks) in envs.items():
        if a.only and name not in a.only and name != "pinned":
            continue
        row = [name]
        for model in ("vit", "convmixer"):
            r = run(env, model, a.epochs, threads, chunks)
            first.setdefault(model, r["digest"])
            row += ["=" if r["digest"] == first[model] and name != "pinned" else r["digest"], r["capability"]]
        rows.append(row)
        print(row, flush=True)
    print(tabulate(rows, headers=["environment", "ViT digest", "ATen", "ConvMixer digest", "ATen"],
                   tablefmt="github"))
    if a.skip_timing:
        return
    ratios = []
    for _ in range(a.repeats):                 # alternate, so machine load hits both alike
        pinned, unpinned = run({}, "vit", a.epochs)["seconds"], run(native, "vit", a.epochs)["seconds"]
        ratios.append(pinned / unpinned)
        print(f"pinned {pinned:.2f} s, native {unpinned:.2f} s", flush=True)
    print(f"pinned/native time: min {min(ratios):.3f} median {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
