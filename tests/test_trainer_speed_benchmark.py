"""benchmarks/trainer_speed.py stays runnable: a tiny run (one epoch on 128 images, one repeat)
against this checkout's own HEAD as the baseline, which prints its table and `speedup:`."""
import re
import subprocess

from benchmarks import trainer_speed


def test_trainer_speed_runs_tiny_and_prints_a_speedup(digits, tmp_path, capsys):
    digits.save(tmp_path / "digits.pt")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=trainer_speed.REPO, capture_output=True,
                          text=True, check=True).stdout.strip()
    speed = trainer_speed.main(["--baseline", head, "--dtypes", "fp32", "--epochs", "1", "--repeats", "1",
                                "--train-size", "128", "--data", str(tmp_path / "digits.pt")])
    out = capsys.readouterr().out
    assert re.search(r"^speedup: \d+\.\d\d", out, re.M)
    assert f"baseline {head}, fp32" in out and "today, fp32" in out
    assert speed > 0
    # the model-shape GEMM column is filled with a rate, not left empty
    row = next(line for line in out.splitlines() if line.startswith("| today, fp32"))
    assert all(re.search(r"\d", cell) for cell in row.split("|")[5:-1])
