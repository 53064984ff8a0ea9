"""structinit/pipeline/cells.py: the cells params.yaml asks for, and their names (dvc.yaml's side of the
names is checked in test_dvc_deps.py)."""
import copy
from pathlib import Path

import pytest
import yaml

from structinit.pipeline import cells
from structinit.reporting.presentation import init_label

PARAMS = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())


def test_initializer_names_round_trip_and_bad_names_say_what_is_allowed():
    assert cells.impulse_init(5) == "impulse5" and cells.impulse_kernel("impulse5") == 5
    assert cells.parse_init("impulse3") == ("impulse", 3)
    assert cells.parse_init("mimetic") == ("mimetic", None)
    assert cells.impulse_kernel("mimetic") is None and cells.impulse_kernel("impulse") is None
    assert cells.parse_init("zero_qk") == ("zero_qk", None)     # any registered name: the registry decides
    for bad in ("impulse", "impulsex", "two words"):
        with pytest.raises(ValueError, match=rf"'{bad}' is not a cell's initializer: a registered .*impulse<k>"):
            cells.parse_init(bad)
    assert [init_label(i) for i in ("trunc_normal", "impulse5", "zero_qk")] == ["Trunc Normal", "Imp.-5", "zero_qk"]


def test_pseudo_variant_names_round_trip():
    for variant in ("PP", "UP", "PPL", "BGL"):
        opts = cells.parse_pseudo_variant(variant)
        assert cells.pseudo_variant(**opts) == variant
    assert cells.pseudo_variant("P", None, False) == "PP"
    with pytest.raises(ValueError, match="expected two of"):
        cells.parse_pseudo_variant("PZ")


def test_main_runs_follow_the_grid_in_table_order():
    p = copy.deepcopy(PARAMS)
    p["grid"].update(datasets=["digits", "svhn"], baselines=["mimetic"], kernels=[5, 3], seeds=[1, 0])
    assert cells.main_inits(p) == ["mimetic", "impulse5", "impulse3"]
    runs = cells.main_runs(p)
    assert len(runs) == 2 * 3 * 2 and runs[:3] == [("digits", "mimetic", 1), ("digits", "mimetic", 0),
                                                     ("digits", "impulse5", 1)]


def test_study_runs_reuse_the_main_grid_only_where_the_study_says():
    p = copy.deepcopy(PARAMS)
    pi = p["studies"]["pseudo_input"]
    pi.update(datasets=["digits"], variants=["UU"], seeds=[0, 1], kernel=3)
    runs = cells.study_runs(p, "pseudo_input", "main", "studies")
    assert [(r.folder.as_posix(), r.seed, r.fields["variant"]) for r in runs] == [
        ("studies/pseudo_input/digits-UU", 0, "UU"), ("studies/pseudo_input/digits-UU", 1, "UU"),
        ("main/digits-impulse3", 0, "PP"), ("main/digits-impulse3", 1, "PP")]
    pi["variants"] = ["UU", "PP"]                       # PP trained by the study itself: no reuse
    assert all(r.folder.parts[0] == "studies" for r in cells.study_runs(p, "pseudo_input", "main", "studies"))
    s = p["studies"]["data_size"]
    s["datasets"] = ["digits"]                          # off in the default
    ds = cells.study_runs(p, "data_size", "main", "studies")
    assert ds
    assert len(ds) == len(s["datasets"]) * (len(s["fractions"]) + 1) * len(s["inits"]) * len(s["seeds"])
    assert {r.fields["fraction"] for r in ds if r.folder.parts[0] == "main"} == {1.0}
    assert cells.Run(Path("x/digits-UU"), 2, {}).dir == Path("x/digits-UU/seed2")
    with pytest.raises(ValueError, match="unknown study 'sizes'"):
        cells.study_runs(p, "sizes", "main", "studies")



def test_main_stage_addresses_are_stages_dvc_resolves():
    """The `dvc repro -f <address>` hints name real stages: DVC takes no wildcard there."""
    from dvc.repo import Repo

    assert cells.main_stage("train", "digits", "impulse3") == "train_impulse@digits-3"
    assert cells.main_stage("analyze", "digits", "mimetic") == "analyze_baseline@digits-mimetic"
    with pytest.raises(ValueError, match="the main grid's stages"):
        cells.main_stage("preoptimize", "digits", "impulse3")
    with Repo(str(Path(__file__).resolve().parents[1])) as repo:
        addresses = {s.addressing for s in repo.index.stages}
    wanted = {cells.main_stage(stage, d, i) for d, i, _ in cells.main_runs(PARAMS) for stage in cells.MAIN_STAGES}
    assert wanted <= addresses, sorted(wanted - addresses)


def test_studies_are_the_schemas_study_sections():
    """cells.STUDIES is what the schema, the study_report stage and study_runs iterate over; the
    regime study (beyond the paper, off the default) has its own stages, report and runner."""
    from structinit.pipeline.params import Studies

    assert tuple(f for f in Studies.model_fields if f != "regime") == cells.STUDIES
    assert "regime" in Studies.model_fields and "regime" not in cells.STUDIES


def test_a_variant_is_found_in_grid_variants_or_the_regime_study_s_arms():
    """The train and analyze stages rebuild a cell's model by its name: a grid.variants entry or
    a regime-study arm (studies.regime.arms, the same form) gives its initializer and options."""
    main = {"name": "mimetic_a05", "init": "mimetic", "options": {"alpha": 0.5}}
    arm = {"name": "imp3_m30", "init": "impulse", "options": {"kernel": 3, "target_mass": 0.3}}
    params = {"grid": {"variants": [main]}, "studies": {"regime": {"arms": [arm]}}}
    assert cells.variant(params, "mimetic_a05") == main and cells.variant(params, "imp3_m30") == arm
    assert cells.variant(params, "impulse3") is None
    assert cells.variant({"grid": {"variants": []}}, "imp3_m30") is None      # no regime study: nothing
    assert cells.variant({"grid": {}, "studies": {"regime": {"arms": None}}}, "imp3_m30") is None
