"""./run.sh verify (structinit/pipeline/verify.py) on doctored outputs: identical bytes, a re-run on
another CPU within tolerance, and each way it must fail; then on a real DVC repository: a fresh
clone (nothing run), a finished run, an edited output."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from structinit.pipeline import verify as verify_module
from structinit.pipeline.verify import main, verify

REAL_STATUS = verify_module.dvc_status
REPO = Path(__file__).resolve().parents[1]


def _write(repo: Path, rel: str, obj) -> None:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def _conclusion(cid, verdict, p, fragile=False, role="secondary"):
    """A conclusion as the reports write it today (p_adjusted, role)."""
    family, pair = cid.split(": ")
    a, b = pair.split(" vs ")
    return {"id": cid, "family": family, "a": a, "b": b, "role": role, "verdict": verdict, "p": p,
            "p_adjusted": p, "fragile": fragile}


# two seeds per cell, 2 test images apart: the kind's seed SD is 1.41 images, so a mean of 2 seeds
# may move 3 x 1.41 x sqrt(2 / 2) = 4.2 images
ACCS = ((324 / 360, 326 / 360), (180 / 360, 182 / 360))


def _state(repo, *, lock_hash="aaa", accs=ACCS, verdicts=((">", 0.001), ("~", 0.5)),
           fragile=(False, False), kernel=3):
    lock = {"schema": "2.0", "stages": {
        "train_baseline@digits-mimetic": {"outs": [{"path": "models/digits-mimetic", "md5": lock_hash + ".dir"}]},
        "aggregate": {"outs": [{"path": "reports/main_table.md", "md5": "bbb"}]}}}
    _write(repo, "dvc.lock", yaml.safe_dump(lock))
    _write(repo, "models/digits-mimetic/seed0.pt", lock_hash)
    _write(repo, "reports/main_table.md", "| table |")
    _write(repo, "params.yaml", yaml.safe_dump({"grid": {"datasets": ["digits"]}, "init": {"kernel": kernel}}))
    for cell, seed_accs in zip(("digits-mimetic", "digits-trunc_normal"), accs):
        for seed, acc in enumerate(seed_accs):
            _write(repo, f"results/train/{cell}/seed{seed}/metrics.json", {"final_test_acc": acc})
    ids = ("digits: mimetic vs trunc_normal", "digits: impulse3 vs trunc_normal")
    roles = ("secondary", "primary")
    _write(repo, "reports/conclusions/main_table.json", {"report": "main_table.md", "conclusions": [
        _conclusion(i, v, p, f, r) for i, (v, p), f, r in zip(ids, verdicts, fragile, roles)]})


@pytest.fixture(autouse=True)
def up_to_date(monkeypatch):
    """`dvc status` says every stage is up to date (the doctored repos are not DVC projects;
    the last tests run the real one)."""
    monkeypatch.setattr(verify_module, "dvc_status", lambda repo: [])


@pytest.fixture
def repo(tmp_path):
    _state(tmp_path)
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "committed run"]):
        subprocess.run(cmd, cwd=tmp_path, check=True)
    return tmp_path


def _verify_cli(repo, monkeypatch, capsys, *args):
    monkeypatch.chdir(repo)
    code = main(list(args))
    return code, capsys.readouterr().out


def test_identical_bytes(repo, monkeypatch, capsys):
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 0 and out.startswith("identical bytes")


def test_other_bytes_same_conclusions_within_tolerance_pass(repo, monkeypatch, capsys):
    # another CPU: other hashes, seed 0 of mimetic 3 test images lower, the same verdicts
    (m0, m1), (t0, t1) = ACCS
    _state(repo, lock_hash="ccc", accs=((m0 - 3 / 360, m1), (t0, t1 + 1 / 360)))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 0, out
    assert "1 output(s) differ" in out and "every conclusion both runs have is the same" in out
    assert "  results/train/digits-*: seed SD 1.41 images" in out
    assert "results/train/digits-mimetic: mean -1.5 of 360 (s0:-3 s1:+0), tolerance ±4.2" in out
    assert "verdict: reproduced" in out


def test_a_cell_beyond_tolerance_fails(repo, monkeypatch, capsys):
    moved = 14 / 360
    (m0, m1), tn = ACCS
    _state(repo, lock_hash="ccc", accs=((m0 - moved, m1 - moved), tn))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1
    assert "digits-mimetic: mean -14.0 of 360 (s0:-14 s1:-14), tolerance ±4.2  <-- beyond tolerance" in out
    assert "NOT reproduced: 1 cell(s) beyond tolerance" in out
    # a wider tolerance, asked for, lets it pass
    assert _verify_cli(repo, monkeypatch, capsys, "--tolerance-images", "20")[0] == 0


# An Intel Xeon (AMX) re-run of a fresh clone (issue 63): each seed's move from the committed AMD
# run, in test images of 360. The main grid's are recorded as a range (-6 to +5 per seed, cell means
# within ±1.2): here its extremes, at those means.
INTEL = {"results/studies/data_size/digits-0.1-impulse3": (2, 16, 9),
         "results/studies/data_size/digits-0.1-trunc_normal": (-2, 10, 10),
         "results/studies/data_size/digits-0.1-mimetic": (-7, 1, 3),
         "results/studies/heads_width/digits-h6-impulse3": (0, 1, 5),
         "results/studies/heads_width/digits-h6-trunc_normal": (0, 1, -2),
         **{f"results/train/digits-{init}": moves for init, moves in (
             ("impulse3", (-6, 5, 1, 2, 4)), ("trunc_normal", (5, -6, -1, -2, -2)), ("mimetic", (-6, 5, 0, 0, 0)),
             ("impulse5", (5, -6, 0, 0, 0)), ("kaiming_uniform", (-6, 5, 1, 0, 0)), ("mimetic_qk", (0, 0, 0, 0, 0)))}}


def _committed_cells_moved(tmp_path, moves: dict) -> Path:
    """A repository whose commit holds this project's committed cells of `moves`' kinds, and whose
    workspace holds them moved by `moves` (cell -> test images per seed); a described contrast
    moved as the Intel run moved the heads/width h6 one (+0.56 -> +1.67 points)."""
    import shutil

    def h6(diff):
        return {"report": "heads_width.md", "conclusions": [], "described": [
            {"id": "digits, h6: impulse3 vs trunc_normal", "role": "descriptive", "diff": diff, "verdict": ""}]}
    _write(tmp_path, "dvc.lock", yaml.safe_dump({"stages": {"s": {"outs": [{"path": "results", "md5": "a.dir"}]}}}))
    _write(tmp_path, "reports/conclusions/heads_width.json", h6(0.56))
    for cell in moves:
        shutil.copytree(REPO / cell, tmp_path / cell, ignore=lambda _, names: [n for n in names if n == "plots"])
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "committed run"]):
        subprocess.run(cmd, cwd=tmp_path, check=True)
    _write(tmp_path, "dvc.lock", yaml.safe_dump({"stages": {"s": {"outs": [{"path": "results", "md5": "b.dir"}]}}}))
    _write(tmp_path, "reports/conclusions/heads_width.json", h6(1.67))
    for cell, images in moves.items():
        for seed, move in enumerate(images):
            path = tmp_path / cell / f"seed{seed}/metrics.json"
            metrics = json.loads(path.read_text())
            path.write_text(json.dumps({**metrics, "final_test_acc": metrics["final_test_acc"] + move / 360}))
    return tmp_path


def test_the_intel_re_run_of_issue_63_reproduces(tmp_path, monkeypatch, capsys):
    """Each kind's tolerance from its own committed seeds: the data-size 10 % cells' (144 training
    images) spread far wider than the main grid's, and the moves above pass; the h6 contrast, a
    3-seed study's, is described, not a conclusion."""
    code, out = _verify_cli(_committed_cells_moved(tmp_path, INTEL), monkeypatch, capsys)
    assert code == 0, out
    tolerance = {c.cell.split("/")[-1]: c.tolerance for c in verify(tmp_path).cells}
    assert tolerance["digits-0.1-impulse3"] > 9 > 6 > tolerance["digits-impulse3"]     # no one bound fits both
    assert "every conclusion both runs have is the same" in out


@pytest.mark.parametrize("cell, move", [("results/studies/data_size/digits-0.1-impulse3", 30),
                                        ("results/studies/heads_width/digits-h6-trunc_normal", -8),
                                        ("results/train/digits-impulse3", 6)])
def test_a_move_beyond_its_kinds_tolerance_fails(tmp_path, monkeypatch, capsys, cell, move):
    """Every seed of one cell moved `move` images further than the Intel run: beyond its kind's
    tolerance (10 %: ±26.7 images, h6: ±6.2, main grid: ±3.9 for the committed seeds)."""
    moves = {**INTEL, cell: tuple(m + move for m in INTEL[cell])}
    code, out = _verify_cli(_committed_cells_moved(tmp_path, moves), monkeypatch, capsys)
    assert code == 1 and out.rstrip().splitlines()[-1] == "verdict: NOT reproduced: 1 cell(s) beyond tolerance"
    assert [c.cell for c in verify(tmp_path).cells_beyond_tolerance] == [cell]


def test_a_changed_conclusion_fails(repo, monkeypatch, capsys):
    _state(repo, lock_hash="ccc", verdicts=((">", 0.001), (">", 0.01)))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1
    # the primary is tested alone: its p, not a "Holm p"
    assert "main_table.json: digits: impulse3 vs trunc_normal: ~ -> > (p 0.5 -> 0.01) [CHANGED]" in out
    assert out.rstrip().splitlines()[-1] == "verdict: NOT reproduced: 1 conclusion(s) changed"
    # a secondary contrast's verdict rests on its Holm-adjusted p, and says so
    _state(repo, lock_hash="ccc", verdicts=(("~", 0.2), ("~", 0.5)))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1 and "mimetic vs trunc_normal: > -> ~ (Holm p 0.001 -> 0.2) [CHANGED]" in out


def test_a_record_from_before_the_paired_statistics_is_read_by_its_p_holm(repo, monkeypatch, capsys):
    _state(repo, lock_hash="ccc", verdicts=((">", 0.001), (">", 0.01)))
    path = repo / "reports/conclusions/main_table.json"
    record = json.loads(path.read_text())
    for c in record["conclusions"]:
        c["p_holm"] = c.pop("p_adjusted")
        del c["role"]
    path.write_text(json.dumps(record))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1 and "impulse3 vs trunc_normal: ~ -> > (adjusted p 0.5 -> 0.01) [CHANGED]" in out


def test_a_changed_fragile_conclusion_is_listed_not_failed(repo, monkeypatch, capsys):
    # committed at p = 0.5 (solid "~"); the re-run's p = 0.045 is within a factor 2 of 0.05
    _state(repo, lock_hash="ccc", verdicts=((">", 0.001), (">", 0.045)), fragile=(False, True))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 0, out
    assert "[fragile, not failed]" in out


def test_outputs_that_cannot_be_compared_fail(repo, monkeypatch, capsys):
    (repo / "results/train/digits-mimetic/seed1/metrics.json").unlink()
    _write(repo, "dvc.lock", (repo / "dvc.lock").read_text().replace("aaa", "ddd"))
    v = verify(repo)
    assert not v.ok and v.cells_missing == ["results/train/digits-mimetic seed 1: only in the commit"]


def test_new_cells_and_conclusions_are_listed_not_failed(repo, monkeypatch, capsys):
    """After a GPU run of the paper's grid: the digits cells compare, the CIFAR cell and its
    conclusion are new; the params that differ are named."""
    _state(repo, lock_hash="ccc")
    _write(repo, "results/train/cifar10-mimetic/seed0/metrics.json", {"final_test_acc": 0.7})
    record = json.loads((repo / "reports/conclusions/main_table.json").read_text())
    record["conclusions"].append(_conclusion("cifar10: impulse3 vs trunc_normal", ">", 0.01, role="primary"))
    _write(repo, "reports/conclusions/main_table.json", record)
    _write(repo, "params.yaml", yaml.safe_dump({"grid": {"datasets": ["digits", "cifar10"]}, "init": {"kernel": 3}}))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 0, out
    assert "results/train/cifar10-mimetic seed 0: a new cell, only in the workspace  (new: listed, not compared)" in out
    assert "main_table.json: cifar10: impulse3 vs trunc_normal: only in the workspace  (new" in out
    assert "grid.datasets: ['digits'] -> ['digits', 'cifar10']" in out
    assert out.rstrip().splitlines()[-1] == ("verdict: reproduced: the same conclusions, accuracies within tolerance "
                                             "(params.yaml differs from HEAD in grid.datasets)")


def test_an_experiment_names_the_params_it_changed_in_the_verdict(repo, monkeypatch, capsys):
    """dvc exp run -S init.kernel=5: the headline contrast is another one; the one line says
    the configuration is not the commit's."""
    _state(repo, lock_hash="ccc", kernel=5)
    record = json.loads((repo / "reports/conclusions/main_table.json").read_text())
    record["conclusions"][1] = _conclusion("digits: impulse5 vs trunc_normal", ">", 0.01, role="primary")
    _write(repo, "reports/conclusions/main_table.json", record)
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1
    assert out.startswith("params.yaml differs from HEAD") and "  init.kernel: 3 -> 5" in out
    assert out.rstrip().splitlines()[-1] == (
        "verdict: NOT reproduced: 1 output(s) of the commit with no counterpart in the workspace; "
        "params.yaml differs from the commit in init.kernel: another configuration, not a re-run")


def test_missing_outputs_fail_before_any_comparison(repo, monkeypatch, capsys):
    """A fresh clone before `./run.sh repro`: DVC-tracked outputs are not there."""
    import shutil

    shutil.rmtree(repo / "models")
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1 and "identical" not in out
    assert out.rstrip().splitlines()[-1] == ("verdict: NOT verified: 1 output(s) dvc.lock records are not in the "
                                             "workspace (first: models/digits-mimetic): run ./run.sh repro first")


def test_stale_stages_fail_before_any_comparison(repo, monkeypatch, capsys):
    monkeypatch.setattr(verify_module, "dvc_status", lambda repo: ["aggregate", "train_impulse@digits-3"])
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1 and "identical" not in out
    assert "  train_impulse@digits-3" in out
    assert out.rstrip().splitlines()[-1].startswith("verdict: NOT verified: dvc status: 2 stage(s) not up to date "
                                                    "(first: aggregate)")


def test_a_commit_without_dvc_lock_is_an_error_to_a_caller_and_an_exit_from_the_command(repo, monkeypatch, capsys):
    from structinit.io import MissingFileError

    subprocess.run(["git", "rm", "-q", "--cached", "dvc.lock"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "no lock"],
                   cwd=repo, check=True)
    # the library function raises, so that a caller (a notebook, a script) can catch it
    with pytest.raises(MissingFileError, match="^HEAD has no dvc.lock: nothing committed to compare with$"):
        verify(repo)
    # the command exits with that one line and no traceback
    with pytest.raises(SystemExit) as stopped:
        _verify_cli(repo, monkeypatch, capsys)
    assert stopped.value.code == "error: HEAD has no dvc.lock: nothing committed to compare with"


def _dvc(repo, *args):
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, check=True, capture_output=True, text=True)


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                          capture_output=True, text=True)


def test_a_real_dvc_project_fresh_clone_finished_run_and_edited_output(tmp_path, monkeypatch, capsys):
    """The real `dvc status`: a fresh clone (the output DVC tracks is absent) fails as not run;
    the finished run is identical bytes; an edited output fails as not up to date."""
    monkeypatch.setattr(verify_module, "dvc_status", REAL_STATUS)
    origin = tmp_path / "origin"
    origin.mkdir()
    _git(origin, "init", "-q")
    _dvc(origin, "init", "-q")
    _dvc(origin, "config", "core.analytics", "false")
    (origin / "params.yaml").write_text("x: 1\n")
    (origin / "dvc.yaml").write_text("stages:\n  make:\n    cmd: python -c \"open('out.txt', 'w').write('1')\"\n"
                                     "    params: [x]\n    outs: [out.txt]\n")
    _dvc(origin, "repro", "-q")
    _git(origin, "add", "-A")
    _git(origin, "commit", "-qm", "run")
    assert _verify_cli(origin, monkeypatch, capsys)[0] == 0              # the run itself: identical

    clone = tmp_path / "clone"
    _git(tmp_path, "clone", "-q", str(origin), str(clone))
    code, out = _verify_cli(clone, monkeypatch, capsys)
    assert code == 1 and "identical" not in out and "out.txt" in out   # nothing run yet

    _dvc(clone, "repro", "-q")
    code, out = _verify_cli(clone, monkeypatch, capsys)
    assert code == 0 and out.startswith("identical bytes"), out

    (clone / "out.txt").write_text("2")
    code, out = _verify_cli(clone, monkeypatch, capsys)
    assert code == 1 and "dvc status: 1 stage(s) not up to date (first: make)" in out


def test_your_own_datasets_changes_are_counted_in_its_test_images(repo, monkeypatch, capsys):
    """An own dataset (not in specs.TEST_IMAGES) is judged by the test images its prepared
    file holds: 40 here, so 0.05 of accuracy is 2 images (it used to be 0 of 0)."""
    import torch

    from structinit.io import save_checked
    for seed, acc in enumerate((0.50, 0.60)):
        _write(repo, f"results/train/shapes-mimetic/seed{seed}/metrics.json", {"final_test_acc": acc})
    save_checked(repo / "data/prepared/shapes.pt", {"test_labels": torch.zeros(40, dtype=torch.long)})
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "shapes"], cwd=repo,
                   check=True)
    _state(repo, lock_hash="ccc")
    for seed, acc in enumerate((0.55, 0.65)):
        _write(repo, f"results/train/shapes-mimetic/seed{seed}/metrics.json", {"final_test_acc": acc})
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert "results/train/shapes-mimetic: mean +2.0 of 40" in out, out
    (repo / "data/prepared/shapes.pt").unlink()
    with pytest.raises(SystemExit, match=r"^error: data/prepared/shapes.pt is missing: verify counts shapes's"):
        _verify_cli(repo, monkeypatch, capsys)
