"""The regime study (beyond the paper; off the default): its frozen evidence stage, regime
(stages/regime.py), runs its own cells on top of the main grid's, in a scratch copy, and keeps
what it found in its output folder."""
import csv
import json
import subprocess
import sys

import pytest
import yaml

from tests.test_pipeline import set_params, sh, tiny_repo_copy
from structinit.reporting.regime_report import arm_label, _solved_for

OTHER_STUDIES_OFF = {f"studies.{s}.datasets": [] for s in ("convmixer", "pseudo_input", "heads_width", "data_size")}


def test_the_default_keeps_the_regime_study_off_with_its_primary_fixed():
    """Off the default (no stage of it runs in `dvc repro`); its primary fixed in params.yaml;
    its sharper arm at ViT-T/2 on CIFAR's mass by the softness law (256 tokens, C 192, 3 heads)."""
    from structinit.init.softness import official_target_mass

    params = yaml.safe_load(open("params.yaml"))
    r = params["studies"]["regime"]
    assert r["datasets"] == [] and r["contrasts"]["primary"] == "imp3_m030 vs trunc_normal"
    m030 = next(a for a in r["arms"] if a["name"] == "imp3_m030")["options"]["target_mass"]
    assert abs(m030 - official_target_mass(256, 192, 3)) < 1e-4
    assert set(r["shared_seeds"]) <= set(params["grid"]["seeds"]) and len(r["shared_seeds"] + r["own_seeds"]) == 10
    assert arm_label(params, "imp3_m030") == "Imp.-3 at mass 0.2955"
    assert arm_label(params, "trunc_normal") == "Trunc Normal"
    assert _solved_for(params, "digits", "impulse3") == "0.107 (softness law)"
    assert _solved_for(params, "digits", "trunc_normal") == "-"


# slow: minutes of dvc repro (pytest -m slow); the default suite keeps tests/test_pipeline.py's tiny repro
@pytest.mark.slow
def test_the_regime_study_trains_only_its_own_cells_and_reports_mass_norms_and_contrasts(tmp_path):
    repo = tiny_repo_copy(tmp_path)
    arm = {"name": "imp3_m060", "init": "impulse", "options": {"kernel": 3, "target_mass": 0.6}}
    set_params(repo, **OTHER_STUDIES_OFF, **{
        "grid.kernels": [3], "grid.seeds": [0, 1], "recipes.digits.train.eval_every": 1,
        "studies.regime.arms": [arm], "studies.regime.shared_seeds": [0, 1], "studies.regime.own_seeds": [2],
        "studies.regime.contrasts": {"alpha": 0.05, "primary": "imp3_m060 vs trunc_normal",
                                     "secondary": ["impulse3 vs trunc_normal"],
                                     "speed": {"fraction": 0.125, "primary": "imp3_m060 vs trunc_normal"}}})
    sh(repo, "git", "commit", "-qam", "regime")
    sh(repo, "dvc", "repro", "aggregate", "analyze_baseline", "analyze_impulse")    # the main grid, analyzed
    main_acc = json.loads((repo / "results/train/digits-trunc_normal/seed1/metrics.json").read_text())

    out = sh(repo, sys.executable, "-m", "stages.regime", "--out", "ev")
    ran = [line.split("'")[1] for line in out.stdout.splitlines() if line.startswith("Running stage '")]
    # the study's own cells alone: the reused arms' seed 2, the new arm's both seed lists; nothing of the main grid
    assert sorted(s for s in ran if s.startswith("study_regime")) == [
        "study_regime@digits-arm0-own", "study_regime@digits-arm0-shared",
        "study_regime_reused@digits-impulse3", "study_regime_reused@digits-trunc_normal"]
    assert not [s for s in ran if s.startswith(("train_", "analyze_baseline", "analyze_impulse", "preoptimize"))]
    assert out.stdout.strip().splitlines()[-1].startswith("primary: imp3_m060 - trunc_normal = ")

    rows = list(csv.DictReader(open(repo / "ev/runs.csv")))
    assert [(r["arm"], int(r["seed"])) for r in rows] == [
        (a, s) for a in ("trunc_normal", "impulse3", "imp3_m060") for s in (0, 1, 2)]
    by = {(r["arm"], int(r["seed"])): r for r in rows}
    # reused seeds are the main grid's runs, the others the study's own
    assert by["trunc_normal", 1]["run"] == "results/train/digits-trunc_normal/seed1"
    assert by["trunc_normal", 2]["run"] == "ev/results/digits-trunc_normal-own/seed2"   # kept
    assert abs(float(by["trunc_normal", 1]["acc"]) - 100 * main_acc["final_test_acc"]) < 1e-3   # 6 digits kept
    for s in (0, 1, 2):
        sharp, law = by["imp3_m060", s], by["impulse3", s]
        assert abs(float(sharp["pseudo_at_init"]) - 0.6) < 0.05 * 0.6                # solved for 0.6
        assert float(sharp["pseudo_at_init"]) > 2 * float(law["pseudo_at_init"])     # the law's is smaller
        assert float(sharp["images_at_init"]) > float(law["images_at_init"])
        assert float(sharp["wq_at_init"]) > float(law["wq_at_init"])                # sharper needs larger W_q
        # Trunc Normal has no offsets: measured on Imp.-3's of the same seed, near uniform (1/64)
        assert by["trunc_normal", s]["offsets_of"] == "impulse3" and by["impulse3", s]["offsets_of"] == "impulse3"
        assert float(by["trunc_normal", s]["pseudo_at_init"]) < 0.5 * float(law["pseudo_at_init"])
        assert int(by["trunc_normal", s]["images"]) == int(law["images"]) > 0
    assert (repo / "ev/results/digits-imp3_m060-own/seed2/metrics.json").exists()
    kept = json.loads((repo / "ev/conclusions.json").read_text())   # the verdicts, as data
    assert [c["role"] for c in kept["conclusions"] if ", epoch" not in c["id"]][:2] == ["primary", "secondary"]

    text = (repo / "ev/regime.md").read_text()
    assert "## Regime study on digits" in text and "### In one line" in text
    assert "Imp.-3 at mass 0.6 − Trunc Normal" in text and "n = 3 paired" in text
    assert "Detectable with this design" in text and "test acc at epoch 1" in text
    assert f"the first {law['images']} test images" in text and "on Imp.-3's offsets of the same seed" in text
    assert (repo / "ev/regime.png").exists() and "Figure: `ev/regime.png`" in text
    assert "fixed in params.yaml since commit" in text or "not yet in a commit of params.yaml" in text
    record = json.loads((repo / "ev/inputs.json").read_text())      # what it was made from: the reused cells
    assert set(record["inputs"]) == {"results/train/digits-trunc_normal", "results/train/digits-impulse3"}


def test_the_figure_puts_each_arm_at_its_mean_mass_with_its_mean_accuracy():
    import pandas as pd
    from structinit.reporting.figures.regime import regime_figure

    runs = pd.DataFrame({"arm": ["trunc_normal"] * 3 + ["imp3_m060"] * 3, "seed": [0, 1, 2] * 2,
                         "images_at_init": [0.01, 0.02, 0.03, 0.30, 0.40, 0.50],
                         "acc": [95.0, 96.0, 97.0, 93.0, 94.0, 95.0],
                         "speed_acc": [40.0, 42.0, 44.0, 80.0, 82.0, 84.0]})
    fig = regime_figure(runs, str.upper, "digits", 160, 20)
    final, speed = fig.axes[:2]
    points = [(c.lines[0].get_xdata()[0], c.lines[0].get_ydata()[0]) for c in final.containers]
    assert [tuple(round(v, 6) for v in p) for p in points] == [(0.02, 96.0), (0.4, 94.0)]
    assert [round(c.lines[0].get_ydata()[0], 6) for c in speed.containers] == [42.0, 82.0]
    assert final.get_xscale() == "log" and "epoch 20" in speed.get_ylabel()
    assert [t.get_text() for t in speed.get_legend().get_texts()] == ["TRUNC_NORMAL (n = 3)", "IMP3_M060 (n = 3)"]


def test_a_stale_main_grid_is_named_not_a_traceback():
    """The plan check names every main-grid stage DVC would run first, also where the dry run
    stops at one (seen at 52cc71d: the training stages' code had changed, so download would run
    and the first cell's data did not exist in the copy); the study's own stages are not named."""
    from structinit.evidence.regime import other_stages

    stopped_at_a_cell = ("Running stage 'check_params':\nRunning stage 'download@digits':\n"
                         "Running stage 'preoptimize@digits-3':\n"
                         "ERROR: failed to reproduce 'train_baseline@digits-kaiming_uniform': [Errno 2] No such file\n")
    assert other_stages(stopped_at_a_cell, 255) == ["download@digits", "preoptimize@digits-3",
                                                    "train_baseline@digits-kaiming_uniform"]
    stopped_at_its_own = "Running stage 'study_regime_reused@x':\nERROR: failed to reproduce 'analyze_regime@x': y\n"
    assert other_stages(stopped_at_its_own, 255) == []
    assert other_stages("Running stage 'train_impulse@digits-3':\n", 0) == ["train_impulse@digits-3"]
    with pytest.raises(RuntimeError, match="failed in the copy"):
        other_stages("ERROR: unexpected error - dvc.yaml is broken\n", 255)


def test_the_refusal_keeps_dvc_s_error():
    """The stage's message on a stale main grid names the stages and keeps DVC's error line
    (where the dry run stopped at a main-grid stage); an up-to-date grid gives no message."""
    from structinit.evidence.regime import stale_main_grid

    stopped = ("Running stage 'download@digits':\n"
               "ERROR: failed to reproduce 'train_baseline@digits-mimetic': [Errno 2] No such file: 'data/x'\n")
    why = stale_main_grid(stopped, 255)
    assert "['download@digits', 'train_baseline@digits-mimetic']" in why and "./run.sh repro" in why
    assert why.endswith("ERROR: failed to reproduce 'train_baseline@digits-mimetic': [Errno 2] No such file: 'data/x'")
    assert "dry run stopped" not in stale_main_grid("Running stage 'train_impulse@digits-3':\n", 0)
    assert stale_main_grid("Running stage 'study_regime@x':\n", 0) is None


def test_the_run_label_ignores_what_the_documented_run_itself_changes(tmp_path):
    """stages/regime.py labels its report "with uncommitted changes" for a change to any tracked
    file but dvc.yaml, which the documented command rewrites (dvc unfreeze regime), and the
    stage's own committed outputs, which DVC removes before the stage runs."""
    from stages.regime import uncommitted_changes

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub/code.py").write_text("x = 1\n")
    (tmp_path / "results/evidence/regime").mkdir(parents=True)
    (tmp_path / "results/evidence/regime/regime.md").write_text("old\n")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    assert not uncommitted_changes(tmp_path)
    (tmp_path / "dvc.yaml").write_text("stages: {regime: {frozen: false}}\n")
    (tmp_path / "untracked.txt").write_text("new\n")
    assert not uncommitted_changes(tmp_path)
    # DVC removes the stage's committed outputs before it runs: not a change to what ran
    (tmp_path / "results/evidence/regime/regime.md").unlink()
    assert uncommitted_changes(tmp_path)
    outs = ("results/evidence/regime",)
    assert not uncommitted_changes(tmp_path, outs)
    assert not uncommitted_changes(tmp_path / "sub", outs)      # from a folder below, the whole checkout
    (tmp_path / "sub/code.py").write_text("x = 2\n")
    assert uncommitted_changes(tmp_path, outs) and uncommitted_changes(tmp_path / "sub", outs)
