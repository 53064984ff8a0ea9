"""Pinned CPU numerics: the same seed gives the same bytes on any x86-64 CPU with AVX2.

PyTorch's own kernels (ATen), MKL and oneDNN each pick their code path by the CPU's
instruction set, and AVX-512 code sums in a different order than AVX2 code. Training
amplifies the last-bit differences (one digits cell moved by 10 accuracy points between two
machines), so an unpinned run reproduces nobody's dvc.lock but its own machine's. Pinned, all
three use their AVX2 code on every x86-64 CPU that has it (Intel since 2013, AMD since 2015),
and CPU work runs on PINNED_THREADS intra-op threads whatever the core count: how a
convolution or a matrix product splits its sums between threads changes the bytes too.
`python -m benchmarks.cpu_numerics` shows that each setting is needed (ATen, MKL and oneDNN
each change some cell's bytes; so does the thread count) and what the pin costs in speed.

`import structinit` pins the process (os.environ, overriding the shell's values) before any
kernel runs: the libraries read these variables on first use, not at import; the trainer and
the solvers also set torch's thread count (use_pinned_threads).

Opt-out for speed: STRUCTINIT_CPU_NUMERICS=native leaves the variables as the shell set them;
results then depend on the CPU. GPUs are not affected either way (not bit-exact; README).
"""
from __future__ import annotations

import os

PINNED_CPU_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",   # PyTorch's own kernels (elementwise ops, softmax, reductions)
    "MKL_CBWR": "AVX2",              # MKL's conditional numerical reproducibility (fp32 GEMM)
    "ONEDNN_MAX_CPU_ISA": "AVX2",    # oneDNN (convolutions, matrix products)
    "OMP_NUM_THREADS": "2",          # = PINNED_THREADS, for work that runs before the trainer sets it
    "MKL_NUM_THREADS": "2",
}
PINNED_THREADS = 2                   # the reference machines' core count: the default's speed there
OPT_OUT_VAR = "STRUCTINIT_CPU_NUMERICS"
MODES = ("pinned", "native")


def cpu_numerics_mode(environ=os.environ) -> str:
    mode = environ.get(OPT_OUT_VAR, "pinned") or "pinned"
    if mode not in MODES:
        raise SystemExit(f"{OPT_OUT_VAR}={mode!r}: use one of {MODES} (pinned is the default)")
    return mode


def pin_cpu_numerics(environ=os.environ) -> str:
    """Set the pinned instruction set in `environ` unless the user opted out; returns the mode."""
    mode = cpu_numerics_mode(environ)
    if mode == "pinned":
        environ.update(PINNED_CPU_ENV)
    return mode


def use_pinned_threads() -> None:
    """Pinned mode: torch runs PINNED_THREADS intra-op threads (the bytes depend on it)."""
    if cpu_numerics_mode() == "pinned":
        import torch

        check_cpu_numerics()
        if torch.get_num_threads() != PINNED_THREADS:
            torch.set_num_threads(PINNED_THREADS)


def check_cpu_numerics() -> str:
    """After torch is imported: the instruction set ATen actually dispatches to. Raises when
    the pin was asked for but ATen had already chosen another one (a kernel ran before
    `import structinit`; import structinit first)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()   # e.g. "AVX2", "AVX512", "DEFAULT"
    if (cpu_numerics_mode() == "pinned" and capability not in ("AVX2", "DEFAULT")
            and _is_x86()):
        raise RuntimeError(
            f"CPU numerics are pinned to AVX2 but PyTorch already dispatches to {capability}: "
            "a kernel ran before `import structinit` set the pin. Import structinit before "
            f"running any torch op, or set {OPT_OUT_VAR}=native to run unpinned.")
    return capability


def _is_x86() -> bool:
    import platform

    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
