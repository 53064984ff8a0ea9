"""benchmarks/fresh_repro.py stays runnable: its timed `dvc repro` reads the stages DVC
announces and the dtype each stage's trainer prints, and --write's markdown says them (the
README quotes that file after a real run). On a GPU machine it writes its own file per card and
commit (--out-dir: fresh_repro-<card>-<commit>.md, from which the README takes the default's
GPU minutes), and --deadline ends a run that overruns and says it was cut short; both are
tested here with a made-up card."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import fresh_repro
from benchmarks.fresh_repro import (FRESH_GPU, fresh_repro_files, fresh_repro_name, gpu_default_run,
                                    read_fresh_repro, readme_gpu_default)

REPO = Path(__file__).resolve().parents[1]


def tiny_dvc_repo(path: Path, first_cmd: str) -> Path:
    path.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=path, check=True)
    (path / "dvc.yaml").write_text(
        "stages:\n"
        "  train:\n"
        f"    cmd: {first_cmd}\n"
        "    outs: [a.txt]\n"
        "  report:\n"
        "    cmd: echo done > b.txt\n"
        "    deps: [a.txt]\n"
        "    outs: [b.txt]\n")
    return path


def test_timed_repro_attributes_each_stage_its_seconds_and_dtype(tmp_path):
    said = "training 5 model(s) stacked (batched) on cpu in fp32, 0.1 s"
    repo = tiny_dvc_repo(tmp_path / "repo", f"echo '{said}' > a.txt && cat a.txt")
    stages, wall, complete = fresh_repro.timed_repro(repo, "")
    assert complete
    assert [(name, dtype) for name, _, dtype in stages] == [("train", "fp32"), ("report", "")]
    assert all(seconds >= 0 for _, seconds, _ in stages) and wall >= sum(s for _, s, _ in stages) - 1e-6

    text = fresh_repro.report(stages, wall, "abc1234", "", fresh_repro.machine())
    assert "fresh clone of `abc1234`" in text and f"**{wall / 60:.1f} min**" in text
    assert "| train " in text and "fp32" in text and "threads" in text
    assert "cpu family" in text or "CPU" in text      # the CPU is named (family/model where Linux says)
    assert "--write benchmarks/fresh_repro.md" in text


def test_a_deadline_ends_the_run_and_its_stages_and_the_file_says_cut_short(tmp_path):
    repo = tiny_dvc_repo(tmp_path / "repo", "sleep 120 && echo x > a.txt")
    t = time.monotonic()
    stages, wall, complete = fresh_repro.timed_repro(repo, "", timeout=8)
    assert not complete and time.monotonic() - t < 40
    assert [name for name, _, _ in stages] == ["train"]
    text = fresh_repro.report(stages, wall, "abc1234", "", fresh_repro.machine(), complete=False)
    assert "**cut short**" in text and " min**" not in text and "train (ended at the deadline, unfinished)" in text


GPU = {"cpu": "AMD EPYC", "cpu_id": "cpu family 25, model 17", "cores": 16, "cuda": True,
       "card": ("NVIDIA H200", "143771 MiB"), "cuda_version": "13.0", "threads": 16, "aten_capability": "AVX512",
       "native_bf16": True, "torch": "2.11.0+cu130"}


def test_a_gpu_run_writes_its_own_file_per_card_and_commit(tmp_path):
    """--out-dir: the file's name from the card torch sees and the clone's commit; its headline
    minutes, card, commit and date read back as readme_gpu_default reads them; no GPU: refused."""
    path = fresh_repro.out_file(tmp_path, "NVIDIA H200", "abc1234")
    assert path == tmp_path / "fresh_repro-h200-abc1234.md" == tmp_path / fresh_repro_name("NVIDIA H200", "abc1234")
    assert fresh_repro_name("NVIDIA H100 80GB HBM3", "4380d9d") == "fresh_repro-h100-80gb-hbm3-4380d9d.md"
    with pytest.raises(SystemExit, match="no GPU"):
        fresh_repro.out_file(tmp_path, None, "abc1234")
    stages = [("check_params", 4.0, ""), ("train_impulse@digits-3", 11.5, "bf16")]
    path.write_text(fresh_repro.report(stages, 276.0, "abc1234", "", GPU, command="python -m benchmarks.fresh_repro "
                                       "--target '' --out-dir benchmarks", when="2026-05-01 10:00"))
    text = path.read_text()
    assert text.startswith("`dvc repro` in a fresh clone of `abc1234`") and "**4.6 min**" in text
    assert "Machine: one NVIDIA H200 (143771 MiB), CUDA 13.0; 16 CPU cores" in text and "--out-dir benchmarks" in text
    assert read_fresh_repro(path) == {"card": "NVIDIA H200", "commit": "abc1234", "date": "2026-05-01 10:00",
                                      "minutes": 4.6}
    assert fresh_repro_files(tmp_path) == [path]


def test_the_readme_gpu_sentence_comes_from_the_newest_complete_gpu_file(tmp_path):
    not_yet = f"The default's `dvc repro` on a GPU has not been timed yet by `{FRESH_GPU}`"
    assert readme_gpu_default(tmp_path) == not_yet
    (tmp_path / "fresh_repro.md").write_text("`dvc repro` in a fresh clone of `abc1234` (...): **104.0 min**\n")
    assert gpu_default_run(tmp_path) is None                    # the CPU's file is not a GPU's
    stages = [("train_impulse@digits-3", 11.5, "bf16")]

    def write(name, wall, when, complete=True):
        (tmp_path / name).write_text(fresh_repro.report(stages, wall, name[-10:-3], "", GPU, complete=complete,
                                                        when=when))
    write("fresh_repro-h200-aaaaaaa.md", 600.0, "2026-05-01 10:00")
    write("fresh_repro-h200-bbbbbbb.md", 276.0, "2026-06-01 10:00")
    write("fresh_repro-h200-ccccccc.md", 500.0, "2026-07-01 10:00", complete=False)   # cut short: no minutes
    assert read_fresh_repro(tmp_path / "fresh_repro-h200-ccccccc.md")["minutes"] is None
    assert readme_gpu_default(tmp_path) == ("The default's `dvc repro` from a fresh clone took 4.6 minutes on one "
                                            "NVIDIA H200 (`fresh_repro-h200-bbbbbbb.md`)")

