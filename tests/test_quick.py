"""`./run.sh quick` (tools/quick.py): the real pipeline on a reduced budget, in a copy.

The default budget is a valid params.yaml; --dry-run trains nothing and says what it would run;
and the command itself runs here on a tiny config (3 epochs, two arms, 300 images, a one-block
model), prints the curve, the final accuracies and both contrasts, says it is a quick look,
and leaves this repository's results and reports as they were."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tools import quick
from structinit.pipeline.params import validate_params

REPO = Path(__file__).resolve().parents[1]
TINY = ["--epochs", "3", "--seeds", "0", "1", "--arms", "trunc_normal", "impulse3", "-S", "data.train_size=300",
        "-S", "recipes.digits.model.embed_dim=24", "-S", "recipes.digits.model.depth=1"]


def default_params() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_the_quick_budget_is_a_valid_params_file():
    p = quick.quick_params(default_params())
    validate_params(p, REPO)
    train = p["recipes"]["digits"]["train"]
    assert train["epochs"] == quick.EPOCHS and p["grid"]["seeds"] == quick.SEEDS and train["eval_every"] == 1
    assert train["warmup_epochs"] / train["epochs"] == pytest.approx(8 / 160)       # the recipe's 5 % share
    assert all(not p["studies"][s]["datasets"] for s in p["studies"])
    assert p["grid"]["baselines"] == default_params()["grid"]["baselines"]         # the main grid's arms


def test_arms_and_overrides_shape_the_copy_and_bad_ones_are_refused():
    p = quick.quick_params(default_params(), 3, [0], ["trunc_normal", "impulse5"], ["data.train_size=300"])
    validate_params(p, REPO)
    assert p["grid"]["baselines"] == ["trunc_normal"] and p["grid"]["kernels"] == [5] and p["init"]["kernel"] == 5
    assert p["data"]["train_size"] == 300
    assert quick.stage_names(p)[-4:] == ["train_baseline@digits-trunc_normal", "train_impulse@digits-5",
                                         "aggregate", "curves"]
    with pytest.raises(ValueError, match="structured-init arm"):
        quick.quick_params(default_params(), arms=["trunc_normal"])
    with pytest.raises(ValueError, match="not an arm"):
        quick.quick_params(default_params(), arms=["impulse3", "no_such_init"])


def test_dry_run_says_what_it_would_run_and_runs_nothing():
    r = subprocess.run([sys.executable, "-m", "tools.quick", "--dry-run"], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "QUICK LOOK, NOT THE RESULT" in r.stdout and "train_impulse@digits-3" in r.stdout
    assert "Expected: about" in r.stdout and "minutes" in r.stdout
    assert "0.08-0.12" in r.stdout                    # what the warm-up's first epochs look like
    assert "Running in" not in r.stdout


def test_a_bad_override_fails_in_one_line_before_any_copy():
    r = subprocess.run([sys.executable, "-m", "tools.quick", "--dry-run", "-S", "recipes.digits.train.lr=-1"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.startswith("quick: ") and "lr" in r.stderr


def test_sparkline():
    assert quick.sparkline([0, 10, 50, 99.9, 100]) == "▁▁▅██"


def _summary_n() -> dict:
    """Each arm's seed count in this repository's reports/summary.json (the tiny run's is 2)."""
    import json

    summary = json.loads((REPO / "reports/summary.json").read_text())
    return {d: {k: v.get("n") for k, v in arms.items()} for d, arms in summary.items()}


def test_the_quick_command_runs_the_pipeline_in_a_copy_on_a_tiny_config():
    before = _summary_n()
    r = subprocess.run([sys.executable, "-m", "tools.quick", *TINY], cwd=REPO, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    for stage in ("train_baseline@digits-trunc_normal", "train_impulse@digits-3", "aggregate", "curves"):
        assert f"] {stage}" in out, out
    assert "Test accuracy per epoch" in out and "Final test accuracy (%) at epoch 3" in out
    assert "Primary contrast, final test accuracy at epoch 3: Imp.-3 - Trunc Normal" in out
    assert "Speed endpoint (contrasts.speed), test accuracy at epoch 2 of 3: Imp.-3 - Trunc Normal" in out
    assert out.count("QUICK LOOK, NOT THE RESULT") == 2                # before and after
    assert "0.08-0.12" in out
    copy = Path(out.split("Running in ", 1)[1].split(" ...", 1)[0])
    assert REPO not in copy.parents and not copy.exists()              # a copy elsewhere, removed after
    assert _summary_n() == before                                       # this repository's reports stayed
