"""Stage scripts: what DVC must know about them, and what they hand the trainer."""
from pathlib import Path

import torch

from structinit.pipeline.load import load_params
from stages.train import cell_fingerprint
from structinit.pipeline.build import CellModel, build_cell_model
from structinit.training.checkpoint import code_fingerprint

REPO = Path(__file__).resolve().parents[1]


def test_a_cell_solved_in_process_can_resume(digits):
    """The checkpoint fingerprint of an impulse cell that solves its own Q/K (pseudo-input and
    heads/width studies) is the same on every run: configuration only. It used to contain
    the solve's seconds, so such cells never resumed."""
    params = load_params(REPO / "params.yaml")
    cell = CellModel(dataset="digits", init="impulse3", pseudo="UU")
    records = [build_cell_model(cell, params, digits.spec, seed=0)[1] for _ in range(2)]
    # timings differ from run to run, though not always by a measurable amount: make sure they do
    records[1]["solve_seconds"] = records[0]["solve_seconds"] + 1.0
    subset = torch.arange(20)
    code = code_fingerprint()
    assert cell_fingerprint(records[0], subset, code) == cell_fingerprint(records[1], subset, code)
    assert "solve_seconds" not in str(cell_fingerprint(records[0], subset, code))


def test_timing_logs_stay_out_of_outputs(tmp_path, monkeypatch):
    """Timings go to logs/timings/<output>.json, never into (or beside, inside) an output
    folder, whether the output is given relative or absolute."""
    from stages.common import TIMINGS_DIR, log_timings

    monkeypatch.chdir(tmp_path)
    log_timings("results/train/c/seed0", {"s": 1.0})
    log_timings(tmp_path / "results/train/c/seed1", {"s": 2.0})
    logged = sorted(p.name for p in (tmp_path / TIMINGS_DIR / "results/train/c").iterdir())
    assert logged == ["seed0.json", "seed1.json"]
    assert not (tmp_path / "results").exists()
