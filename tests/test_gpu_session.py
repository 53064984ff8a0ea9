"""benchmarks/gpu_session.py, the GPU window, end to end at toy sizes on the CPU: it writes at
most 6 files as it goes, ends itself before its limit, resumes the budget from what a run
finished, and its packing and adopting put the right files in the right places."""
import gzip
import hashlib
import subprocess
import sys
import tarfile
import time

import pandas as pd
import pytest

from benchmarks import gpu_session as gs
from structinit.data import fashion_mnist as fm

REPO = gs.REPO


def window(out, limit):
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_session", "--tiny", "--limit", str(limit), "--out",
                        str(out)], cwd=REPO, capture_output=True, text=True, timeout=limit + 60)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return time.monotonic() - t, r.stdout


def test_the_window_runs_its_steps_writes_as_it_goes_and_resumes(tmp_path):
    out = tmp_path / "out"
    _, said = window(out, 240)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["cuda_tests.txt", "epochs.csv", "epochs.md", "session.log", "window.md"] and len(files) <= 6
    md = (out / "window.md").read_text()
    assert md.startswith("# GPU window: ") and "tiny (CPU): not a measurement" in md
    # (a): the graph's check was selected and, with no CUDA here, skipped (and said so)
    assert "test_on_cuda_the_replayed_step_trains_as_the_eager_one" in (out / "cuda_tests.txt").read_text()
    assert "The CUDA graph: SKIPPED (no CUDA device" in md
    # (b): every arm at B and 2B, the primary pair first, each arm's pair together
    curves = pd.read_csv(out / "epochs.csv")
    runs = list(dict.fromkeys(zip(curves.init, curves.budget)))
    assert runs[:4] == [("impulse3", 1), ("impulse3", 2), ("trunc_normal", 1), ("trunc_normal", 2)]
    assert len(runs) == 2 * curves.init.nunique() and "budget: measured" in (out / "session.log").read_text()
    assert "next, the grid's missing cells: not built yet" in md
    # a second window resumes: it trains none of what the first one finished
    before = (out / "epochs.csv").read_bytes()
    window(out, 240)
    assert (out / "epochs.csv").read_bytes() == before
    assert (out / "session.log").read_text().count("already") == len(runs)


def test_the_window_ends_itself_before_its_limit_and_says_what_it_cut(tmp_path):
    out = tmp_path / "out"
    wall, _ = window(out, gs.MARGIN + 6)           # 6 s: the tests are cut, the budget never starts
    assert wall < gs.MARGIN + 6
    log = (out / "session.log").read_text()
    assert "(a) the CUDA-only tests: cut at its limit" in log or "(a) the CUDA-only tests: not started" in log
    assert "(b) the budget: not started" in log
    md = (out / "window.md").read_text()
    assert "- (b) the budget at B and 2B on the validation split, 0 s, not started: not reported" in md


def test_adopt_puts_the_records_and_the_budget_where_they_are_committed(tmp_path):
    back = tmp_path / "back"
    back.mkdir()
    (back / "window.md").write_text("# GPU window: NVIDIA H200, commit abc1234\n\nrest\n")
    for name in ("session.log", "cuda_tests.txt", "epochs.csv", "epochs.md"):
        (back / name).write_text(name)
    assert gs.adopt(back, root=tmp_path) == 0
    records = tmp_path / "benchmarks/gpu_window-h200-abc1234"
    assert sorted(p.name for p in records.iterdir()) == ["cuda_tests.txt", "session.log", "window.md"]
    budget = tmp_path / "results/evidence/fashion_mnist_budget"
    assert (budget / "epochs.csv").read_text() == "epochs.csv" and (budget / "epochs.md").exists()
    (back / "window.md").write_text("something else\n")
    with pytest.raises(SystemExit, match="does not start with"):
        gs.adopt(back, root=tmp_path)


def test_pins_take_constraints_versions_and_name_an_unpinned_package(tmp_path):
    constraints = tmp_path / "c.txt"
    constraints.write_text("# pins\nruamel.yaml==0.18.1\nzc.lockfile==3.0\n")
    assert gs.pins(["ruamel-yaml", "zc.lockfile"], constraints) == ["ruamel.yaml==0.18.1", "zc.lockfile==3.0"]
    with pytest.raises(SystemExit, match=r"\['dvc'\], which constraints.txt does not pin"):
        gs.pins(["dvc"], constraints)
    assert len(gs.pins([n for n in gs.WHEELS.read_text().split("\n")[1:] if n.strip()])) > 50   # the real list


HAVE_FM = all(any((f / f"{n}.gz").is_file() or (f / n).is_file() for f in gs.FM_ROUTES) for n in gs.FM_FILES)


@pytest.mark.skipif(not HAVE_FM, reason="Fashion-MNIST's files are not here (datasets/fashion_mnist/ or Debian's)")
def test_pack_builds_the_wheels_a_shallow_git_and_the_checked_data_and_prints_the_size(tmp_path, capsys):
    asked = []

    def download(requirements, dest):             # the registry stands aside: one small file per package
        asked.extend(requirements)
        for req in requirements:
            (dest / f"{req.split('==')[0]}.whl").write_bytes(b"w")

    code = gs.pack(tmp_path / "pack", download=download)
    said = capsys.readouterr().out
    assert code == 0 and "in all:" in said and "python3 -m benchmarks.gpu_session --limit 570" in said
    assert "dvc" in {r.split("==")[0] for r in asked} and all("==" in r for r in asked)
    with tarfile.open(tmp_path / "pack/git.tar.gz") as tar:
        assert ".git/HEAD" in tar.getnames() and ".git/shallow" in tar.getnames()
    for name, (digest, size) in fm.FILES.items():     # what the loader checks, on the bytes sent
        data = gzip.decompress((tmp_path / "pack/fashion_mnist" / f"{name}.gz").read_bytes())
        assert len(data) == size and hashlib.sha256(data).hexdigest() == digest
    total = float(said.split("in all:")[1].split("MiB")[0])
    assert total <= gs.CARRY_MIB
