"""The benchmarks no other test runs stay runnable: each at its smallest size, as its own
command (`python -m benchmarks.<name>`), printing the figures it exists to print. (The others
have their own tests: test_<name>_benchmark.py, test_gpu_probe.py, test_cpu_variation.py.)"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run(module: str, *args: str, timeout: int = 600) -> str:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")          # the smallest size is the CPU's
    r = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


def test_timings_prints_the_logs_the_stages_write(tmp_path):
    # the shapes stages/train.py and stages/preoptimize.py log (stages/common.log_timings)
    train = tmp_path / "results/train/digits-impulse3/seed0.json"
    train.parent.mkdir(parents=True)
    train.write_text(json.dumps({"median_images_per_s": 1234.0, "solve_seconds": 0.5, "epochs": [
        {"epoch": 1, "train_seconds": 2.0, "seconds": 2.5, "images_per_s": 1234.0}]}))
    solve = tmp_path / "artifacts/preopt/digits-3/seed0.json"
    solve.parent.mkdir(parents=True)
    solve.write_text(json.dumps({"solve_seconds": 0.25}))
    phases = tmp_path / "results/train/digits-impulse3/phases.json"
    phases.write_text(json.dumps({"seconds_since_start": {"imported": 3.3, "data": 3.5, "built": 4.0,
                                                          "training": 4.5, "trained": 30.0, "saved": None}}))
    out = run("timings", "--logs", str(tmp_path))
    assert "results/train/digits-impulse3/seed0" in out and "1234" in out
    marks = r" +\| +".join(re.escape(m) for m in ("3.3", "3.5", "4.0", "4.5", "30.0"))
    assert re.search(rf"\| results/train/digits-impulse3/phases +\| +{marks} +\| +\|", out), out
    assert re.search(r"\| artifacts/preopt/digits-3/seed0 +\| +0\.25 +\|", out), out
