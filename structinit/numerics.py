"""CPU numerics: the CPU's own kernels, and a record of what a run computed with.

PyTorch (ATen), MKL and oneDNN pick their code by the CPU's instruction set, and the order in
which a kernel sums depends on it. No setting makes every CPU give the same bytes at a speed
worth having: pinning all three to AVX2 (what this project once did) still left the
Intel and AMD machines' training bytes apart (the SVD/QR/lstsq behind the closed-form solve, a
weight gradient and SDPA differ under it: ../shared/numerics), and MKL's portable path that
made those ops agree cost a third of the fp32 speed, with bf16 excluded. So the pipeline uses
each CPU's best kernels, bf16 where the CPU has it (train.compute_dtype), and promises:

- bitwise: the same clone on the same CPU with the same thread count gives the same bytes
  (tests/test_pipeline.py, tests/test_faults.py);
- across CPUs: the same conclusions, and accuracies within a stated tolerance, which
  `./run.sh verify` checks after `./run.sh repro` (docs/reproducibility.md).

Nothing here changes the process: importing structinit leaves os.environ and torch's thread
count as they were. `numerics_record()` is what the reports print under "What ran".
"""
from __future__ import annotations

import platform
from pathlib import Path

def cpu_has_native_bf16() -> bool:
    """True when oneDNN runs bf16 matrix products natively (AVX512-BF16 or AMX); elsewhere
    bf16 is emulated and slower than fp32."""
    import torch

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cpu_model() -> str:
    """The CPU's model name (e.g. "AMD EPYC 9R14"), from /proc/cpuinfo where there is one."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


# The packages whose versions decide a run's bytes (the rest of constraints.txt pins what they
# need): logged beside each run's params, shown in the reports' "What ran".
RESULT_PACKAGES = ("torch", "torchvision", "timm", "numpy", "scipy", "scikit-learn", "dvc", "dvclive")


def package_versions(packages=RESULT_PACKAGES) -> str:
    """"python 3.12.3, torch 2.14.1, ...": this process's Python and installed versions (local
    build labels such as +cpu dropped: constraints.txt pins without them)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def of(name):
        try:
            return version(name).split("+")[0]
        except PackageNotFoundError:
            return "not installed"
    return ", ".join([f"python {platform.python_version()}", *(f"{p} {of(p)}" for p in packages)])


def numerics_record() -> dict:
    """What this process computes with on the CPU: model, instruction set ATen dispatches to,
    native bf16, intra-op threads, torch release."""
    import torch

    return {"cpu": cpu_model(), "aten_capability": torch.backends.cpu.get_cpu_capability(),
            "native_bf16": cpu_has_native_bf16(), "threads": torch.get_num_threads(),
            "torch": torch.__version__.split("+")[0]}
