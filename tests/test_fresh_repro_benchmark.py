"""benchmarks/fresh_repro.py stays runnable: its timed `dvc repro` reads the stages DVC
announces and the dtype each stage's trainer prints, and --write's markdown says them (the
README quotes that file after a real run)."""
import subprocess
import sys

from benchmarks import fresh_repro


def test_timed_repro_attributes_each_stage_its_seconds_and_dtype(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    (repo / "dvc.yaml").write_text(
        "stages:\n"
        "  train:\n"
        "    cmd: echo 'training 5 model(s) stacked (batched) on cpu in fp32, 0.1 s' > a.txt && cat a.txt\n"
        "    outs: [a.txt]\n"
        "  report:\n"
        "    cmd: echo done > b.txt\n"
        "    deps: [a.txt]\n"
        "    outs: [b.txt]\n")
    stages, wall = fresh_repro.timed_repro(repo, "")
    assert [(name, dtype) for name, _, dtype in stages] == [("train", "fp32"), ("report", "")]
    assert all(seconds >= 0 for _, seconds, _ in stages) and wall >= sum(s for _, s, _ in stages) - 1e-6

    text = fresh_repro.report(stages, wall, "abc1234", "", fresh_repro.machine())
    assert "fresh clone of `abc1234`" in text and f"**{wall / 60:.1f} min**" in text
    assert "| train " in text and "fp32" in text and "threads" in text
    assert "cpu family" in text or "CPU" in text      # the CPU is named (family/model where Linux says)
