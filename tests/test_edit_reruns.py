"""Deps follow results, end to end: in a temporary copy, after a tiny `dvc repro`, an edit re-runs
the stages whose outputs it can change, and nothing else; a new initializer is one registration
away from the grid."""
import json
import re

import pytest
import yaml

from test_pipeline import set_params, sh, tiny_repo_copy

RESULT_STAGES = re.compile(r"^(train|preoptimize|analyze|reference_solve|study)_?")


def ran(out: str) -> set[str]:
    return set(re.findall(r"Running stage '([^']+)'", out))


def expensive(stages: set[str]) -> set[str]:
    """The stages that train, solve or analyze: what an edit to reports must never re-run."""
    return {s for s in stages if RESULT_STAGES.match(s)}


def append(path, text):
    path.write_text(path.read_text() + text)


@pytest.fixture(scope="module")
def small_repo(tmp_path_factory):
    repo = tiny_repo_copy(tmp_path_factory.mktemp("edits"))
    set_params(repo, **{"grid.kernels": [3], "init.kernel": 3, "grid.seeds": [0],
                        "recipes.digits.train.epochs": 1, "recipes.digits.train.eval_every": 1})
    sh(repo, "git", "commit", "-qam", "smaller")
    first = sh(repo, "dvc", "repro", "aggregate", "attention_report")
    assert {"train_baseline@digits-trunc_normal", "train_impulse@digits-3", "preoptimize@digits-3",
            "analyze_impulse@digits-3"} <= ran(first.stdout)
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", "ran")
    return repo


TARGETS = {"report": "structinit/reporting/tables.py", "label": "structinit/reporting/presentation.py",
           "schema_rule": "structinit/pipeline/params.py", "imagenet_loader": "structinit/data/imagenet.py",
           "streamed_trainer": "structinit/training/streamed.py", "fanout": "scale/fanout.py"}


@pytest.mark.parametrize("edit", ["report", "imagenet_loader", "streamed_trainer", "fanout"])
def test_an_edit_that_cannot_change_results_makes_no_result_stage_stale(small_repo, edit):
    """DVC's own planning after the edit (`dvc status`: the stages whose own deps changed, the
    only way an edit reaches a result stage), so nothing needs to run: no stage that trains,
    solves or analyzes is stale; a report edit makes its report stage stale."""
    repo = small_repo
    target = TARGETS[edit]

    def stale_stages():
        return set(json.loads(sh(repo, "dvc", "status", "--json").stdout or "{}"))
    before = stale_stages()                 # the studies: never run in this small repo
    append(repo / target, f"\n# an edit ({edit})\n")
    try:
        stale = stale_stages() - before
    finally:
        sh(repo, "git", "checkout", "-q", "--", ".")           # nothing ran: the commit is the state
    assert not expensive(stale), f"editing {target} makes {sorted(expensive(stale))} stale"
    if edit == "report":
        assert "aggregate" in stale
    assert stale_stages() == before


@pytest.mark.parametrize("edit", ["label", "schema_rule"])
def test_an_edit_that_cannot_change_results_retrains_nothing(small_repo, edit):
    """The same, run for real where the run itself is the point: a label edit shows in the
    regenerated table; a schema edit re-runs check_params, whose output is the same line, so
    nothing after it runs."""
    repo = small_repo
    target = TARGETS[edit]
    if edit == "label":        # a real label edit, shown in the table
        path = repo / target
        path.write_text(path.read_text().replace('Shown("Trunc Normal"', 'Shown("Truncated Normal"'))
    else:
        append(repo / target, f"\n# an edit ({edit})\n")
    out = sh(repo, "dvc", "repro", "aggregate", "attention_report").stdout
    assert not expensive(ran(out)), f"editing {target} re-ran {sorted(expensive(ran(out)))}"
    if edit == "label":
        assert "Truncated Normal" in (repo / "reports/main_table.md").read_text()
        assert "aggregate" in ran(out)
    if edit == "schema_rule":
        assert ran(out) == {"check_params"}         # its output is the same line: nothing after it
    sh(repo, "git", "checkout", "-q", "--", ".")
    sh(repo, "dvc", "repro", "aggregate", "attention_report")


def test_a_params_edit_reruns_only_the_stages_that_read_it(small_repo):
    repo = small_repo
    p = yaml.safe_load((repo / "params.yaml").read_text())
    p["studies"]["convmixer"]["seeds"] = [0, 1]         # read by the ConvMixer study alone
    (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    out = sh(repo, "dvc", "repro", "aggregate", "attention_report").stdout
    assert ran(out) == {"check_params"}
    sh(repo, "git", "checkout", "-q", "--", ".")
    sh(repo, "dvc", "repro", "aggregate", "attention_report")


def test_a_bad_params_value_stops_before_any_work(small_repo):
    repo = small_repo
    set_params(repo, **{"data.train_size": 5000})
    r = sh(repo, "dvc", "repro", "aggregate", check=False)
    assert r.returncode != 0
    assert "data.train_size = 5000: digits has 1437 training images" in r.stdout + r.stderr
    assert ran(r.stdout) == {"check_params"} and "Traceback" not in r.stdout + r.stderr
    sh(repo, "git", "checkout", "-q", "--", ".")


def test_a_trainer_edit_retrains_and_reanalyzes(small_repo):
    repo = small_repo
    append(repo / "structinit/training/trainer.py", "\n# an edit\n")
    out = sh(repo, "dvc", "repro", "aggregate", "attention_report").stdout
    assert {"train_baseline@digits-trunc_normal", "train_impulse@digits-3"} <= ran(out)
    assert not {s for s in ran(out) if s.startswith("preoptimize")}    # the solve does not train
    sh(repo, "git", "checkout", "-q", "--", ".")
    sh(repo, "dvc", "repro", "aggregate", "attention_report")


ZERO_QK = '''"""timm's default, then Q and K zeroed: uniform attention at init."""
from structinit.init.baselines import trunc_normal
from structinit.init.registry import register_initializer


@register_initializer("zero_qk")
def _zero_qk(model, *, seed, generator):
    trunc_normal(model)
    for block in model.blocks:
        block.attn.qkv.weight[: 2 * model.embed_dim].zero_()
'''


def commit_all(repo, message):
    sh(repo, "git", "add", "-A")
    sh(repo, "git", "commit", "-qm", message)


# slow: minutes of dvc repro (pytest -m slow); the default suite keeps tests/test_pipeline.py's tiny repro
@pytest.mark.slow
def test_an_initializer_costs_only_its_own_cells(small_repo):
    """docs/library.md's example, as written there: one file, then dvc exp run -S trains its cells
    and nothing else; editing the file retrains them and nothing else; an option swept with -S
    (grid.variants) is one cell more and nothing else. The whole pipeline, studies included."""
    repo = small_repo
    sh(repo, "dvc", "repro")                           # every stage up to date first
    commit_all(repo, "everything ran")
    own = {"train_baseline@digits-zero_qk", "analyze_baseline@digits-zero_qk"}

    (repo / "structinit/init/methods/zero_qk.py").write_text(ZERO_QK)
    commit_all(repo, "zero_qk")
    out = sh(repo, "dvc", "exp", "run", "-S", "grid.baselines=[trunc_normal,zero_qk]").stdout
    assert expensive(ran(out)) == own
    assert "| zero_qk" in (repo / "reports/main_table.md").read_text()   # no presentation entry: its name
    init = (repo / "results/train/digits-zero_qk/seed0/init.json").read_text()
    assert '"method": "zero_qk"' in init
    commit_all(repo, "zero_qk ran")

    append(repo / "structinit/init/methods/zero_qk.py", "        block.attn.qkv.bias[: 2 * model.embed_dim].zero_()\n")
    out = sh(repo, "dvc", "repro").stdout
    assert expensive(ran(out)) == own
    commit_all(repo, "zero_qk edited")

    # the structured init at another target mass: a cell of its own, solved in its stage
    out = sh(repo, "dvc", "exp", "run", "-S", "grid.variants=[{name: imp3_m30, init: impulse, "
             "options: {kernel: 3, target_mass: 0.3}}]").stdout
    assert expensive(ran(out)) == {"train_variant@digits-variant0", "analyze_variant@digits-variant0"}
    record = json.loads((repo / "results/train/digits-imp3_m30/seed0/init.json").read_text())
    assert record["method"] == "impulse"
    assert record["target_mass"] == pytest.approx(0.3, abs=1e-3)       # within the solve's tolerance
    default = json.loads((repo / "results/train/digits-impulse3/seed0/init.json").read_text())
    assert default["target_mass"] != pytest.approx(0.3)          # the default cell kept its own
    assert "| imp3_m30" in (repo / "reports/main_table.md").read_text()
