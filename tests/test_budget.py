"""The epoch-budget criterion (structinit/reporting/budget.py) and the benchmark's report of it:
a budget is converged when doubling it moves no arm's mean final accuracy by more than 1 point."""
import pandas as pd
import pytest

from benchmarks.epochs import report
from structinit.io import CorruptFileError
from structinit.reporting.budget import (budget_finals, budget_sentence, budget_sentences, converged_budget,
                                         doubling_moves, read_budget_finals)

# mean final accuracy per (arm, budget): the slow arm moves +7.5 from 80 to 160, +0.6 from 160 to 320
MEANS = {"trunc_normal": {40: 40.0, 80: 88.0, 160: 95.5, 320: 96.1},
         "impulse3": {40: 80.0, 80: 95.0, 160: 96.5, 320: 96.9},
         "mimetic": {40: 96.0, 80: 96.5, 160: 96.5, 320: 96.4}}


def curves(means=MEANS, seeds=(0, 1, 2), every=10) -> pd.DataFrame:
    """The benchmark's CSV: each run evaluated every `every` epochs; seeds spread ±0.5 around the
    mean (so the mean is exact); earlier epochs lower than the final one."""
    rows = []
    for init, by_budget in means.items():
        for budget, mean in by_budget.items():
            for k, seed in enumerate(seeds):
                final = mean + (k - (len(seeds) - 1) / 2) * 0.5
                for epoch in range(every, budget + 1, every):
                    rows.append({"dataset": "digits", "init": init, "budget": budget, "seed": seed,
                                 "epoch": epoch, "test_acc": final - (budget - epoch) * 0.01})
    return pd.DataFrame(rows)


def test_finals_are_the_last_epoch_of_each_run():
    finals = budget_finals(curves())
    assert len(finals) == 3 * 4 * 3
    assert (finals.epoch == finals.budget).all()
    assert finals[(finals.init == "mimetic") & (finals.budget == 160)].test_acc.mean() == pytest.approx(96.5)


def test_doubling_moves_and_the_smallest_converged_budget():
    moves = doubling_moves(budget_finals(curves()))
    assert set(moves) == {40, 80, 160}                      # 320 has no double
    assert moves[80]["trunc_normal"] == pytest.approx(7.5)
    assert moves[160]["trunc_normal"] == pytest.approx(0.6)
    assert converged_budget(budget_finals(curves())) == 160
    assert converged_budget(budget_finals(curves()), tolerance=0.5) is None


def test_the_sentence_each_report_prints():
    finals = budget_finals(curves())
    ok = budget_sentence(finals, 160)
    assert "160: converged" in ok and "320" in ok and "0.60 points (trunc_normal" in ok
    short = budget_sentence(finals, 80)
    assert "NOT converged" in short and "trunc_normal's mean by +7.50" in short and "impulse3 +1.50" in short
    assert "short of convergence" in budget_sentence(finals, 120)         # below the converged 160
    assert "not one the epoch benchmark" in budget_sentence(finals, 640)
    unchecked = budget_sentence(finals[finals.budget < 320], 160)           # 160 ran, its double did not
    assert "measured by the epoch benchmark" in unchecked and "not its double (320)" in unchecked
    assert budget_sentences({"digits": finals}, {"digits": 160}).startswith(" digits: Epoch budget 160: converged")


def test_reading_the_benchmark_file(tmp_path):
    path = tmp_path / "epochs.csv"
    assert read_budget_finals(path, ["digits"]) == {}               # no file: nothing said
    curves().to_csv(path, index=False)
    assert set(read_budget_finals(path, ["digits", "cifar10"])) == {"digits"}
    curves().drop(columns="dataset").to_csv(path, index=False)
    with pytest.raises(CorruptFileError, match="dataset, init, budget, seed, epoch, test_acc"):
        read_budget_finals(path, ["digits"])


def test_benchmark_report_names_the_converged_budget_and_keeps_its_table_narrow():
    text = report(curves(), 1.0, [0, 1, 2], False, "test CPU")
    assert "**Converged budget: 160 epochs**" in text
    assert "160 → 320" in text and "80 → 160" in text
    during = text.split("Test accuracy during the 320-epoch runs")[1]
    header = next(line for line in during.split("\n") if line.startswith("| init"))
    assert header.count("|") - 2 <= 17 and "320" in header            # ≤ 16 epochs + the last, plus "init"


def test_benchmark_report_names_the_machine_of_each_budget():
    """A budget added later on another CPU (--add) is reported as such: a doubling across
    machines compares across their kernels too."""
    c = curves()
    assert "test CPU." in report(c, 1.0, [0, 1, 2], False, "test CPU")           # no cpu column
    c["cpu"] = c.budget.map(lambda b: "AMD, 2 threads" if b == 320 else "Intel, 2 threads")
    text = report(c, 1.0, [0, 1, 2], False, "this CPU")
    assert "budgets 40, 80, 160: Intel, 2 threads; budget 320: AMD, 2 threads." in text
    assert "this CPU" not in text
    c["cpu"] = "AMD, 2 threads"
    assert "warmup_prefix False); AMD, 2 threads." in report(c, 1.0, [0, 1, 2], False, "this CPU")


def test_pipeline_cells_checked_against_the_benchmarks_double(tmp_path):
    """The default's own cells (results/train) at their budget against the benchmark's double:
    the doubling measured on the pipeline's own machine, whatever CPU ran the benchmark's B."""
    import json

    import yaml

    from benchmarks.epochs import pipeline_check

    c = curves()
    assert pipeline_check(c, tmp_path, 1.0) == ""                        # no cells: nothing said
    for init, by_budget in MEANS.items():
        for seed in (0, 1, 2):
            folder = tmp_path / f"digits-{init}" / f"seed{seed}"
            folder.mkdir(parents=True)
            # the pipeline's 160 sits 0.8 below the benchmark's 320 for trunc_normal, 0.2 for the others
            acc = by_budget[320] - (0.8 if init == "trunc_normal" else 0.2)
            (folder / "metrics.json").write_text(json.dumps({"final_test_acc": acc / 100}))
            (folder / "params.yaml").write_text(yaml.safe_dump({"epochs": 160, "cpu": "AMD", "cpu_threads": 2}))
    text = pipeline_check(c, tmp_path, 1.0)
    assert "cells at 160 epochs" in text and "AMD, 2 threads" in text and "320-epoch runs" in text
    assert "largest Trunc Normal +0.80: within 1 point" in text
    assert "NOT within 0.5 point" in pipeline_check(c, tmp_path, 0.5)
    assert "Trunc Normal +0.80" in report(c, 1.0, [0, 1, 2], False, "x", pipeline_check(c, tmp_path, 1.0))


def test_the_primary_contrast_at_each_budget_and_its_move():
    from benchmarks.epochs import primary_by_budget

    rows = primary_by_budget(budget_finals(curves()), "impulse3", "trunc_normal")
    # impulse3 - trunc_normal: +40.0 at 40, +7.0 at 80, +1.0 at 160, +0.8 at 320 (seeds share their offsets)
    assert [(r[0], r[1].split(" ")[0], r[2]) for r in rows] == [
        ("40", "+40.00", ""), ("80", "+7.00", "-33.00"), ("160", "+1.00", "-6.00"), ("320", "+0.80", "-0.20")]
    text = report(curves(), 1.0, [0, 1, 2], False, "this CPU", primary=("impulse3", "trunc_normal"))
    assert "The primary contrast, Imp.-3 − Trunc Normal" in text
    row = next(line for line in text.splitlines() if line.startswith("| 320 "))
    assert [c.strip() for c in row.strip("|").split("|")] == ["320", "+0.80 [+0.80, +0.80]", "-0.20"]


def test_where_and_how_each_budget_ran_is_named():
    from benchmarks.epochs import machines

    c = curves()
    c["cpu"] = ["Intel" if b < 320 else "AMD" for b in c.budget]
    assert machines(c, "here") == "budgets 40, 80, 160: Intel; budget 320: AMD"       # nothing more recorded
    c["dtype"] = ["" if b < 320 else "bf16" for b in c.budget]
    c["stacking"] = ["all" if b < 320 else "cell" for b in c.budget]
    assert machines(c, "here") == "budgets 40, 80, 160: Intel, stacking all; budget 320: AMD, bf16, stacking cell"


def test_a_budget_runs_each_arm_s_seeds_stacked_as_the_pipeline_s_cells(digits):
    """stacking "cell" trains one stacked run per arm (the pipeline's batched shapes), "all" one run
    of every arm and seed; rows name the dtype and the stacking. One tiny epoch on the digits."""
    from benchmarks.epochs import run_budget

    rec = {"model": {"patch_size": 2, "embed_dim": 16, "depth": 1, "num_heads": 2},
           "train": {"batch_size": 64, "lr": 1e-3, "weight_decay": 0.01, "adam_eps": 1e-3, "grad_clip": 3.0,
                     "label_smoothing": 0.1, "randaugment": None, "hflip": False, "amp": "off"}}
    calls = []
    import benchmarks.epochs as bench

    real = bench.train_models
    bench.train_models = lambda models, *a, **k: calls.append(len(models)) or real(models, *a, **k)
    try:
        cell = run_budget(digits, rec, ["trunc_normal", "impulse3"], [0, 1], 1, False, "cpu", "cell")
        everything = run_budget(digits, rec, ["trunc_normal", "impulse3"], [0, 1], 1, False, "cpu", "all")
    finally:
        bench.train_models = real
    assert calls == [2, 2, 4]
    assert set(cell.stacking) == {"cell"} and set(everything.stacking) == {"all"} and set(cell.dtype) == {"fp32"}
    assert sorted(zip(cell.init, cell.seed)) == sorted(zip(everything.init, everything.seed))
    with pytest.raises(ValueError, match="stacking='seed'; choose one of"):
        run_budget(digits, rec, ["trunc_normal"], [0], 1, False, "cpu", "seed")
