"""How a training stage runs (stages/common.py's environment variables) and what its checkpoint
must match: the code hash, a GPU recipe on a CPU, the restart and checkpoint-interval switches."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from stages.common import refuse_cpu_for_gpu_recipe, requested_checkpoint_seconds, restart_requested
from structinit.errors import StructinitError
from structinit.training.checkpoint import code_fingerprint

REPO = Path(__file__).resolve().parents[1]


def test_the_code_hash_follows_every_loaded_module_of_the_packages(tmp_path, monkeypatch):
    pkg = tmp_path / "probepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "step.py").write_text("LR = 1e-3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import probepkg.step  # noqa: F401
    try:
        before = code_fingerprint(("probepkg",))
        assert code_fingerprint(("probepkg",)) == before and len(before) == 16
        (pkg / "step.py").write_text("LR = 2e-3\n")                 # an edit, as between two runs
        assert code_fingerprint(("probepkg",)) != before
        (pkg / "step.py").write_text("LR = 1e-3\n")
        assert code_fingerprint(("probepkg",)) == before
        assert code_fingerprint(("structinit", "stages")) != before   # the default: the project's own
    finally:
        for name in [n for n in sys.modules if n.startswith("probepkg")]:
            del sys.modules[name]


def test_a_gpu_recipe_on_a_cpu_stops_before_any_work_unless_forced():
    """CIFAR-10's recipe (the paper's, for GPUs) with CUDA hidden: the stage exits 1 in one line
    that says why and how to force it, before reading any data (--data does not exist)."""
    cmd = [sys.executable, "-m", "stages.train", "--dataset", "cifar10", "--init", "trunc_normal",
           "--seeds-from", "grid.seeds", "--data", "no/such/file.pt", "--out", "no/out", "--model-out", "no/m"]
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("STRUCTINIT_ALLOW_CPU", None)
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cifar10's recipe is sized for a GPU") and "STRUCTINIT_ALLOW_CPU=1" in last
    assert "Only digits" in last
    forced = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                            env=dict(env, STRUCTINIT_ALLOW_CPU="1"))
    assert "training cifar10's GPU recipe on the CPU" in forced.stdout
    assert "no/such/file.pt" in forced.stderr            # went on: stopped at the missing data instead


def test_which_recipes_are_refused_on_a_cpu(capsys):
    for dataset in ("cifar10", "cifar100", "svhn", "imagenet"):
        with pytest.raises(StructinitError, match=f"{dataset}'s recipe is sized for a GPU"):
            refuse_cpu_for_gpu_recipe(dataset, "cpu", {}, environ={})
        refuse_cpu_for_gpu_recipe(dataset, "cuda", {}, environ={})             # on a GPU: fine
    refuse_cpu_for_gpu_recipe("digits", "cpu", {}, environ={})                   # the embedded one
    refuse_cpu_for_gpu_recipe("shapes", "cpu", {"shapes": {}}, environ={})       # your own dataset


@pytest.mark.parametrize("raw, expected", [("", 30.0), ("0", 0.0), ("120", 120.0), ("2.5", 2.5)])
def test_checkpoint_seconds(raw, expected):
    assert requested_checkpoint_seconds({"STRUCTINIT_CHECKPOINT_SECONDS": raw}) == expected


@pytest.mark.parametrize("raw", ["-1", "soon", "nan", "inf"])
def test_a_bad_checkpoint_interval_names_the_value_and_the_valid_ones(raw):
    with pytest.raises(StructinitError, match=rf"STRUCTINIT_CHECKPOINT_SECONDS='{raw}': give a number of seconds >= 0"):
        requested_checkpoint_seconds({"STRUCTINIT_CHECKPOINT_SECONDS": raw})


def test_the_restart_switch():
    assert restart_requested({}) is False and restart_requested({"STRUCTINIT_RESTART": "0"}) is False
    assert restart_requested({"STRUCTINIT_RESTART": "1"}) is True
    with pytest.raises(StructinitError, match=r"STRUCTINIT_RESTART='yes': give 1"):
        restart_requested({"STRUCTINIT_RESTART": "yes"})


def test_what_ran_names_the_package_versions_each_run_logged(tmp_path):
    from structinit.reporting.runs import ran_with
    logged = {"compute_dtype": "bf16", "device": "cpu", "cpu": "AMD EPYC", "cpu_threads": 2}
    for i, versions in enumerate(["python 3.11.7, torch 2.14.1", "python 3.11.7, torch 2.14.1",
                                  "python 3.12.1, torch 2.15.0", None]):
        (tmp_path / f"r{i}").mkdir()
        entry = dict(logged, **({"versions": versions} if versions else {}))
        (tmp_path / f"r{i}/params.yaml").write_text(yaml.safe_dump(entry))
    sentence = ran_with(sorted(tmp_path.iterdir()))
    assert sentence == ("Computed in bf16 (autocast) on CPU: AMD EPYC, 2 threads (4 runs). With python 3.11.7, "
                        "torch 2.14.1 (2 runs); python 3.12.1, torch 2.15.0 (1 run); "
                        "unrecorded package versions (1 run)")


def test_the_code_hash_covers_the_script_run_as_main(tmp_path, monkeypatch):
    """`python -m stages.train` runs the stage script as __main__: its source counts too (an
    edit of the script that trains must not resume epochs its old version trained)."""
    import types

    script = tmp_path / "probe_main.py"
    script.write_text("EPOCHS = 1\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    main.__spec__ = types.SimpleNamespace(name="stages.probe_main")
    monkeypatch.setitem(sys.modules, "__main__", main)
    before = code_fingerprint(("stages",))
    script.write_text("EPOCHS = 2\n")
    assert code_fingerprint(("stages",)) != before
    monkeypatch.setattr(main, "__spec__", None)                       # a plain `python script.py`
    assert code_fingerprint(("stages",)) == code_fingerprint(("stages",))


def test_the_refusal_says_how_long_the_cell_would_take_here(capsys):
    line = "fashion_mnist's recipe on this CPU takes about 3 days to train this cell (...)"
    with pytest.raises(StructinitError) as e:
        refuse_cpu_for_gpu_recipe("fashion_mnist", "cpu", {}, environ={}, estimate=lambda: line)
    assert line in str(e.value) and "STRUCTINIT_ALLOW_CPU=1" in str(e.value)
    refuse_cpu_for_gpu_recipe("fashion_mnist", "cpu", {}, environ={"STRUCTINIT_ALLOW_CPU": "1"}, estimate=lambda: line)
    assert line in capsys.readouterr().out
    called = []
    refuse_cpu_for_gpu_recipe("fashion_mnist", "cuda", {}, environ={}, estimate=lambda: called.append(1))
    assert not called                                   # on a GPU nothing is timed


def test_the_estimate_is_the_measured_rate_times_the_cell(monkeypatch):
    from structinit.data.specs import get_spec
    from structinit.pipeline import estimate
    from structinit.pipeline.load import load_params

    rec = load_params().recipe("fashion_mnist")
    # the measurement itself, on a toy model of the recipe: a positive rate from the trainer
    toy = dict(rec.model, patch_size=7, embed_dim=12, depth=1)
    assert 0 < estimate.seconds_per_image(toy, get_spec("fashion_mnist"), rec.train, "cpu", batch=8) < 1
    monkeypatch.setattr(estimate, "seconds_per_image", lambda *a, **k: 0.01)
    line = estimate.training_time_line("fashion_mnist", rec.model, get_spec("fashion_mnist"),
                                       dict(rec.train, epochs=20), 1000, 5, device="cpu")
    assert "about 17 min" in line and "5 model(s) x 20 epochs x 1,000 images at 10.0 ms per image" in line
    assert [estimate.duration(s) for s in (30, 600, 3 * 3600, 4 * 86400)] == ["30 s", "10 min", "3.0 h", "4.0 days"]
