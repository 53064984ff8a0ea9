"""./run.sh verify (structinit/pipeline/verify.py) on doctored outputs: identical bytes, a re-run on
another CPU within tolerance, and each way it must fail."""
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from structinit.pipeline.verify import TOLERANCE_TEST_IMAGES, main, verify


def _write(repo: Path, rel: str, obj) -> None:
    path = repo / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))


def _conclusion(cid, verdict, p_holm, fragile=False):
    family, pair = cid.split(": ")
    a, b = pair.split(" vs ")
    return {"id": cid, "family": family, "a": a, "b": b, "verdict": verdict, "p_holm": p_holm, "fragile": fragile}


def _state(repo, *, lock_hash="aaa", accs=((0.90, 0.80), (0.50, 0.40)), verdicts=((">", 0.001), ("~", 0.5)),
           fragile=(False, False)):
    lock = {"schema": "2.0", "stages": {
        "train_baseline@digits-mimetic": {"outs": [{"path": "models/digits-mimetic", "md5": lock_hash + ".dir"}]},
        "aggregate": {"outs": [{"path": "reports/main_table.md", "md5": "bbb"}]}}}
    _write(repo, "dvc.lock", yaml.safe_dump(lock))
    for cell, seed_accs in zip(("digits-mimetic", "digits-trunc_normal"), accs):
        for seed, acc in enumerate(seed_accs):
            _write(repo, f"results/train/{cell}/seed{seed}/metrics.json", {"final_test_acc": acc})
    ids = ("digits: mimetic vs trunc_normal", "digits: impulse3 vs trunc_normal")
    _write(repo, "reports/conclusions/main_table.json", {"report": "main_table.md", "conclusions": [
        _conclusion(i, v, p, f) for i, (v, p), f in zip(ids, verdicts, fragile)]})


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
    _state(repo, lock_hash="ccc", accs=((0.90 - 3 / 360, 0.80), (0.50, 0.40 + 1 / 360)))
    assert TOLERANCE_TEST_IMAGES > 1.5
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 0, out
    assert "1 output(s) differ" in out and "every conclusion is the same" in out
    assert "results/train/digits-mimetic: mean -1.5 of 360 (s0:-3 s1:+0)" in out
    assert "verdict: reproduced" in out


def test_a_cell_beyond_tolerance_fails(repo, monkeypatch, capsys):
    moved = 14 / 360
    assert TOLERANCE_TEST_IMAGES < 14
    _state(repo, lock_hash="ccc", accs=((0.90 - moved, 0.80 - moved), (0.50, 0.40)))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1
    assert "digits-mimetic: mean -14.0 of 360" in out and "beyond tolerance" in out
    assert "NOT reproduced: 1 cell(s) beyond tolerance" in out
    # a wider tolerance, asked for, lets it pass
    assert _verify_cli(repo, monkeypatch, capsys, "--tolerance-images", "20")[0] == 0


def test_a_changed_conclusion_fails(repo, monkeypatch, capsys):
    _state(repo, lock_hash="ccc", verdicts=((">", 0.001), (">", 0.01)))
    code, out = _verify_cli(repo, monkeypatch, capsys)
    assert code == 1
    assert "main_table.json: digits: impulse3 vs trunc_normal: ~ -> > (Holm p 0.5 -> 0.01) [CHANGED]" in out


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
