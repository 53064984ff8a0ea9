"""Pinned CPU numerics (structinit/numerics.py): a cell's bytes depend on the pin, not on the
process, the shell's environment or the code's thread count."""
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from structinit.numerics import OPT_OUT_VAR, PINNED_CPU_ENV, cpu_numerics_mode, pin_cpu_numerics

REPO = Path(__file__).resolve().parents[1]
HAS_AVX2 = platform.machine() in ("x86_64", "AMD64") and "avx2" in Path("/proc/cpuinfo").read_text() \
    if Path("/proc/cpuinfo").exists() else False


def digest(**env_changes) -> str:
    """One epoch of the digits ViT (structured init) and ConvMixer in a fresh process: a
    SHA-256 of the final weights and losses of both (benchmarks/cpu_numerics.py's child)."""
    env = {k: v for k, v in os.environ.items()
           if k not in (*PINNED_CPU_ENV, OPT_OUT_VAR)}
    env.update(env_changes)
    out = []
    for model in ("vit", "convmixer"):
        r = subprocess.run([sys.executable, "-m", "benchmarks.cpu_numerics", "--child", model,
                            "--epochs", "1", "--threads", "0"], cwd=REPO, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        out.append(json.loads(r.stdout.strip().splitlines()[-1])["digest"])
    return " ".join(out)


@pytest.fixture(scope="module")
def pinned():
    return digest()


def test_same_cell_in_two_fresh_processes_gives_the_same_bytes(pinned):
    assert digest() == pinned


@pytest.mark.skipif(not HAS_AVX2, reason="the pin is AVX2: needs an x86-64 CPU with AVX2")
def test_generic_kernels_give_other_bytes(pinned):
    """The numbers do depend on the instruction set: forced to ATen's generic kernels with
    the pin off, the same cell's bytes differ (so the pin is what makes them equal)."""
    assert digest(**{OPT_OUT_VAR: "native", "ATEN_CPU_CAPABILITY": "default"}) != pinned


def test_the_pin_ignores_what_the_shell_asks_for(pinned):
    assert digest(ATEN_CPU_CAPABILITY="default", MKL_CBWR="COMPATIBLE", ONEDNN_MAX_CPU_ISA="SSE41",
                  OMP_NUM_THREADS="1", MKL_NUM_THREADS="1") == pinned


def test_pin_and_opt_out():
    env = {"ATEN_CPU_CAPABILITY": "default"}
    assert pin_cpu_numerics(env) == "pinned" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    assert env["MKL_CBWR"] == "AVX2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    env = {OPT_OUT_VAR: "native", "ATEN_CPU_CAPABILITY": "default"}
    assert pin_cpu_numerics(env) == "native" and env == {OPT_OUT_VAR: "native", "ATEN_CPU_CAPABILITY": "default"}
    with pytest.raises(SystemExit, match="STRUCTINIT_CPU_NUMERICS='fast': use one of"):
        cpu_numerics_mode({OPT_OUT_VAR: "fast"})
