"""The studies' statistics and reports: the smallest difference a design detects (exact
noncentral t), the equivalence test (TOST), and each study's report from synthetic cells, its
tests taken from params.yaml's studies.<study>.contrasts."""
import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats as sps

from structinit.pipeline.cells import STUDIES, main_cell, study_cell
from structinit.pipeline.params import validate_params
from structinit.reporting import paper, stats
from structinit.reporting.study_reports import STUDY_REPORTS, study_plan

REPO = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((REPO / "params.yaml").read_text())


# --- the smallest detectable difference -----------------------------------------------------

def test_power_matches_the_textbook_paired_t_value():
    """G*Power's paired t test (two-tailed, alpha 0.05, effect size dz = 0.5): 34 pairs for 80 %
    power, actual power 0.8078; 33 pairs fall short. So the smallest detectable difference in SD
    units is just below 0.5 at n = 34 and just above it at n = 33."""
    assert stats.paired_t_power(0.5, 1.0, 34) == pytest.approx(0.8078, abs=5e-4)
    assert stats.paired_t_power(0.5, 1.0, 33) < 0.8
    assert stats.min_detectable_difference(1.0, 34) < 0.5 < stats.min_detectable_difference(1.0, 33)
    # at the root, the power is 80 %; the difference scales with the SD
    d = stats.min_detectable_difference(1.0, 5, 0.025)
    assert stats.paired_t_power(d, 1.0, 5, 0.025) == pytest.approx(0.8, abs=1e-9)
    assert stats.min_detectable_difference(2.5, 5, 0.025) == pytest.approx(2.5 * d, rel=1e-9)


@pytest.mark.parametrize("n, alpha", [(2, 0.05), (3, 0.05), (3, 0.025), (5, 0.0125)])
def test_detectable_difference_is_detected_80_percent_of_the_time(n, alpha):
    """Brute force: draw n paired differences at the computed difference, run scipy's one-sample
    t test on them 200,000 times; it rejects at alpha in 80 % of the draws (binomial SE 0.0009)."""
    d = stats.min_detectable_difference(1.0, n, alpha)
    x = np.random.default_rng(n * 1000 + round(alpha * 1e4)).normal(d, 1.0, size=(200_000, n))
    rejected = sps.ttest_1samp(x, 0.0, axis=1).pvalue < alpha
    assert rejected.mean() == pytest.approx(0.8, abs=0.004)


def test_with_many_pairs_it_approaches_the_normal_approximation():
    for alpha in (0.05, 0.0125):
        z = (sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(0.8)) * 1.0 / math.sqrt(20_000)
        assert stats.min_detectable_difference(1.0, 20_000, alpha) == pytest.approx(z, rel=1e-3)
    # and with few pairs the t test needs far more: n = 3 at alpha 0.05 is 3.26 SD, not 1.62
    assert stats.min_detectable_difference(1.0, 3) == pytest.approx(3.264, abs=1e-3)


def test_no_test_no_detectable_difference():
    assert math.isnan(stats.min_detectable_difference(1.0, 1))
    assert math.isnan(stats.min_detectable_difference(0.0, 5))
    assert math.isnan(stats.min_detectable_difference(float("nan"), 5))


def test_far_tails_of_the_noncentral_t_where_scipy_returns_nan():
    """scipy's nct has no value far in a tail at large noncentrality (df 1, nc 22); the
    integral over the chi-square part gives it, and agrees with nct wherever nct has one."""
    for x, df, nc in ((50.9, 1, 10.0), (-8.86, 2, 5.0), (2.0, 3, 4.0), (-2.0, 3, 4.0), (4.3, 4, 1.5)):
        assert stats._nct_tail_integral(x, df, nc, True) == pytest.approx(sps.nct.sf(x, df, nc), rel=1e-6)
        assert stats._nct_tail_integral(x, df, nc, False) == pytest.approx(sps.nct.cdf(x, df, nc), rel=1e-6, abs=1e-15)
    assert math.isnan(sps.nct.cdf(-50.9, 1, 22.0))                         # what the fallback is for
    assert 0 <= stats.nct_tail(-50.9, 1, 22.0, upper=False) < 1e-15
    assert math.isfinite(stats.min_detectable_difference(1.0, 2, 0.0125))  # df 1, large noncentrality


def test_detectable_differences_use_holms_first_step_per_family():
    fam = {"a": {0: 90.0, 1: 91.0, 2: 92.5}, "b": {0: 89.0, 1: 90.8, 2: 91.0}, "c": {0: 80.0, 1: 82.0, 2: 81.0}}
    rows = stats.detectable_differences({"digits": fam, "other": {"a": fam["a"], "b": fam["b"]}},
                                        [("a", "b"), ("c", "b")], 0.05,
                                        reference=lambda family, a, b: (0.5, 5, "main"))
    assert [(r.family, r.a, r.alpha) for r in rows] == [("digits", "a", 0.025), ("digits", "c", 0.025),
                                                        ("other", "a", 0.05)]
    sd = float(np.std([1.0, 0.2, 1.5], ddof=1))
    assert rows[0].sd == pytest.approx(sd)
    assert rows[0].detectable == pytest.approx(stats.min_detectable_difference(sd, 3, 0.025))
    assert rows[0].detectable_reference == pytest.approx(stats.min_detectable_difference(0.5, 3, 0.025))


# --- equivalence: two one-sided tests ------------------------------------------------------

def test_tost_is_two_one_sided_paired_t_tests():
    a = {0: 97.2, 1: 96.9, 2: 97.5, 3: 97.0, 4: 97.3}
    b = {0: 97.0, 1: 97.1, 2: 97.2, 3: 96.6, 4: 97.4}
    d = np.array([a[s] - b[s] for s in a])
    e = stats.tost_paired(a, b, margin=1.0, family="digits", names=("impulse", "learned"))
    # each one-sided test is scipy's one-sample t test against the margin
    assert e.p_lower == pytest.approx(sps.ttest_1samp(d, -1.0, alternative="greater").pvalue, rel=1e-9)
    assert e.p_upper == pytest.approx(sps.ttest_1samp(d, 1.0, alternative="less").pvalue, rel=1e-9)
    assert e.p == max(e.p_lower, e.p_upper) and e.verdict == "equivalent"
    # equivalent <=> the 90 % interval lies inside the margin
    half = sps.t.ppf(0.95, 4) * d.std(ddof=1) / math.sqrt(5)
    assert (e.ci_low, e.ci_high) == pytest.approx((d.mean() - half, d.mean() + half))
    tight = d.mean() + half          # a margin just past the interval's far end: equivalent; just inside: not
    assert stats.tost_paired(a, b, tight + 1e-6).verdict == "equivalent"
    assert stats.tost_paired(a, b, tight - 1e-6).verdict == "not shown"
    # not distinguishable from 0 is not equivalence: a noisy pair fails at the same margin
    noisy = {s: b[s] + (2.5 if s % 2 else -2.3) for s in b}
    assert stats.paired_difference(noisy, b).p > 0.05
    assert stats.tost_paired(noisy, b, 1.0).verdict == "not shown"
    assert math.isnan(stats.tost_paired({0: 1.0}, {0: 1.0}, 1.0).p)
    with pytest.raises(ValueError, match="margin"):
        stats.tost_paired(a, b, 0.0)


def test_tost_rejects_at_most_alpha_of_the_time_at_the_margin():
    """Brute force: true difference exactly at the margin, so the claim of equivalence is false;
    TOST claims it in at most alpha of 10,000 draws (n = 3; binomial SE 0.0022)."""
    rng = np.random.default_rng(7)
    zero = dict.fromkeys(range(3), 0.0)
    claims = sum(stats.tost_paired(dict(enumerate(x)), zero, 1.0).verdict == "equivalent"
                 for x in rng.normal(1.0, 0.4, size=(10_000, 3)))
    assert claims / 10_000 <= 0.05 + 0.006


# --- params: every study on, its plan validated --------------------------------------------

def test_every_study_is_on_in_the_default_at_three_seeds_of_the_main_grid():
    params = validate_params(copy.deepcopy(DEFAULT))
    grid_seeds = params["grid"]["seeds"]
    for study in STUDIES:
        s = params["studies"][study]
        assert s["datasets"] == ["digits"], study
        assert len(s["seeds"]) >= 3 and s["seeds"] == grid_seeds[:len(s["seeds"])], study
        assert study_plan(params, study).planned, study
    assert study_plan(params, "convmixer").equivalence == [("impulse", "learned", 1.0)]
    # the study's cells train the recipe's converged budget: no study overrides epochs
    assert params["recipes"]["digits"]["train"]["epochs"] == 160


def _with(dotted: str, value):
    p = copy.deepcopy(DEFAULT)
    *path, last = dotted.split(".")
    node = p
    for key in path:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[last] = value
    return p


@pytest.mark.parametrize("dotted, value, fragments", [
    ("studies.convmixer.contrasts.planned", ["impluse vs learned"],
     ["studies.convmixer.contrasts.planned[0] = 'impluse vs learned'", "'impluse' is not a filter mode",
      "['learned', 'random', 'impulse', 'box']"]),
    ("studies.pseudo_input.contrasts.planned", ["UU vs PP", "XQ vs PP"],
     ["studies.pseudo_input.contrasts.planned[1] = 'XQ vs PP'", "not a pseudo-input variant", "'PPL'"]),
    ("studies.heads_width.contrasts.planned", ["impulse3 vs xavier"],
     ["studies.heads_width.contrasts.planned[0]", "'xavier' is not an initializer", "impulse<k>"]),
    ("studies.data_size.contrasts.planned", ["ours vs trunc_normal"],
     ["studies.data_size.contrasts.planned[0]", "'ours' is not an initializer"]),
    ("studies.data_size.contrasts.planned", ["mimetic vs mimetic"], ["studies.data_size.contrasts.planned", "itself"]),
    ("studies.data_size.contrasts.planned", ["mimetic vs trunc_normal", "trunc_normal vs mimetic"],
     ["studies.data_size.contrasts.planned", "planned twice"]),
    ("studies.data_size.contrasts.planned", [], ["studies.data_size.contrasts.planned = []", "at least 1"]),
    ("studies.convmixer.contrasts.planned", ["impulse versus learned"], ["'<arm> vs <arm>'"]),
    ("studies.convmixer.contrasts.equivalence", [{"pair": "impulse vs learned", "margin": 0}],
     ["studies.convmixer.contrasts.equivalence[0].margin = 0", "greater than 0"]),
    ("studies.convmixer.contrasts.equivalence", [{"pair": "impulse vs gabor", "margin": 1.0}],
     ["studies.convmixer.contrasts.equivalence[0].pair = 'impulse vs gabor'", "'gabor' is not a filter mode"]),
    ("studies.convmixer.contrasts.alpha", 1.5, ["studies.convmixer.contrasts.alpha = 1.5", "less than 1"]),
])
def test_a_bad_study_plan_is_refused_naming_the_value_and_what_is_allowed(dotted, value, fragments):
    from structinit.pipeline.params import ParamsError

    with pytest.raises(ParamsError) as e:
        validate_params(_with(dotted, value))
    assert any(all(f in line for f in fragments) for line in str(e.value).splitlines()), str(e.value)


def test_a_study_without_a_plan_is_refused():
    from structinit.pipeline.params import ParamsError

    p = copy.deepcopy(DEFAULT)
    del p["studies"]["heads_width"]["contrasts"]
    with pytest.raises(ParamsError, match="studies.heads_width.contrasts: missing"):
        validate_params(p)


# --- the reports, from synthetic cells -----------------------------------------------------

def _fake_run(folder: Path, acc: float):
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"final_test_acc": acc / 100, "best_test_acc": acc / 100,
                                                     "step": 159}))
    (folder / "plots/metrics/test").mkdir(parents=True)
    (folder / "plots/metrics/test/acc.tsv").write_text(f"step\tacc\n159\t{acc / 100}\n")
    (folder / "params.yaml").write_text(yaml.safe_dump({"compute_dtype": "fp32", "device": "cpu",
                                                        "cpu": "test CPU", "cpu_threads": 2}))


MAIN = {"trunc_normal": 95.7, "impulse3": 95.3, "mimetic": 96.8}
# the main grid's per-seed noise: Imp.-3 − Trunc Normal over seeds 0-4 has SD 1.0 exactly
MAIN_NOISE = {"trunc_normal": [0.0] * 5, "impulse3": [1.0, -1.0, 1.0, -1.0, 0.0],
              "mimetic": [0.3, -0.2, 0.1, 0.0, -0.2]}


def _fake_main(root: Path, params: dict):
    for init, base in MAIN.items():
        for seed in params["grid"]["seeds"]:
            _fake_run(root / "train" / main_cell("digits", init) / f"seed{seed}", base + MAIN_NOISE[init][seed])


def _report(study, params, root):
    return STUDY_REPORTS[study](params, root / "train", root / "studies", root / f"reports/{study}.md")


def _seeds(params, study, n):
    params["studies"][study]["seeds"] = params["grid"]["seeds"][:n]
    return params


def test_convmixer_report_tests_the_plan_states_tost_and_what_the_design_detects(tmp_path):
    params = _seeds(copy.deepcopy(DEFAULT), "convmixer", 5)          # 5 seeds: a study with verdicts
    _fake_main(tmp_path, params)
    acc = {"learned": [97.0, 96.6, 97.3, 96.8, 97.1], "impulse": [97.1, 96.4, 97.4, 96.8, 97.1]}
    d = np.array(acc["impulse"]) - np.array(acc["learned"])                 # +0.1, -0.2, +0.1, 0, 0
    for mode, values in acc.items():
        for seed, a in enumerate(values):
            _fake_run(tmp_path / "studies/convmixer" / study_cell("digits", "cm64d4k3", mode) / f"seed{seed}", a)
    text = _report("convmixer", params, tmp_path)
    assert "**Planned contrasts** (Holm-corrected together within each family):" in text
    assert "- digits, cm64d4k3: impulse − learned: +0.00 points, 95 % CI [" in text
    assert ("Planned in params.yaml (`studies.convmixer.contrasts`) before the run, two-sided paired t tests "
            "Holm-corrected within each family (dataset, size) at α = 0.05: impulse vs learned.") in text
    # TOST against params.yaml's margin of 1 point
    p = max(sps.ttest_1samp(d, -1.0, alternative="greater").pvalue, sps.ttest_1samp(d, 1.0, alternative="less").pvalue)
    line = next(x for x in text.splitlines() if x.startswith("- digits, cm64d4k3: impulse − learned") and "TOST" in x)
    assert "90 % CI [" in line and f"TOST p = {p:.2g}" in line
    assert ("**impulse ≈ learned, equivalent within ±1 points**" in line) == (p < 0.05)
    assert "## Equivalence: the paper's \"frozen impulse ≈ learned\"" in text
    # the smallest detectable difference: study SD and the main grid's primary (Imp.-3 − Trunc Normal, SD 1)
    row = next(x for x in text.splitlines() if x.startswith("| digits, cm64d4k3"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2:4] == ["5", "0.05"]
    assert cells[4] == f"{d.std(ddof=1):.2f}"
    assert cells[5] == f"{stats.min_detectable_difference(d.std(ddof=1), 5, 0.05):.2f}"
    assert cells[6:9] == ["Imp.-3 − Trunc Normal (primary)", "5", "1.00"]
    assert cells[9] == f"{stats.min_detectable_difference(1.0, 5, 0.05):.2f}"
    # the paper's numbers are labelled secondary; the unreliable ViT quote is gone
    assert f"ConvMixer on CIFAR-10 (top-1 %; {paper.SECONDARY})" in text
    assert "90.67" not in text and "87.27" not in text and "width 256" not in text
    # a planned pair whose arm did not run is said so
    params["studies"]["convmixer"]["contrasts"]["planned"] = ["impulse vs learned", "random vs learned"]
    assert "Planned but not run (an arm is not in this study's runs): random vs learned." in \
        _report("convmixer", params, tmp_path)


def test_pseudo_input_report_tests_each_variant_against_the_main_grids(tmp_path):
    params = _seeds(copy.deepcopy(DEFAULT), "pseudo_input", 5)
    _fake_main(tmp_path, params)
    for variant, base in (("UU", 90.0), ("PPL", 95.0)):
        for seed in range(5):
            _fake_run(tmp_path / "studies/pseudo_input" / study_cell("digits", variant) / f"seed{seed}",
                      base + (0.3, -0.4, 0.2, -0.1, 0.0)[seed])
    text = _report("pseudo_input", params, tmp_path)
    assert "- digits: U → U, shared − P → P, shared (main grid): " in text
    assert "**P → P, shared (main grid) > U → U, shared**" in text
    assert ("Holm-corrected within each family (dataset) at α = 0.05: U → U, shared vs P → P, shared (main grid); "
            "P → P, per-layer vs P → P, shared (main grid).") in text
    row = next(x for x in text.splitlines() if x.startswith("| digits ") and "U → U, shared − P → P" in x)
    assert [c.strip() for c in row.strip("|").split("|")][2:4] == ["5", "0.025"]          # Holm: 0.05 / 2
    assert "Imp.-3 − Trunc Normal (primary)" in text                      # no main-grid pair of variants
    assert f"Single runs, {paper.SECONDARY}" in text and "paper = CIFAR-10" in text


def _heads_width(tmp_path, seeds: int):
    """The report and its conclusions record at `seeds` seeds (the main grid's five as ever)."""
    params = _seeds(copy.deepcopy(DEFAULT), "heads_width", seeds)
    _fake_main(tmp_path, params)
    for init, base in (("trunc_normal", 95.0), ("impulse3", 96.0)):
        for seed in range(seeds):
            _fake_run(tmp_path / "studies/heads_width" / study_cell("digits", "h6", init) / f"seed{seed}",
                      base + (0.3, -0.4, 0.2, -0.3, 0.2)[seed] * (init == "impulse3"))
    with stats.recording_conclusions() as recorded:
        text = _report("heads_width", params, tmp_path)
    return text, stats.conclusions_record("heads_width.md", recorded)


def test_heads_width_report_marks_the_paper_quotes_secondary_and_derived(tmp_path):
    text, _ = _heads_width(tmp_path, 3)
    assert f"vit_s_h6 ({paper.SECONDARY})" in text and "66.81 (derived)" in text and "67.25 (derived)" in text
    assert "75.97 " in text and "75.97 (derived)" not in text
    assert "derived, not quoted: Imp.-3's number minus its quoted gain over Trunc Normal (+9.16 / +8.15)" in text


def test_a_study_of_3_seeds_describes_its_pairs_and_says_why(tmp_path):
    """3 seeds: another CPU flipped the h6 verdict (issue 63), so no verdict; the record holds
    estimates, which ./run.sh verify never compares."""
    text, record = _heads_width(tmp_path, 3)
    assert "## Estimates (descriptive: no verdict)" in text
    assert ("3 seeds, fewer than the 5 a study's verdict needs (as the main grid's), because a paired test on so "
            "few seeds has 2 degrees of freedom, and another CPU moves a run about as much as another seed does "
            "(benchmarks/cpu_variation.md): enough to flip such a verdict.") in text
    assert "- digits, h6: Imp.-3 − Trunc Normal: +1.03 points, 95 % CI [" in text and "n = 3 paired\n" in text
    assert "- digits, recipe: Imp.-3 − Trunc Normal: " in text
    assert " > " not in text and " < " not in text and "Holm-corrected" not in text and "detects" not in text
    assert record["conclusions"] == []
    assert [(c["id"], c["role"], c["verdict"]) for c in record["described"]] == [
        ("digits, h6: impulse3 vs trunc_normal", "descriptive", ""),
        ("digits, recipe: impulse3 vs trunc_normal", "descriptive", "")]


def test_a_study_of_5_seeds_tests_its_plan(tmp_path):
    text, record = _heads_width(tmp_path, 5)
    assert "**Planned contrasts** (Holm-corrected together within each family):" in text and "Estimates" not in text
    assert "- digits, h6: Imp.-3 − Trunc Normal: +1.00 points" in text and "**Imp.-3 > Trunc Normal**" in text
    # the same pair in the main grid is the reference: SD of [1, -1, 1, -1, 0] = 1
    row = next(x for x in text.splitlines() if x.startswith("| digits, h6"))
    assert [c.strip() for c in row.strip("|").split("|")][6:9] == ["Imp.-3 − Trunc Normal", "5", "1.00"]
    assert [c["verdict"] for c in record["conclusions"]] == [">", "~"]


def test_a_study_report_fails_naming_a_missing_main_grid_run(tmp_path):
    params = _seeds(copy.deepcopy(DEFAULT), "convmixer", 5)     # its tests read the main grid's SD
    _fake_main(tmp_path, params)
    for mode in ("learned", "impulse"):
        for seed in range(5):
            _fake_run(tmp_path / "studies/convmixer" / study_cell("digits", "cm64d4k3", mode) / f"seed{seed}",
                      96.0 + seed * 0.1 + (mode == "impulse") * (0.2, -0.1, 0.0, 0.1, -0.2)[seed])
    import shutil
    shutil.rmtree(tmp_path / "train/digits-impulse3/seed4")
    from structinit.io import MissingFileError

    with pytest.raises(MissingFileError, match=r"missing main-grid results for 1 run\(s\).*digits-impulse3/seed4"):
        _report("convmixer", params, tmp_path)


def test_the_unreliable_quote_appears_nowhere():
    """method page, section 6: "ViT embed 256, 8 heads: 90.67 vs 87.27" is unreliable (90.67 is
    Imp.-5's CIFAR-10 main-table cell): no report, page or module quotes it."""
    files = [*REPO.glob("*.md"), *REPO.glob("docs/*.md"), *REPO.glob("reports/*.md"),
             *REPO.glob("structinit/**/*.py"), *REPO.glob("stages/*.py"), *REPO.glob("benchmarks/*.py")]
    for f in files:
        text = f.read_text()
        assert "87.27" not in text and "width 256 and 8 heads" not in text, f


# --- reports/README.md says what the configuration ran of the studies ------------------------

def _every_indexed_file(reports: Path, datasets, data_size_datasets):
    from structinit.reporting import index

    names = [name for name, _ in index.TABLES] + [p.format(ds=ds) for ds in datasets for p, _ in index.FIGURES]
    names += [f"figures/main/{ds}.png" for ds in datasets]
    names += [index.DATA_SIZE_FIGURE[0].format(ds=ds) for ds in data_size_datasets]
    for name in names:
        if name.endswith("/"):
            (reports / name).mkdir(parents=True, exist_ok=True)
        else:
            (reports / name).parent.mkdir(parents=True, exist_ok=True)
            (reports / name).touch()


def test_the_index_says_every_study_runs_in_the_default(tmp_path):
    from structinit.reporting.index import build_index

    studies = {study: s["datasets"] for study, s in DEFAULT["studies"].items()}
    _every_indexed_file(tmp_path, ["digits"], studies["data_size"])
    text = build_index(tmp_path, ["digits"], studies)
    assert "## The studies" in text and "Every study runs in this configuration, as in the embedded default" in text
    for name in ("convmixer_filters.md", "pseudo_input.md", "heads_width.md", "data_size.md"):
        assert any(line.startswith(f"- `{name}`:") and line.endswith("ran on digits") for line in text.splitlines())
    assert "![figures/data_size/digits.png](figures/data_size/digits.png)" in text
    off = dict(studies, heads_width=[])
    text = build_index(tmp_path, ["digits"], off)
    assert "3 of the 4 studies run in this configuration (the embedded default runs every one)" in text
    assert "- `heads_width.md`: heads and width: off in this configuration (`studies.heads_width.datasets: []`" in text
