"""The evidence (structinit/evidence): frozen stages whose verdicts the reports quote only while
what they were made from still holds, keyed on the inputs' hashes as dvc.lock records them."""
import json
import re
import warnings
from pathlib import Path

import pandas as pd
import pytest
import yaml

from structinit.records import (EVIDENCE, RECORD, Freshness, dvc_md5, evidence_freshness, freshness, inputs_record,
                                 lock_hashes, read_record, unmeasured_line)
from structinit.reporting.budget import budget_sentence, read_budget_finals

REPO = Path(__file__).resolve().parents[1]


def lock(**outs) -> dict:
    """A dvc.lock with one stage per output."""
    return {"schema": "2.0", "stages": {f"s{i}": {"cmd": "x", "outs": [{"path": p, "hash": "md5", "md5": m}]}
                                        for i, (p, m) in enumerate(outs.items())}}


CELLS = {"results/train/digits-impulse3": "aaa.dir", "results/train/digits-trunc_normal": "bbb.dir"}


def test_fresh_when_every_recorded_input_has_its_hash():
    record = {"evidence": "epoch_budget", "inputs": dict(CELLS)}
    current = lock_hashes(lock(**CELLS, **{"reports/headline.md": "ccc"}))
    assert freshness(record, current) == Freshness("fresh")
    assert freshness(record, current).fresh


def test_a_retrained_cell_makes_it_stale_and_is_named():
    record = {"evidence": "epoch_budget", "inputs": dict(CELLS)}
    current = lock_hashes(lock(**{**CELLS, "results/train/digits-impulse3": "zzz.dir"}))
    f = freshness(record, current)
    assert f.status == "stale" and f.changed == ("results/train/digits-impulse3",)
    assert "results/train/digits-impulse3" in str(f)


def test_a_cell_gone_from_the_lock_makes_it_stale():
    record = {"evidence": "epoch_budget", "inputs": dict(CELLS)}
    current = lock_hashes(lock(**{"results/train/digits-impulse3": "aaa.dir"}))
    assert freshness(record, current).changed == ("results/train/digits-trunc_normal",)


def test_no_record_is_unrecorded_never_fresh():
    current = lock_hashes(lock(**CELLS))
    assert freshness(None, current).status == "unrecorded"
    assert freshness({"evidence": "x", "inputs": {}}, current).status == "unrecorded"
    assert not freshness(None, current).fresh


def test_an_edit_outside_the_recorded_inputs_changes_nothing():
    """Keyed on outputs, not source files: code (a comment edit) is not an input."""
    record = {"evidence": "epoch_budget", "inputs": dict(CELLS)}
    before = lock(**CELLS)
    after = json.loads(json.dumps(before))
    after["stages"]["s0"]["deps"] = [{"path": "structinit/training/trainer.py", "md5": "edited"}]
    assert freshness(record, lock_hashes(after)) == freshness(record, lock_hashes(before)) == Freshness("fresh")


def test_the_workspace_hash_is_dvcs(tmp_path):
    """What a stage records (dvc_md5 of the files) is what dvc.lock records: every committed
    output under results/ and reports/ hashes to its dvc.lock md5."""
    outs = {p: m for p, m in lock_hashes(yaml.safe_load((REPO / "dvc.lock").read_text())).items()
            if p.startswith("results/train/") and (REPO / p).exists()}
    assert outs
    assert {p: dvc_md5(REPO / p) for p in outs} == outs
    assert dvc_md5(tmp_path / "absent") is None


def test_a_record_against_the_workspace(tmp_path):
    cell = tmp_path / "results/train/digits-impulse3/seed0"
    cell.mkdir(parents=True)
    (cell / "metrics.json").write_text('{"final_test_acc": 0.9}\n')
    folder = tmp_path / "results/evidence/epoch_budget"
    folder.mkdir(parents=True)
    assert evidence_freshness(folder, tmp_path).status == "unrecorded"
    record = inputs_record("epoch_budget", ["results/train/digits-impulse3"], tmp_path)
    (folder / RECORD).write_text(json.dumps(record))
    assert read_record(folder) == record and evidence_freshness(folder, tmp_path).fresh
    (cell / "metrics.json").write_text('{"final_test_acc": 0.8}\n')          # retrained: other bytes
    assert evidence_freshness(folder, tmp_path).changed == ("results/train/digits-impulse3",)
    with pytest.raises(FileNotFoundError, match="digits-mimetic"):
        inputs_record("epoch_budget", ["results/train/digits-mimetic"], tmp_path)


def test_a_report_quotes_the_budget_verdict_only_while_fresh(tmp_path):
    cell = tmp_path / "results/train/digits-impulse3"
    cell.mkdir(parents=True)
    (cell / "m.json").write_text("1")
    folder = tmp_path / "ev"
    folder.mkdir()
    rows = [{"dataset": "digits", "init": "impulse3", "budget": b, "seed": s, "epoch": b, "test_acc": acc}
            for b, acc in ((160, 90.0), (320, 95.0)) for s in (0, 1, 2)]
    pd.DataFrame(rows).to_csv(folder / "epochs.csv", index=False)
    stale = read_budget_finals(folder, ["digits"], tmp_path)                   # no record: unrecorded
    assert stale == {"digits": None}
    line = budget_sentence(None, 160)
    assert line == unmeasured_line("epoch_budget", "Epoch budget 160")
    assert "has not been measured on these cells" in line and "dvc repro -f -s epoch_budget" in line
    assert "NOT converged" not in line
    (folder / RECORD).write_text(json.dumps(inputs_record("epoch_budget", ["results/train/digits-impulse3"],
                                                          tmp_path)))
    fresh = read_budget_finals(folder, ["digits"], tmp_path)
    assert fresh["digits"] is not None
    assert budget_sentence(fresh["digits"], 160).startswith("Epoch budget 160: NOT converged")


# ---- the committed repository ---------------------------------------------------------------

# Lines that quote an evidence's verdict (what a report says only while it is fresh).
VERDICTS = {
    "epoch_budget": r"Epoch budget \d+: (NOT )?converged|short of convergence|measured by the epoch|"
                    r"No budget here is converged|Converged budget:",
    "replication": r"Re-tested on seeds|confirmed: \d+ of \d+ stated",
    "regime": r"Regime study|imp3_m030 - trunc_normal =|Imp\.-3 at mass",
    "softness_law": r"max held-out error",
}
PAGES = ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
         *sorted(str(p.relative_to(REPO)) for p in (REPO / "reports").rglob("*.md"))]


def committed_freshness() -> dict[str, Freshness]:
    current = lock_hashes(yaml.safe_load((REPO / "dvc.lock").read_text()))
    return {name: freshness(read_record(REPO / e.folder), current) for name, e in EVIDENCE.items()}


def test_no_page_quotes_a_stale_evidence():
    """The README, docs/ and reports/ quote an evidence's verdict (or include its files) only
    while it is fresh against dvc.lock; each stale one is named in a warning."""
    quoted = []
    for name, f in committed_freshness().items():
        if f.fresh:
            continue
        warnings.warn(f"evidence {name} ({EVIDENCE[name].folder}) is {f}: re-run it with `{EVIDENCE[name].command}`",
                      stacklevel=1)
        for page in PAGES:
            for n, line in enumerate((REPO / page).read_text().splitlines(), 1):
                if re.search(VERDICTS[name], line) or f"include: {EVIDENCE[name].folder}/" in line:
                    quoted.append(f"{page}:{n}: {line[:120]}")
    assert not quoted, "pages quote stale evidence:\n" + "\n".join(quoted)


def test_the_softness_law_is_fresh():
    """It depends on no trained cell: only the pipeline's own official solves, which a retrain
    does not change."""
    assert committed_freshness()["softness_law"].fresh


def test_every_evidence_is_a_frozen_stage_writing_its_folder():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name, e in EVIDENCE.items():
        assert stages[name].get("frozen") is True, name
        assert [next(iter(o)) if isinstance(o, dict) else o for o in stages[name]["outs"]] == [e.folder]
        assert (REPO / e.folder).is_dir()
        assert not any(str(d).startswith("benchmarks/") for d in stages[name]["deps"])


def test_the_softness_law_solves_every_shape_once(monkeypatch):
    from structinit.evidence import softness_law as ev

    solved = []
    def official(shape, pseudo_input="P"):
        solved.append((shape, pseudo_input))
        return 0.5, 0.1

    monkeypatch.setattr(ev, "official", official)
    everything = ev.solve_rows(log=lambda *_: None)
    assert len(everything) == len(ev.FIT) + len(ev.HELD_OUT) + len(ev.OTHER_PSEUDO_INPUTS) == len(solved)
    assert len(set(solved)) == len(solved)
