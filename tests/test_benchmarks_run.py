"""The benchmarks no other test runs stay runnable: each at its smallest size, as its own
command (`python -m benchmarks.<name>`), printing the figures it exists to print. (The others
have their own tests: test_<name>_benchmark.py, test_gpu_probe.py, test_cpu_variation.py.)"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run(module: str, *args: str, timeout: int = 600) -> str:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")          # the smallest size is the CPU's
    r = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *args], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@pytest.fixture(scope="module")
def digits_file(tmp_path_factory, digits) -> str:
    path = tmp_path_factory.mktemp("data") / "digits.pt"
    digits.save(path)
    return str(path)


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


def test_preopt_compares_the_official_loop_and_the_closed_form():
    out = run("preopt", "--repeats", "1", "--steps", "20")
    assert "official loop, 20 steps" in out and "closed form" in out and "ViT-B/16" in out
    assert out.strip().splitlines()[-1].startswith("ratio: ")


def test_amp_agreement_pairs_fp32_and_bf16(tmp_path):
    out = run("amp_agreement", "--epochs", "1", "--seeds", "0", "--inits", "trunc_normal",
              "--json", str(tmp_path / "runs.json"))
    assert "trunc_normal seed 0: fp32 " in out and "paired fp32 - bf16" in out
    assert (tmp_path / "runs.json").exists()


def test_stacked_throughput_prints_the_ratio(digits_file):
    out = run("stacked_throughput", "--data", digits_file, "--stacks", "1", "--ratio-models", "1", "--epochs", "1",
              "--repeats", "1")
    assert out.strip().splitlines()[-1].startswith("ratio: ")


def test_train_throughput_prints_the_ratio(digits_file):
    out = run("train_throughput", "--data", digits_file, "--epochs", "1", "--repeats", "1", "--workers", "0")
    assert out.strip().splitlines()[-1].startswith("ratio: ")


def test_reference_solve_speed_compares_one_by_one_and_stacked():
    out = run("reference_solve_speed", "--repeats", "1", "--steps", "20", "--seeds", "0", "1", "--kernels", "3")
    assert "one by one (before)" in out and "stacked (now)" in out and "same bits: yes" in out
    assert out.strip().splitlines()[-1].startswith("ratio: ")


def test_stage_startup_times_a_stage_import_and_check_params():
    out = run("stage_startup", "--repeats", "1", "--stages", "check_params")
    assert "| import stages.check_params |" in out and "| check_params (whole stage) |" in out, out
    assert "load average" in out
