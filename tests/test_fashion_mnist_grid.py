"""A GPU dataset's grid through DVC (tools/fashion_mnist.py --grid), tiny, on the CPU: its frozen
train_gpu_* stages run unfrozen for the run, are frozen again after, and their committed cells
are what a CPU's pipeline then reads, never trains. Needs Fashion-MNIST's real files (its
SHA-256 check admits no others): Debian's package, or the four .gz in datasets/fashion_mnist/."""
import shutil
import subprocess
import sys

import pytest
import yaml

from structinit.data import fashion_mnist as fm
from structinit.pipeline.load import load_params
from tools import fashion_mnist as tool
from structinit.pipeline import scratch

REPO = tool.REPO
SOURCES = [p for p in (REPO / "datasets/fashion_mnist", fm.DEBIAN_FOLDER)
           if all((p / f"{name}.gz").is_file() or (p / name).is_file() for name in fm.FILES)]
pytestmark = pytest.mark.skipif(not SOURCES, reason="Fashion-MNIST's files are not here (datasets/fashion_mnist/ "
                                                    "or Debian's package dataset-fashion-mnist)")


def tiny_params(path):
    p = yaml.safe_load(path.read_text())
    p["grid"].update(seeds=[0, 1], baselines=["trunc_normal"], kernels=[3])
    p["contrasts"]["secondary"] = []
    p["data"]["train_size"] = 200
    p["recipes"]["fashion_mnist"]["model"].update(patch_size=4, embed_dim=12, depth=1)
    p["recipes"]["fashion_mnist"]["train"].update(epochs=1, batch_size=50, randaugment=None)
    for study in p["studies"].values():
        study["datasets"] = []
    p["studies"]["data_size"].update(inits=["trunc_normal", "impulse3"], seeds=[0])
    p["studies"]["data_size"]["gpu"] = {"datasets": [], "fractions": [0.5]}
    path.write_text(yaml.safe_dump(p, sort_keys=False))


def test_the_grid_runs_unfrozen_then_freezes_and_a_cpu_only_reads_it(tmp_path):
    with scratch.Scratch("fashion-mnist-grid") as s:
        scratch.copy_working_tree(s.repo)
        for f in SOURCES[0].iterdir():
            if f.name.split(".")[0] in fm.FILES:
                shutil.copy2(f, s.repo / "datasets/fashion_mnist" / f.name)
        tiny_params(s.repo / "params.yaml")
        scratch.commit(s.repo)
        env = scratch.pipeline_env(s.repo, STRUCTINIT_ALLOW_CPU="1")
        run = subprocess.run([sys.executable, "-m", "tools.fashion_mnist", "--grid", "--root", str(s.repo)],
                             cwd=s.repo, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        listed = load_params(s.repo / "params.yaml")
        assert listed["grid"]["gpu_datasets"] == listed["studies"]["data_size"]["gpu"]["datasets"] == ["fashion_mnist"]
        sized = s.repo / "results/studies/data_size/fashion_mnist-0.5-impulse3/seed0"
        logged = yaml.safe_load((sized / "params.yaml").read_text())
        assert (sized / "metrics.json").exists() and logged["train_images"] == 100 and logged["match_steps"]
        cells = {c: s.repo / "results/train" / f"fashion_mnist-{c}" for c in ("trunc_normal", "impulse3")}
        for cell in cells.values():
            assert (cell / "seed0/metrics.json").exists() and (cell / "seed1/metrics.json").exists()
        # frozen again: a CPU's repro of them trains nothing, and DVC reports them up to date
        stages = yaml.safe_load((s.repo / "dvc.yaml").read_text())["stages"]
        gpu_stages = ("train_gpu_baseline", "train_gpu_impulse", "study_data_size_gpu", "analyze_gpu")
        assert all(stages[n]["frozen"] is True for n in gpu_stages)
        lock = yaml.safe_load((s.repo / "dvc.lock").read_text())["stages"]
        assert {"train_gpu_baseline@fashion_mnist-trunc_normal", "train_gpu_impulse@fashion_mnist-3",
                "analyze_gpu@fashion_mnist",
                "study_data_size_gpu@fashion_mnist-0.5-trunc_normal", "study_data_size_gpu@fashion_mnist-0.5-impulse3"
                } <= set(lock)
        status = scratch.run_dvc(s.repo, "status", "train_gpu_baseline", "train_gpu_impulse", "analyze_gpu", env=env,
                                 log=s.root / "status.log")
        assert status == 0 and "changed" not in (s.root / "status.log").read_text()
        before = (cells["trunc_normal"] / "seed0/metrics.json").read_bytes()
        assert scratch.run_dvc(s.repo, "repro", "train_gpu_baseline@fashion_mnist-trunc_normal", env=env,
                               log=s.root / "repro.log") == 0
        assert "frozen" in (s.root / "repro.log").read_text()
        assert (cells["trunc_normal"] / "seed0/metrics.json").read_bytes() == before
        report = next((s.repo / "benchmarks").glob("fashion_mnist_grid-*.md")).read_text()
        assert "stage start-ups included" in report and "| trunc_normal |" in report
        # each stage's phases (stages/train.py's marks): before training, epochs, after, DVC
        row = next(line for line in report.splitlines() if line.startswith("| train_gpu_baseline@fashion_mnist-trunc"))
        cols = [c.strip() for c in row.strip("|").split("|")]
        assert "-" not in cols[2:], row                                  # it ran here: every phase is its own
        before, training, epochs, after, dvc = (float(c) for c in cols[2:])
        assert before > 0 and training >= epochs > 0 and after >= 0 and dvc >= 0, row
        # a copy of it carries the committed cells (frozen outputs) with their lock entries
        copy = scratch.copy_working_tree(tmp_path / "copy", root=s.repo)
        assert (copy / "results/train/fashion_mnist-impulse3/seed1/metrics.json").exists()
        assert "train_gpu_impulse@fashion_mnist-3" in yaml.safe_load((copy / "dvc.lock").read_text())["stages"]
        assert (copy / "results/analysis_gpu/fashion_mnist.pt").read_bytes() == (
            s.repo / "results/analysis_gpu/fashion_mnist.pt").read_bytes()
        assert "analyze_gpu@fashion_mnist" in yaml.safe_load((copy / "dvc.lock").read_text())["stages"]
        # the reports' column: the main table over the committed digits cells and these
        from structinit.reporting.main_report import main_reports

        for folder in ("results/preopt", "results/reference", *(f"results/train/{c.name}" for c in
                                                                 (REPO / "results/train").glob("digits-*"))):
            shutil.copytree(REPO / folder, s.repo / folder, dirs_exist_ok=True)
        params = load_params(s.repo / "params.yaml")
        out = main_reports(params, s.repo / "results/train", s.repo / "results/preopt", s.repo / "results/reference",
                           tmp_path / "figures")
        table = out.texts["main_table.md"]
        header = next(line for line in table.splitlines() if line.startswith("| Method"))
        assert "digits: ours" in header and "fashion_mnist: ours" in header, header
        assert "fashion_mnist: Computed in " in table and "digits: Computed in " in table
        assert "fashion_mnist: the paper's recipe, departing in" in table
        assert set(out.summary) == {"digits", "fashion_mnist"}                 # dvc metrics: both columns
        assert out.summary["fashion_mnist"]["primary"]["n"] == 2
        assert "fashion_mnist" in set(out.runs.dataset)
        # ... and the attention report's section, from the compact analysis alone (no weights, no
        # representations here: a fresh clone's); the digits section needs the analyze stages'
        # outputs, which a clone lacks, so this report is of the GPU dataset alone
        from structinit.reporting.attention_report import attention_report

        analysis = s.repo / "results/analysis_gpu/fashion_mnist.pt"
        assert analysis.exists() and analysis.stat().st_size < 200_000
        alone = {**params, "grid": {**params["grid"], "datasets": []}}
        text = attention_report(alone, tmp_path / "no-analyses", s.repo / "results/train", tmp_path / "att",
                                gpu_analysis=s.repo / "results/analysis_gpu")
        assert "## fashion_mnist" in text and "is not analysed" not in text
        assert "### CKA (test images)" in text and "analyze_gpu on the GPU machine for fashion_mnist" in text
        assert (tmp_path / "att/cka_between_inits_fashion_mnist.png").exists()
        assert "fashion_mnist: the paper's recipe" in text and "Computed in " in text
        # ... and the data-size study's: its own sizes, the 100 % points its main cells
        from structinit.reporting.study_reports import data_size

        sizes = data_size(params, s.repo / "results/train", s.repo / "results/studies", tmp_path / "data_size.md",
                          tmp_path / "figures")
        assert "fashion_mnist" in sizes and "100 images (50 %)" in sizes and "200 images (100 %)" in sizes
        # beside digits' own sizes (its committed study cells), each dataset's columns its own
        shutil.copytree(REPO / "results/studies/data_size", s.repo / "results/studies/data_size", dirs_exist_ok=True)
        params["studies"]["data_size"].update(datasets=["digits"], fractions=[0.1])
        both = data_size(params, s.repo / "results/train", s.repo / "results/studies", tmp_path / "data_size.md",
                         tmp_path / "figures")
        rows = [line for line in both.splitlines() if line.startswith("| digits") or line.startswith("| fashion")]
        assert any("(10 %)" in r for r in rows if r.startswith("| digits"))
        assert not any("(50 %)" in r for r in rows if r.startswith("| digits"))
        assert any("(50 %)" in r for r in rows if r.startswith("| fashion_mnist"))
        assert "fashion_mnist: the paper's recipe" in both and "digits: the paper's recipe" in both
