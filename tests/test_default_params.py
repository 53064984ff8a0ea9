"""The embedded default's design rules for the studies (issue 32), read from params.yaml as
committed: every study on, on the main grid's dataset, at least 3 seeds, a prefix of the
main grid's seeds (so its rows pair by seed with, and reuse, the main grid's cells), and
planned contrasts beside the main table's."""
from pathlib import Path

import yaml

PARAMS = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
STUDIES = ("convmixer", "pseudo_input", "heads_width", "data_size")


def test_every_study_runs_in_the_default_with_paired_seeds():
    grid = PARAMS["grid"]
    for name in STUDIES:
        study = PARAMS["studies"][name]
        assert study["datasets"] == grid["datasets"], name
        seeds = study["seeds"]
        assert len(seeds) >= 3 and seeds == grid["seeds"][:len(seeds)], (name, seeds)
        assert study["contrasts"]["planned"], name


def test_the_convmixer_claim_is_an_equivalence_test_with_a_stated_margin():
    eq = PARAMS["studies"]["convmixer"]["contrasts"]["equivalence"]
    assert [e["pair"] for e in eq] == ["impulse vs learned"] and all(e["margin"] > 0 for e in eq)
