"""Statistics behind the reports' intervals and conclusions, against known values."""
import math

import numpy as np

import pytest

from structinit.evidence.replication import verdict
from structinit.reporting import stats
from structinit.reporting.stats import contrast_line, paired_difference, planned_contrasts


def test_interval_is_the_t_interval():
    s = stats.summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    # mean 3, sd sqrt(2.5), t_0.975,4 = 2.776445
    half = 2.776445 * math.sqrt(2.5) / math.sqrt(5)
    assert (s.mean, s.n) == (3.0, 5)
    assert s.std == pytest.approx(math.sqrt(2.5))
    assert (s.ci_low, s.ci_high) == pytest.approx((3 - half, 3 + half), abs=1e-5)
    one = stats.summarize([7.0])
    assert one.n == 1 and one.std == 0 and math.isnan(one.ci_low)


def test_holm_step_down():
    # p sorted 0.01, 0.02, 0.04 with m = 3 -> 0.03, 0.04, 0.04 (monotone); original order kept
    assert stats.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_accuracy_intervals_stay_within_0_and_100():
    """The linear t-interval of [99.7, 100, 98.9] runs past 100; the logit one cannot."""
    acc = [99.7, 100.0, 98.9]
    linear, bounded = stats.summarize(acc), stats.summarize(acc, bounded=True)
    assert linear.ci_high > 100
    assert 0 < bounded.ci_low < bounded.mean < bounded.ci_high < 100
    low = stats.summarize([3.0, 12.0, 0.5], bounded=True)                # near 0, the same
    assert stats.summarize([3.0, 12.0, 0.5]).ci_low < 0 < low.ci_low
    # far from the bounds the two agree closely (the logit is near-linear around 50 %)
    mid, mid_b = stats.summarize([49.0, 51.0, 50.0, 50.5]), stats.summarize([49.0, 51.0, 50.0, 50.5], bounded=True)
    assert (mid_b.ci_low, mid_b.ci_high) == pytest.approx((mid.ci_low, mid.ci_high), abs=0.02)


def test_paired_difference_is_scipys_paired_t():
    from scipy.stats import ttest_rel
    a = {0: 80.0, 1: 60.0, 2: 75.0, 3: 90.0, 4: 40.0}
    b = {0: 77.0, 1: 55.0, 2: 74.0, 3: 86.0, 4: 39.0, 9: 10.0}       # seed 9 has no partner: ignored
    d = stats.paired_difference(a, b)
    ref = ttest_rel([a[s] for s in range(5)], [b[s] for s in range(5)])
    assert (d.n, d.diff) == (5, pytest.approx(2.8))
    assert d.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert d.ci_low < 2.8 < d.ci_high
    one_sided = stats.paired_difference(a, b, alternative="greater")
    assert one_sided.p == pytest.approx(ref.pvalue / 2, rel=1e-9)
    with pytest.raises(ValueError, match="alternative"):
        stats.paired_difference(a, b, alternative="less-ish")


def test_pairing_finds_what_a_shared_seed_effect_hides():
    """Every arm is worse at a bad seed (shared weights, shared data order): the difference
    is consistent seed by seed, though the arms' spreads overlap."""
    seed_effect = {0: 0.0, 1: -20.0, 2: 10.0, 3: -5.0, 4: -35.0}
    a = {s: 80 + e + bump for (s, e), bump in zip(seed_effect.items(), [3, 4, 2, 5, 3])}
    b = {s: 80 + e for s, e in seed_effect.items()}
    from scipy.stats import ttest_ind
    assert ttest_ind(list(a.values()), list(b.values())).pvalue > 0.5          # unpaired: nothing
    assert stats.paired_difference(a, b).p < 0.01                            # paired: clear


def test_planned_contrasts_primary_alone_holm_over_secondary_others_described():
    g = {"ours": {0: 90.0, 1: 91.0, 2: 90.4, 3: 91.6, 4: 90.2},
         "trunc": {0: 85.0, 1: 86.5, 2: 85.6, 3: 86.0, 4: 85.4},
         "mimetic": {0: 89.8, 1: 91.3, 2: 90.1, 3: 91.2, 4: 90.6},
         "kaiming": {0: 70.0, 1: 72.0, 2: 71.0, 3: 69.0, 4: 70.5}}
    cs = stats.planned_contrasts(g, family="digits", primary=("ours", "trunc"),
                                 secondary=[("ours", "mimetic"), ("ours", "kaiming")])
    by = {(c.a, c.b): c for c in cs}
    primary = by["ours", "trunc"]
    assert primary.role == "primary" and primary.p_adjusted == primary.p and primary.verdict == ">"
    sec = [by["ours", "mimetic"], by["ours", "kaiming"]]
    assert [c.role for c in sec] == ["secondary", "secondary"]
    assert [c.p_adjusted for c in sec] == pytest.approx(stats.holm([c.p for c in sec]))
    assert by["ours", "mimetic"].verdict == "~" and by["ours", "kaiming"].verdict == ">"
    described = [c for c in cs if c.role == "descriptive"]
    assert {(c.a, c.b) for c in described} == {("trunc", "mimetic"), ("trunc", "kaiming"), ("mimetic", "kaiming")}
    assert all(c.verdict == "" and math.isnan(c.p) and not math.isnan(c.ci_low) for c in described)
    text = stats.contrasts_block(cs, str)
    assert "**ours > trunc**" in text and "**ours > kaiming**" in text
    assert "mimetic > kaiming" not in text and "kaiming > mimetic" not in text   # described only
    # a planned pair whose arm is not in the grid is skipped, not an error
    assert [c.role for c in stats.planned_contrasts(g, primary=("ours", "absent"), describe_others=False)] == []


def test_replication_verdicts():
    assert verdict(">", ">") == "confirmed"
    assert verdict(">", "~") == "not replicated"
    assert verdict(">", "<") == "reversed"
    assert verdict("~", "~") == "consistent"
    assert verdict("~", "<") == "new"


def test_replication_report_tests_each_planned_conclusion_on_the_new_seeds():
    """Each conclusion of the committed table is matched to the same contrast on the new seeds
    (family, arms), with its role; described pairs carry no verdict and are not counted."""
    from structinit.evidence.replication import replication_report

    def c(a, b, verdict, diff, p, role):
        return {"family": "digits", "a": a, "b": b, "verdict": verdict, "diff": diff, "p_adjusted": p,
                "role": role, "fragile": 0.025 <= p <= 0.1}
    test = "paired t-test across seeds"
    before = {"test": test, "conclusions": [c("impulse3", "trunc_normal", ">", 7.2, 0.003, "primary"),
                                            c("impulse3", "mimetic", "<", -2.0, 0.037, "secondary"),
                                            c("impulse3", "impulse5", "~", -0.9, 0.15, "secondary")]}
    after = {"test": test, "conclusions": [c("impulse3", "trunc_normal", ">", 5.1, 0.004, "primary"),
                                           c("impulse3", "mimetic", "~", -0.4, 0.60, "secondary"),
                                           c("impulse3", "impulse5", "<", -1.5, 0.01, "secondary")]}
    text = replication_report(before, after, [0, 1, 2, 3, 4], [5, 6, 7, 8, 9])
    rows = {line.split("|")[3].strip(): line for line in text.split("\n") if line.startswith("| digits")}
    primary, secondary = rows["impulse3 vs trunc_normal"], rows["impulse3 vs mimetic"]
    assert "primary" in primary and primary.rstrip(" |").endswith("confirmed")
    assert "(-2.00, p=0.037, fragile)" in secondary and "not replicated" in secondary
    assert rows["impulse3 vs impulse5"].rstrip(" |").endswith("new")
    assert "confirmed: 1 of 2 stated differences" in text
    assert "[5, 6, 7, 8, 9] (replication, disjoint)" in text


def test_fragile_is_within_a_factor_of_two_of_alpha():
    from structinit.reporting.stats import is_fragile
    assert [is_fragile(p) for p in (0.0249, 0.025, 0.045, 0.05, 0.1, 0.1001, float("nan"))] == \
        [False, True, True, True, True, False, False]


def test_reports_record_the_verdicts_they_state_and_fragile_ones_are_not_bolded():
    from structinit.reporting.stats import Contrast, conclusions_record, contrast_line, recording_conclusions
    g = {"a": {s: 90.0 + s for s in range(5)}, "b": {s: 10.0 + s + (s % 2) for s in range(5)},
         "c": {s: 90.5 + 1.5 * s for s in range(5)}}
    cs = stats.planned_contrasts(g, family="digits", primary=("a", "b"), secondary=[("c", "b")])
    with recording_conclusions() as recorded:
        text = stats.contrasts_block(cs)
    record = conclusions_record("main_table.md", recorded)
    assert [c["id"] for c in record["conclusions"]] == ["digits: a vs b", "digits: c vs b"]
    assert [c["role"] for c in record["conclusions"]] == ["primary", "secondary"]
    assert [c["verdict"] for c in record["conclusions"]] == [">", ">"]
    assert [c["id"] for c in record["described"]] == ["digits: a vs c"]
    assert "**a > b**" in text
    # a verdict at p = 0.04 is fragile: stated, flagged, not bolded
    close = Contrast("digits", "x", "y", "primary", 60.0, 50.0, 10.0, 1.0, 19.0, 5, "two-sided", 0.04, 0.04, ">")
    with recording_conclusions() as recorded:
        line = contrast_line(close)
        stats._record([close], stats.ALPHA)
    assert "**" not in line and "x > y" in line and "fragile" in line
    assert conclusions_record("r.md", recorded)["conclusions"][0]["fragile"] is True


def test_gap_change_is_paired_by_seed():
    """The gap a - b shrinks by 2 points at the small size at every seed, whatever the seed's
    own level: paired, that is a clear change."""
    level = {0: 0.0, 1: -15.0, 2: 8.0}
    groups = {("a", "full"): {s: 90 + e for s, e in level.items()},
              ("b", "full"): {s: 80 + e for s, e in level.items()},
              ("a", "small"): {s: 70 + e + 0.1 * s for s, e in level.items()},
              ("b", "small"): {s: 62 + e for s, e in level.items()}}
    (change,) = stats.compare_gap_changes(groups, reference="b", base="full", family="digits")
    assert (change.gap_base, change.gap_other) == pytest.approx((10.0, 8.1))
    assert change.n == 3 and change.verdict == "<" and change.ci_high < 0


def test_summary_json_intervals_are_scalars_dvc_metrics_diff_can_subtract():
    """`dvc metrics diff` computes a change only between numbers (a list shows old/new, no
    change): the primary contrast's interval, like each arm's, is two scalar keys."""
    import pandas as pd
    from dvc.utils.diff import _diff_dicts

    from structinit.reporting.tables import summary

    NOISE = [0.3, -0.2, 0.1, -0.4, 0.2]              # the paired differences vary by seed

    def runs(shift):
        return pd.DataFrame([{"dataset": "digits", "init": i, "seed": s,
                              "acc": base + s * 0.5 + (shift + NOISE[s] if i == "impulse3" else 0)}
                             for i, base in (("trunc_normal", 90.0), ("impulse3", 93.0)) for s in range(5)])

    def headline(shift):
        r = runs(shift)
        groups = {i: dict(zip(g.seed, g.acc)) for i, g in r.groupby("init", sort=False)}
        c = stats.planned_contrasts(groups, family="digits", primary=("impulse3", "trunc_normal"),
                                    describe_others=False)[0]
        return summary(r, ["digits"], ["trunc_normal", "impulse3"], "impulse3", {"digits": c})

    before, after = headline(0.0), headline(1.0)
    primary = after["digits"]["primary"]
    assert primary["ci95_low"] <= primary["diff"] <= primary["ci95_high"]
    assert primary["contrast"] == "impulse3 - trunc_normal"
    moved = _diff_dicts(before, after, with_unchanged=False)
    for key in ("digits.primary.diff", "digits.primary.ci95_low", "digits.primary.ci95_high",
                "digits.impulse3.ci95_low"):
        assert "diff" in moved[key], key                                     # a number that moved, not a replaced key
    assert "digits.primary.p" not in moved or "diff" in moved["digits.primary.p"]


def test_bounded_interval_holds_its_estimate_at_the_clamp():
    """Accuracies are clamped to [0.1, 99.9] % for the logit: every seed at 100 % must not give
    the interval [99.9, 99.9] beside a mean of 100."""
    for acc in ([100.0, 100.0, 100.0], [99.95, 99.97, 99.99], [0.0, 0.0, 0.05]):
        s = stats.summarize(acc, bounded=True)
        assert s.ci_low <= s.mean <= s.ci_high and 0 <= s.ci_low and s.ci_high <= 100, acc
    assert stats.summarize([100.0, 100.0, 100.0], bounded=True).ci_high == 100.0


def test_the_paired_interval_is_scipys_exactly():
    """paired_difference's 95 % interval and p are scipy's paired t test's (ttest_rel)."""
    from scipy import stats as sps

    a = {0: 91.2, 1: 88.4, 2: 90.1, 3: 92.7, 4: 89.9}
    b = {0: 90.0, 1: 88.9, 2: 88.2, 3: 91.1, 4: 89.0}
    d = paired_difference(a, b)
    ref = sps.ttest_rel(list(a.values()), list(b.values()))
    low, high = ref.confidence_interval(0.95)
    assert (d.ci_low, d.ci_high) == pytest.approx((low, high), rel=1e-12, abs=1e-12)
    assert d.p == pytest.approx(ref.pvalue, rel=1e-12)


def test_intervals_beside_holm_verdicts_are_labelled_and_given_at_bonferroni_width():
    """Three secondary contrasts: each line's 95 % interval says unadjusted, and the interval at
    confidence 1 - 0.05/3 follows it (the primary's, tested alone, needs neither)."""
    from scipy import stats as sps

    base = {s: 80.0 + s for s in range(5)}
    groups = {"ours": {s: v + 1.0 + 0.3 * (s % 2) for s, v in base.items()}, "tn": base,
              "mim": {s: v + 0.5 - 0.2 * (s % 3) for s, v in base.items()},
              "kai": {s: v - 0.4 + 0.1 * s for s, v in base.items()}}
    out = planned_contrasts(groups, primary=("ours", "tn"), secondary=[("ours", "mim"), ("ours", "kai"),
                                                                       ("mim", "tn")], describe_others=False)
    primary, *secondary = out
    assert math.isnan(primary.ci_adj_low) and "unadjusted" not in contrast_line(primary)
    for c in secondary:
        d = np.array([groups[c.a][s] - groups[c.b][s] for s in range(5)])
        half = sps.t.ppf(1 - 0.05 / 3 / 2, 4) * d.std(ddof=1) / math.sqrt(5)
        assert (c.ci_adj_low, c.ci_adj_high) == pytest.approx((d.mean() - half, d.mean() + half), rel=1e-12)
        line = contrast_line(c)
        assert "unadjusted; 98.33 % CI" in line and "(Bonferroni width over the family's 3 tests)" in line


def test_the_primary_reads_with_the_difference_its_design_detects():
    """main_report.detectable_line: the smallest true difference with 80 % power at the primary's
    n, alpha and sidedness, from its own SD; at that difference the exact power is 0.8."""
    from structinit.reporting.main_report import detectable_line

    base = {s: 80.0 + s for s in range(5)}
    ours = {s: v - 0.4 + 0.7 * (s % 2) - 0.3 * (s == 4) for s, v in base.items()}
    c = planned_contrasts({"ours": ours, "tn": base}, primary=("ours", "tn"), describe_others=False)[0]
    line = detectable_line(c, 0.05)
    d = stats.min_detectable_difference(c.sd, 5, 0.05)
    assert f"Detectable with this design: {d:.2f} points (80 % power, paired t at α = 0.05 two-sided" in line
    assert f"SD of the 5 paired differences {c.sd:.2f}" in line
    assert stats.paired_t_power(d, c.sd, 5, 0.05) == pytest.approx(0.8, abs=1e-9)
    block = stats.contrasts_block([c], primary_note=lambda x: detectable_line(x, 0.05))
    assert block.index("**Primary contrast**") < block.index("Detectable with this design")


def test_a_primary_other_than_the_registered_one_is_labelled_exploratory():
    """params.yaml registers impulse3 vs trunc_normal; -S init.kernel=5 makes the primary
    impulse5 vs trunc_normal, which the reports label exploratory (the default: no label)."""
    import copy
    from pathlib import Path

    import yaml

    from structinit.pipeline.params import ParamsError, validate_params
    from structinit.reporting.main_report import planned

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    assert params["contrasts"]["registered"] == "impulse3 vs trunc_normal"
    assert planned(params).exploratory_note() == ""
    other = copy.deepcopy(params)
    other["init"]["kernel"] = 5
    note = planned(other).exploratory_note()
    assert note.startswith("**Exploratory.** This run's primary contrast, impulse5 − trunc_normal, is not the one "
                           "registered before the committed run (impulse3 − trunc_normal")
    other["contrasts"]["registered"] = "ours vs trunc_normal"
    with pytest.raises(ParamsError, match="contrasts.registered = 'ours vs trunc_normal'.*not 'ours'"):
        validate_params(other)


def test_the_speed_endpoint_reads_each_run_at_its_epoch_and_tests_the_planned_pair(tmp_path):
    """contrasts.speed: a run's test accuracy at the planned epoch comes from its dvclive curve
    (step = epoch - 1); the section records the planned pair's test, paired by seed (the number
    and the verdict are scipy's paired t test's), but prints it without a verdict (the endpoint
    was fixed after these seeds), then its test on new seeds; refuses an epoch the run was not
    tested at, and follows the main primary's exploratory label."""
    import pandas as pd
    from scipy import stats as sps

    from structinit.io import MissingFileError
    from structinit.reporting.main_report import run_row, speed_section

    rows, at20 = [], {}
    for init, rate in (("impulse3", 2.0), ("trunc_normal", 1.0)):
        for seed in range(4):
            run = tmp_path / f"digits-{init}" / f"seed{seed}"
            (run / "plots/metrics/test").mkdir(parents=True)
            (run / "metrics.json").write_text('{"final_test_acc": 0.9, "best_test_acc": 0.91, "step": 39}')
            wobble = 0.03 * ((seed * 7 + len(init)) % 5)           # per-seed, per-arm: differences vary
            accs = {e: min(0.99, rate * e / 100 + wobble) for e in range(5, 41, 5)}
            (run / "plots/metrics/test/acc.tsv").write_text(
                "step\tacc\n" + "".join(f"{e - 1}\t{a}\n" for e, a in accs.items()))
            row = run_row(tmp_path / f"digits-{init}", seed, 20)
            assert row["speed_acc"] == pytest.approx(100 * accs[20])
            at20[init, seed] = 100 * accs[20]
            rows.append({"dataset": "digits", "init": init, "seed": seed, **row})
    with pytest.raises(MissingFileError, match=r"digits-impulse3-0 has no test accuracy at epoch 21"):
        run_row(tmp_path / "digits-impulse3", 0, 21)
    args = (pd.DataFrame(rows), ["digits"], ["impulse3", "trunc_normal"],
            {"fraction": 0.5, "primary": "ours vs trunc_normal"}, "impulse3", {"digits": 20}, {"digits": 40}, 0.05)
    with stats.recording_conclusions() as recorded:
        text = speed_section(*args)
    ref = sps.ttest_rel([at20["impulse3", s] for s in range(4)], [at20["trunc_normal", s] for s in range(4)])
    diff = sum(at20["impulse3", s] - at20["trunc_normal", s] for s in range(4)) / 4
    assert "## Speed endpoint: test accuracy at 0.5 of the budget" in text and "it tests only on new ones" in text
    assert "digits: epoch 20 of 40" in text
    assert f"- digits, epoch 20: impulse3 − trunc_normal: {diff:+.2f} points" in text
    (tested, _), = recorded.tested
    assert ref.pvalue < 0.05 and tested.p == pytest.approx(ref.pvalue) and tested.verdict == ">"
    assert "**" not in text and "(described: no verdict on the seeds that fixed the endpoint)" in text
    assert "Not yet tested on new seeds" in text and "Exploratory" not in text
    assert "\n  Tested on seeds 5–9: X" in speed_section(*args, retest=lambda c: "\n  Tested on seeds 5–9: X")
    assert "**Exploratory.** As the main primary, the speed endpoint's pair follows init.kernel" in speed_section(
        *args, exploratory="**Exploratory.** This run's primary contrast, X, is not ...\n\n")


def test_replication_keeps_its_runs_and_pools_both_halves_post_hoc(tmp_path):
    """The replication keeps each run's small outputs; the report gives each half's estimate
    and interval, both halves pooled by seed (scipy's paired t on all ten), labelled post
    hoc, and what each half ran on."""
    import json

    import yaml
    from scipy import stats as sps

    from structinit.evidence.replication import halves, keep_outputs, replication_report

    acc = {}
    for root, seeds, cpu in ((tmp_path / "a", range(5), "CPU one"), (tmp_path / "b", range(5, 10), "CPU two")):
        for init, shift in (("impulse3", 0.4), ("trunc_normal", 0.0)):
            for s in seeds:
                run = root / f"digits-{init}" / f"seed{s}"
                (run / "plots/metrics/test").mkdir(parents=True)
                acc[init, s] = 0.9 + shift / 100 + 0.003 * ((s * 3 + len(init)) % 4)
                (run / "metrics.json").write_text(json.dumps({"final_test_acc": acc[init, s]}))
                (run / "params.yaml").write_text(yaml.safe_dump({"compute_dtype": "bf16", "device": "cpu",
                                                                  "cpu": cpu, "cpu_threads": 2, "versions": "v"}))
                (run / "plots/metrics/test/acc.tsv").write_text("step\tacc\n0\t0.5\n")
                (run / "model.bin").write_text("not kept")
    keep_outputs(tmp_path / "b", tmp_path / "kept")
    kept = sorted(p.relative_to(tmp_path / "kept").as_posix() for p in (tmp_path / "kept").rglob("*") if p.is_file())
    assert "digits-impulse3/seed7/plots/metrics/test/acc.tsv" in kept and len(kept) == 10 * 3
    extra = halves(tmp_path / "a", tmp_path / "kept", list(range(5)), list(range(5, 10)))
    conclusion = {"family": "digits", "a": "impulse3", "b": "trunc_normal", "verdict": "~", "diff": 0.4,
                  "ci_low": -0.1, "ci_high": 0.9, "p_adjusted": 0.1, "role": "primary"}
    text = replication_report({"test": "t", "conclusions": [conclusion]}, {"conclusions": [conclusion]},
                              list(range(5)), list(range(5, 10)), **extra)
    ref = sps.ttest_rel([100 * acc["impulse3", s] for s in range(10)],
                        [100 * acc["trunc_normal", s] for s in range(10)])
    low, high = ref.confidence_interval()
    mean = sum(100 * (acc["impulse3", s] - acc["trunc_normal", s]) for s in range(10)) / 10
    assert f"{mean:+.2f} [{low:+.2f}, {high:+.2f}], p={ref.pvalue:.2g}, n=10" in text
    assert "post hoc (pooling was decided after both halves were seen)" in text
    assert "+0.40 [-0.10, +0.90]" in text
    assert "- seeds [0, 1, 2, 3, 4]: Computed in bf16 (autocast) on CPU: CPU one, 2 threads (10 runs)" in text
    assert "- seeds [5, 6, 7, 8, 9]: Computed in bf16 (autocast) on CPU: CPU two" in text

    # as data, for the headline: each half's primary and the pooled figures, and what the
    # replication computed in and on
    from structinit.evidence.replication import computed_on, primary_record

    conclusion.update(p=0.1, n=5)
    again = dict(conclusion, verdict=">", diff=0.5, ci_low=0.1, ci_high=0.9, p=0.02)
    record = primary_record({"conclusions": [conclusion]}, {"conclusions": [again]}, list(range(5)),
                            list(range(5, 10)), extra["values"], computed_on(tmp_path / "kept", list(range(5, 10))))
    (entry,) = record["primary"]
    assert record["computed_on"] == "bf16 on CPU two" and entry["verdict"] == "new"
    assert entry["replication"] == {"seeds": list(range(5, 10)), "diff": 0.5, "ci_low": 0.1, "ci_high": 0.9,
                                    "p": 0.02, "n": 5, "verdict": ">"}
    assert entry["pooled_post_hoc"]["n"] == 10 and abs(entry["pooled_post_hoc"]["diff"] - mean) < 1e-9
    assert (entry["pooled_post_hoc"]["ci_low"], entry["pooled_post_hoc"]["ci_high"]) == pytest.approx((low, high))
    json.dumps(record)                                                     # what the benchmark writes


def test_the_headline_quotes_the_replication_only_of_its_own_primary():
    """One sentence beside the primary, from benchmarks/replication.json, where that record
    replicated this very contrast on these seeds with these numbers; nothing otherwise (an
    experiment's other seeds or params, another CPU's bytes)."""
    from structinit.reporting.main_report import replication_sentence
    from structinit.reporting.stats import Contrast

    c = Contrast("digits", "impulse3", "trunc_normal", "primary", 95.06, 95.5, -0.44, -1.16, 0.27, 5,
                 "two-sided", 0.16, 0.16, "~", 0.58)
    record = {"report": "benchmarks/replication.md", "computed_on": "bf16 on AMD EPYC",
              "primary": [{"dataset": "digits", "a": "impulse3", "b": "trunc_normal", "verdict": "new",
                           "stated": {"seeds": [0, 1, 2, 3, 4], "diff": -0.44, "ci_low": -1.16, "ci_high": 0.27,
                                      "p": 0.16, "n": 5, "verdict": "~"},
                           "replication": {"seeds": [5, 6, 7, 8, 9], "diff": -1.39, "ci_low": -2.6, "ci_high": -0.17,
                                           "p": 0.034, "n": 5, "verdict": "<"},
                           "pooled_post_hoc": {"n": 10, "diff": -0.915, "ci_low": -1.57, "ci_high": -0.26, "p": 0.01}}]}
    label = {"impulse3": "Imp.-3", "trunc_normal": "Trunc Normal"}.get
    text = replication_sentence(record, c, [0, 1, 2, 3, 4], label)
    assert text == ("\n  Re-tested on seeds 5–9 (benchmarks/replication.md; bf16 on AMD EPYC): Imp.-3 − Trunc Normal "
                    "-1.39 points, 95 % CI [-2.60, -0.17], p = 0.034, distinguishable from 0 (Imp.-3 < Trunc "
                    "Normal); against this table's verdict: new. Both halves pooled, post hoc (n = 10, decided "
                    "after both were seen): -0.92 [-1.57, -0.26].")
    unpooled = {**record, "primary": [{**record["primary"][0], "pooled_post_hoc": None, "verdict": "consistent",
                                        "replication": {**record["primary"][0]["replication"], "verdict": "~",
                                                        "ci_low": None}}]}
    assert replication_sentence(unpooled, c, [0, 1, 2, 3, 4], label).endswith(
        "-1.39 points, p = 0.034, not distinguishable from 0; against this table's verdict: consistent.")
    from dataclasses import replace
    assert replication_sentence(record, c, [0, 1, 2], label) == ""                  # other seeds
    assert replication_sentence(record, replace(c, diff=-0.28), [0, 1, 2, 3, 4], label) == ""   # other bytes
    assert replication_sentence(record, replace(c, a="impulse5"), [0, 1, 2, 3, 4], label) == ""  # other contrast
    assert replication_sentence(None, c, [0, 1, 2, 3, 4], label) == ""
    assert replication_sentence({"primary": []}, c, [0, 1, 2, 3, 4], label) == ""   # not run yet


def test_the_speed_epoch_is_the_first_tested_epoch_at_or_after_the_fraction():
    from structinit.reporting.main_report import speed_epoch

    assert speed_epoch({"epochs": 160, "eval_every": 5}, 0.125) == 20        # the default
    assert speed_epoch({"epochs": 160, "eval_every": 5}, 0.13) == 25         # 20.8 -> the next tested
    assert speed_epoch({"epochs": 3, "eval_every": 2}, 0.125) == 2           # a tiny run: still one
    assert speed_epoch({"epochs": 12, "eval_every": 5}, 0.9) == 12           # past the last multiple: the end
    assert speed_epoch({"epochs": 200}, 0.125) == 25                         # every epoch tested
