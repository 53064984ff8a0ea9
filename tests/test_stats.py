"""Statistics behind the reports' intervals and conclusions, against known values."""
import math

import pytest

from benchmarks.replication import verdict
from structinit.reporting import stats


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


def test_welch_matches_a_hand_computation():
    from scipy.stats import t as student
    a, b = [1.0, 2.0, 3.0, 4.0], [3.0, 5.0, 7.0, 9.0]
    va, vb = 5 / 3, 20 / 3                                  # sample variances
    se2 = va / 4 + vb / 4
    t = (2.5 - 6.0) / math.sqrt(se2)
    df = se2 ** 2 / ((va / 4) ** 2 / 3 + (vb / 4) ** 2 / 3)  # Welch-Satterthwaite
    assert stats.welch_p(a, b) == pytest.approx(2 * student.sf(abs(t), df), rel=1e-9)
    assert math.isnan(stats.welch_p([1.0], b)) and math.isnan(stats.welch_p([2.0, 2.0], [2.0, 2.0]))


def test_conclusions_claim_only_what_the_corrected_test_supports():
    groups = {"hi": [90.0, 91.0, 90.5, 91.5, 90.2], "lo": [80.0, 81.0, 80.5, 79.5, 80.8],
              "lo2": [80.2, 80.9, 80.1, 79.9, 81.0]}
    cmp = {(c.a, c.b): c for c in stats.compare_all(groups, family="d")}
    assert cmp[("hi", "lo")].verdict == ">" and cmp[("hi", "lo2")].verdict == ">"
    assert cmp[("lo", "lo2")].verdict == "~"
    assert cmp[("hi", "lo")].p_holm >= cmp[("hi", "lo")].p
    text = "\n".join(stats.conclusion_lines(list(cmp.values())))
    assert "**hi > lo**" in text and "lo vs lo2: not distinguishable at n = 5" in text
    assert "lo > lo2" not in text and "lo2 > lo" not in text


def test_replication_verdicts():
    assert verdict(">", ">") == "confirmed"
    assert verdict(">", "~") == "not replicated"
    assert verdict(">", "<") == "reversed"
    assert verdict("~", "~") == "consistent"
    assert verdict("~", "<") == "new"


def test_preopt_benchmark_interleaves_its_repeats(monkeypatch, capsys):
    """The official solver and the closed form alternate, so machine load hits both alike."""
    from types import SimpleNamespace

    from benchmarks import preopt

    calls = []

    def fake_solve(shape, **opts):
        calls.append((shape["embed_dim"], opts.get("solver")))
        sol = SimpleNamespace(solver_info={"layer0": {}}, fit_mse=0.0, target_mass=0.5, offsets=[[(0, 0)]])
        return 1.0, sol

    monkeypatch.setattr(preopt, "solve", fake_solve)
    monkeypatch.setattr("sys.argv", ["preopt", "--repeats", "3"])
    preopt.main()
    vit_t2 = [s for c, s in calls if c == 192]
    assert vit_t2 == ["adam", "closed_form"] * 3
    assert capsys.readouterr().out.strip().endswith("ratio: 1")


def test_fragile_is_within_a_factor_of_two_of_alpha():
    from structinit.reporting.stats import is_fragile
    assert [is_fragile(p) for p in (0.0249, 0.025, 0.045, 0.05, 0.1, 0.1001, float("nan"))] == \
        [False, True, True, True, True, False, False]


def test_reports_record_the_verdicts_they_state_and_fragile_ones_are_not_bolded():
    from structinit.reporting.stats import compare_all, conclusion_lines, conclusions_record, recording_conclusions
    groups = {"a": [90.0, 91.0, 92.0, 93.0, 94.0], "b": [10.0, 11.0, 12.0, 13.0, 14.0],
              "c": [90.5, 92.0, 93.5, 95.0, 96.5]}
    comparisons = compare_all(groups, family="digits")
    with recording_conclusions() as entries:
        lines = conclusion_lines(comparisons)
    record = conclusions_record("main_table.md", entries)
    assert [c["id"] for c in record["conclusions"]] == ["digits: a vs b", "digits: a vs c", "digits: b vs c"]
    assert [c["verdict"] for c in record["conclusions"]] == [">", "~", "<"]
    assert all(not c["fragile"] for c in record["conclusions"])
    assert any("**a > b**" in line for line in lines)
    # a verdict at p = 0.04 (Holm) is fragile: stated, flagged, not bolded
    from structinit.reporting.stats import Comparison
    close = Comparison("digits", "x", "y", 60.0, 50.0, 5, 5, 0.04, 0.04, ">")
    with recording_conclusions() as entries:
        (line,) = conclusion_lines([close])
    assert "**" not in line and "x > y" in line and "fragile" in line
    assert conclusions_record("r.md", entries)["conclusions"][0]["fragile"] is True
