"""benchmarks/cpu_variation.py: per-cell moves between CPUs, against verify's tolerance."""
import json
from pathlib import Path

import yaml

from benchmarks.cpu_variation import cpu_variation, paired_runs

REPO = Path(__file__).resolve().parents[1]


def _repo(tmp_path, here: dict, other: dict) -> Path:
    """here/other: (init, seed) -> accuracy in % (this workspace's committed runs, the other CPU's)."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({
        "recipes": {"digits": {"train": {"epochs": 4}}}, "contrasts": {"primary": "ours vs trunc_normal"},
        "init": {"kernel": 3}}))
    rows = ["dataset,init,budget,seed,epoch,test_acc,cpu"]
    for (init, seed), acc in other.items():
        rows += [f"digits,{init},4,{seed},2,10.0,Other CPU", f"digits,{init},4,{seed},4,{acc},Other CPU",
                 f"digits,{init},8,{seed},4,99.0,Other CPU"]          # another budget: not this recipe's
    (tmp_path / "epochs.csv").write_text("\n".join(rows) + "\n")
    for (init, seed), acc in here.items():
        run = tmp_path / f"results/train/digits-{init}/seed{seed}"
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps({"final_test_acc": acc / 100}))
        (run / "params.yaml").write_text(yaml.safe_dump({"cpu": "This CPU", "cpu_threads": 2, "compute_dtype": "bf16"}))
    return tmp_path


def test_moves_are_per_seed_in_points_and_images_and_a_cell_beyond_tolerance_is_flagged(tmp_path):
    image = 100 / 360                                         # one digits test image, in points
    other = {("trunc_normal", s): 90.0 for s in (0, 1, 2)} | {("impulse3", s): 91.0 for s in (0, 1, 2)}
    here = {("trunc_normal", 0): 90.0 + image, ("trunc_normal", 1): 90.0 - image, ("trunc_normal", 2): 90.0,
            # impulse3: 10, 8 and 9 images lower here: its mean moves 9 images, beyond verify's 2.4 (seeds 1
            # image apart: 3 x 1 x sqrt(2 / 3))
            ("impulse3", 0): 91.0 - 10 * image, ("impulse3", 1): 91.0 - 8 * image, ("impulse3", 2): 91.0 - 9 * image}
    repo = _repo(tmp_path, here, other)
    runs = paired_runs(repo, repo / "epochs.csv", "digits", 4)
    assert len(runs) == 6 and set(runs.other) == {90.0, 91.0}         # the budget-8 rows are not read
    text = cpu_variation(repo, repo / "epochs.csv")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and "init" not in line}
    assert rows["trunc_normal"] == ["+0.28 -0.28 +0.00", "+1 -1 +0", "0", "no"]
    assert rows["impulse3"] == ["-2.78 -2.22 -2.50", "-10 -8 -9", "-9", "yes"]
    assert "1 of 2 cells moved beyond verify's tolerance" in text and "(2.4 at n = 3; 1.00: the across-seed SD" in text
    # the primary on each CPU: +1.00 on the other, 91 - 2.5 - 90 = -1.50 here: a change of sign
    assert "Other CPU: impulse3 − trunc_normal = +1.00 points" in text
    assert "This CPU, 2 threads: impulse3 − trunc_normal = -1.50 points" in text
    assert "The primary contrast changed sign between the two CPUs." in text


def test_the_committed_runs_against_the_epoch_benchmark_s_other_cpu(tmp_path):
    """On the repository itself: every row pairs a committed run with the epoch benchmark's run
    of the same initializer and seed at the recipe's budget."""
    runs = paired_runs(REPO, REPO / "benchmarks/epochs_intel.csv", "digits", 160)
    assert len(runs) >= 6 and (runs.other_cpu != runs.here_cpu).all()
    row = runs.iloc[0]
    metrics = json.loads((REPO / f"results/train/digits-{row.init}/seed{row.seed}/metrics.json").read_text())
    assert abs(row.here - 100 * metrics["final_test_acc"]) < 1e-9
    assert "beyond verify's tolerance" in cpu_variation(REPO, REPO / "benchmarks/epochs_intel.csv")


def test_runs_on_the_committed_run_s_own_cpu_are_not_moves_and_a_run_twice_is_refused(tmp_path):
    import pandas as pd
    import pytest

    repo = _repo(tmp_path, {("trunc_normal", 0): 90.0}, {("trunc_normal", 0): 89.0})
    rows = pd.read_csv(repo / "epochs.csv")
    same = rows.assign(cpu="This CPU, 2 threads", test_acc=90.0)               # the same CPU re-ran it
    pd.concat([rows, same]).to_csv(repo / "epochs.csv", index=False)
    runs = paired_runs(repo, repo / "epochs.csv", "digits", 4)
    assert list(runs.other_cpu) == ["Other CPU"] and list(runs.other) == [89.0]
    twice = rows.assign(cpu="Third CPU")
    pd.concat([rows, twice]).to_csv(repo / "epochs.csv", index=False)
    with pytest.raises(ValueError, match=r"\('trunc_normal', 0\)\] ran twice at 4 epochs"):
        paired_runs(repo, repo / "epochs.csv", "digits", 4)
