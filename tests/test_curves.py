"""Training curves (structinit/reporting/curves.py, structinit/reporting/figures/curves.py, stages/curves.py) from
fake dvclive folders: the long table's rows and statistics, a missing run named, and PNG
and CSV bytes that depend only on the data."""
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from structinit.pipeline import cells
from structinit.reporting import curves
from structinit.errors import StructinitError
from structinit.reporting.figures.curves import write_curves_figures

REPO = Path(__file__).resolve().parents[1]
EPOCHS, EVAL_EVERY = 4, 2                    # test rows at epochs 2 and 4 (steps 1 and 3)


def fake_run(results: Path, dataset: str, init: str, seed: int, offset: float = 0.0) -> None:
    """What dvclive writes for one seed: train every epoch, test every EVAL_EVERY epochs;
    accuracy 0.1 * epoch + offset + seed / 100."""
    metrics = cells.seed_dir(results / cells.main_cell(dataset, init), seed) / "plots" / "metrics"
    offset += seed / 100
    for split, steps in (("train", range(EPOCHS)), ("test", range(EVAL_EVERY - 1, EPOCHS, EVAL_EVERY))):
        (metrics / split).mkdir(parents=True)
        (metrics / split / "acc.tsv").write_text(
            "step\tacc\n" + "".join(f"{s}\t{0.1 * (s + 1) + offset}\n" for s in steps))
        (metrics / split / "loss.tsv").write_text(
            "step\tloss\n" + "".join(f"{s}\t{2.0 / (s + 1)}\n" for s in steps))


RUNS = [("toy", init, seed) for init in ("a_init", "b_init") for seed in (0, 1, 2)]


@pytest.fixture
def results(tmp_path):
    for run in RUNS:
        fake_run(tmp_path / "results", *run, offset=0.1 if run[1] == "b_init" else 0.0)
    return tmp_path / "results"


def test_long_table_has_a_row_per_epoch_and_test_only_where_evaluated(results):
    t = curves.long_table(results, RUNS)
    assert list(t.columns) == list(curves.COLUMNS)
    assert len(t) == len(RUNS) * EPOCHS
    assert list(t.epoch[:EPOCHS]) == [1, 2, 3, 4]                  # step 0 = epoch 1
    first = t[(t.init == "a_init") & (t.seed == 1)].set_index("epoch")
    assert first.train_acc.tolist() == pytest.approx([11, 21, 31, 41])     # in %
    assert first.test_acc.isna().tolist() == [True, False, True, False]
    assert first.test_acc[2] == pytest.approx(21) and first.test_loss[4] == pytest.approx(0.5)


def test_mean_band_is_mean_and_sample_std_over_seeds(results):
    t = curves.long_table(results, RUNS)
    band = curves.mean_band(t, "test_acc").set_index(["init", "epoch"])
    assert list(band.index) == [("a_init", 2), ("a_init", 4), ("b_init", 2), ("b_init", 4)]
    # seeds 0, 1, 2 add 0, 1, 2 points: mean +1, sample std 1
    assert band.loc[("b_init", 4), "mean"] == pytest.approx(40 + 10 + 1)
    assert band.loc[("b_init", 4), "std"] == pytest.approx(1.0)
    assert (band.n == 3).all()
    with pytest.raises(ValueError, match="'acc'"):
        curves.mean_band(t, "acc")


def test_a_missing_run_fails_naming_it(results):
    (results / "toy-b_init/seed2/plots/metrics/test/loss.tsv").unlink()
    with pytest.raises(StructinitError, match=r"1 run\(s\).*'toy-b_init-2'"):
        curves.long_table(results, RUNS)
    with pytest.raises(StructinitError, match=r"'toy-c_init-0'"):
        curves.long_table(results, [("toy", "c_init", 0)])


def test_csv_and_png_are_the_same_bytes_on_every_write(results, tmp_path):
    t = curves.long_table(results, RUNS)
    curves.write_csv(t, tmp_path / "a.csv")
    curves.write_csv(curves.long_table(results, RUNS), tmp_path / "b.csv")
    text = (tmp_path / "a.csv").read_text()
    assert text == (tmp_path / "b.csv").read_text()
    assert text.split("\n")[1] == "toy,a_init,0,1,10.0000,2.0000,,"         # fixed digits, empty test
    back = pd.read_csv(tmp_path / "a.csv")
    assert back.test_acc.notna().sum() == len(RUNS) * EPOCHS // EVAL_EVERY

    (tmp_path / "figs").mkdir()
    (tmp_path / "figs/gone.png").write_bytes(b"stale")               # a dataset no longer in the grid
    first = write_curves_figures(t, tmp_path / "figs")
    assert first == [tmp_path / "figs/toy.png"] and not (tmp_path / "figs/gone.png").exists()
    png = first[0].read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    write_curves_figures(t, tmp_path / "figs")
    assert first[0].read_bytes() == png


def test_stage_builds_the_grid_cells_from_params(results, tmp_path):
    """stages.curves: grid.datasets × (baselines + impulse<k>) × seeds of params.yaml, each
    required; a missing one fails the stage in one line naming it."""
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    grid = params["grid"]
    inits = cells.main_inits(params)
    for d in grid["datasets"]:
        for i in inits:
            for s in grid["seeds"][1:]:                 # the first seed left out on purpose
                fake_run(tmp_path / "grid", d, i, s)
    r = subprocess.run([sys.executable, "-m", "stages.curves", "--results", str(tmp_path / "grid"),
                        "--csv", str(tmp_path / "c.csv"), "--figures", str(tmp_path / "f")],
                       cwd=REPO, capture_output=True, text=True, check=False)
    first = cells.run_name(cells.main_cell(grid["datasets"][0], inits[0]), grid["seeds"][0])
    assert r.returncode != 0 and f"'{first}'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "c.csv").exists()

