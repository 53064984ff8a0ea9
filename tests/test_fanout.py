"""Many cells at once (scale/fanout.py): on a running Ray cluster of two 1-CPU worker nodes,
the stale training cells of a tiny grid run concurrently, `dvc commit` records them, the next
`dvc repro` trains nothing, and what it reports equals a serial `dvc repro`'s, byte for byte.

Needs the scale extra (Ray): skips without it, except with STRUCTINIT_REQUIRE_SCALE=1, where
a missing Ray fails.
"""
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from test_pipeline import sh, tiny_repo_copy

if os.environ.get("STRUCTINIT_REQUIRE_SCALE") == "1":
    import ray  # noqa: F401  (the scale extra must be there: an ImportError fails the run)
else:
    pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[scale]'")
from ray.cluster_utils import Cluster

TRAIN_CELLS = ["train_baseline@digits-trunc_normal", "train_impulse@digits-3", "train_impulse@digits-5"]
CELL_DIRS = ["digits-trunc_normal", "digits-impulse3", "digits-impulse5"]     # their output folders
BROKEN_CELL = "study_pseudo_input@digits-UP"                 # the fanned copy's one failing cell
BROKEN_LOG = "logs/fanout/study_pseudo_input_digits-UP.log"
BROKEN_PREFIX = """python -c 'raise SystemExit("a deliberately broken cell")' && """    # exits 1 at once
FANOUT = ("python", "-m", "scale.fanout")


@pytest.fixture(scope="module")
def ray_address():
    """A cluster already running when the fan-out starts (as after `ray start`): a head node
    that runs no task and two worker nodes of one CPU each, so at most two cells at a time."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(2):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    yield cluster.address
    cluster.shutdown()


def stand_in_reference_solves(repo: Path) -> None:
    """The reports need reference_solve, the official solver's 10,000 Adam steps per seed (about
    40 s per seed here): not what the fan-out changes. Both copies get the same stand-in records,
    recorded as that stage's outputs, so neither runs it."""
    for kernel in (3, 5):
        for seed in (0, 1):
            record = repo / f"results/reference/digits-{kernel}/seed{seed}.json"
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps({"target_mass": 0.05 + kernel / 1000, "fit_mse": 0.01 * (seed + 1)}))
    sh(repo, "dvc", "repro", "check_params")            # what every stage depends on
    sh(repo, "dvc", "commit", "-f", "reference_solve@digits-3", "reference_solve@digits-5")


def train_outputs_exist(repo: Path) -> bool:
    return any((repo / f"models/{cell}").exists() or (repo / f"results/train/{cell}").exists()
               for cell in CELL_DIRS)


@pytest.fixture(scope="module")
def serial_started(tmp_path_factory):
    """The same tiny copy, reproduced the plain way, one stage after another: started in the
    background so that it overlaps the fan-out (both are a few processes on a 2-core machine)."""
    repo = tiny_repo_copy(tmp_path_factory.mktemp("serial"))
    stand_in_reference_solves(repo)
    with ThreadPoolExecutor(1) as pool:
        yield repo, pool.submit(sh, repo, "dvc", "repro", "aggregate")


@pytest.fixture(scope="module")
def serial(serial_started):
    repo, repro = serial_started
    repro.result()                                   # raises with the output if it failed
    return repo


@pytest.fixture(scope="module")
def fanned(tmp_path_factory, serial_started, ray_address):
    """A tiny copy whose one study cell has a command that fails: a dry run, the fan-out of the
    training cells and that cell, `dvc repro aggregate`, then a dry run again."""
    repo = tiny_repo_copy(tmp_path_factory.mktemp("fanned"))
    stand_in_reference_solves(repo)
    pipeline = yaml.safe_load((repo / "dvc.yaml").read_text())
    study = pipeline["stages"][BROKEN_CELL.split("@")[0]]
    study["cmd"] = BROKEN_PREFIX + study["cmd"]
    (repo / "dvc.yaml").write_text(yaml.safe_dump(pipeline, sort_keys=False))
    stages = ("--stages", "train_*", "study_pseudo_input@*")
    dry = sh(repo, *FANOUT, "--dry-run", *stages)
    ran_on_dry_run = train_outputs_exist(repo) or (repo / "data/prepared/digits.pt").exists()
    run = sh(repo, *FANOUT, *stages, "--address", ray_address, check=False)
    repro = sh(repo, "dvc", "repro", "aggregate")
    retry = sh(repo, *FANOUT, "--dry-run", *stages)
    return {"repo": repo, "dry": dry, "ran_on_dry_run": ran_on_dry_run, "run": run, "repro": repro,
            "retry": retry}


def log_span(log: Path) -> tuple[float, float]:
    """When a cell ran, from the first and last lines of its fan-out log."""
    text = log.read_text()
    return (float(re.search(r"started ([\d.]+)", text).group(1)),
            float(re.search(r"ended ([\d.]+)", text).group(1)))


def most_at_once(spans) -> int:
    """The largest number of (start, end) spans that overlap at one instant."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running, most = 0, 0
    for _, change in events:                   # at equal times an end (-1) sorts before a start
        running += change
        most = max(most, running)
    return most


def test_dry_run_lists_the_stale_cells_and_runs_nothing(fanned):
    out = fanned["dry"].stdout
    assert "4 stale cell(s) would run" in out
    for cell in [*TRAIN_CELLS, BROKEN_CELL]:
        assert f"  {cell}\n" in out
    assert "--out results/train/digits-impulse5 --model-out models/digits-impulse5" in out   # the command
    assert "First, serially: dvc repro check_params download@digits preoptimize@digits-3 preoptimize@digits-5" in out
    assert not fanned["ran_on_dry_run"]


def test_every_stale_cell_runs_on_the_cluster_concurrently(fanned, ray_address):
    repo, out = fanned["repo"], fanned["run"].stdout
    assert f"Ray at {ray_address}: 4 cell(s)" in out                      # the running cluster, not a new one
    for cell in TRAIN_CELLS:
        assert re.search(rf"\[[1-4]/4\] ok +{re.escape(cell)} ", out), out
    assert out.count("] ok ") == 3
    for cell in CELL_DIRS:
        for seed in (0, 1):
            assert (repo / f"results/train/{cell}/seed{seed}/metrics.json").exists()
            assert (repo / f"models/{cell}/seed{seed}.pt").exists()
    spans = [log_span(repo / f"logs/fanout/{cell.replace('@', '_')}.log") for cell in [*TRAIN_CELLS, BROKEN_CELL]]
    assert most_at_once(spans) == 2, spans                    # two 1-CPU nodes: two cells at a time, never more


def test_dvc_records_the_cells_and_repro_only_aggregates(fanned):
    repo, repro = fanned["repo"], fanned["repro"].stdout
    assert "Data and pipelines are up to date" in sh(repo, "dvc", "status", *TRAIN_CELLS).stdout
    assert "Running stage 'train_" not in repro and "Running stage 'aggregate'" in repro
    for cell in TRAIN_CELLS:
        assert f"Stage '{cell}' didn't change, skipping" in repro
    # the cached outputs are git-ignored, as after `dvc repro`
    assert sorted((repo / "models/.gitignore").read_text().split()) == sorted(f"/{c}" for c in CELL_DIRS)
    again = sh(repo, *FANOUT, "--stages", "train_*")                        # no --address: never needs Ray
    assert "is up to date: nothing to run" in again.stdout and "Ray at" not in again.stdout


def test_reports_models_and_lock_entries_equal_a_serial_repro(fanned, serial):
    repo = fanned["repo"]
    for report in ("main_table.md", "kernel_table.md", "preopt_table.md", "cells.csv", "summary.json"):
        assert (repo / "reports" / report).read_bytes() == (serial / "reports" / report).read_bytes(), report
    for cell in CELL_DIRS:
        for folder in ("models", "results/train"):
            ours = {p.relative_to(repo): p.read_bytes() for p in (repo / folder / cell).rglob("*") if p.is_file()}
            theirs = {p.relative_to(serial): p.read_bytes() for p in (serial / folder / cell).rglob("*")
                      if p.is_file()}
            assert ours.keys() == theirs.keys() and ours == theirs, f"{folder}/{cell}"
    lock, serial_lock = (yaml.safe_load((r / "dvc.lock").read_text())["stages"] for r in (repo, serial))
    for cell in TRAIN_CELLS:                                                  # command, deps, outs, hashes
        assert lock[cell] == serial_lock[cell], cell


def test_a_failed_cell_is_reported_and_the_others_are_committed(fanned):
    repo, run = fanned["repo"], fanned["run"]
    assert run.returncode == 1, run.stdout + run.stderr
    assert re.search(rf"\[[1-4]/4\] FAILED +{BROKEN_CELL} .*log {BROKEN_LOG}  exit 1", run.stdout), run.stdout
    assert f"{BROKEN_CELL}: exit 1; log {BROKEN_LOG}" in run.stderr
    assert "a deliberately broken cell" in (repo / BROKEN_LOG).read_text()        # the cell's stderr
    committed = re.search(r"\$ dvc commit -f (.*)\n", run.stdout).group(1).split()
    assert sorted(committed) == sorted(TRAIN_CELLS)                         # the others, and only them
    status = sh(repo, "dvc", "status", BROKEN_CELL).stdout
    assert f"{BROKEN_CELL}:" in status and "up to date" not in status     # still stale
    retry = fanned["retry"].stdout                                          # running it again retries it alone
    assert "1 stale cell(s) would run" in retry and f"  {BROKEN_CELL}\n" in retry


@pytest.mark.parametrize("args, message", [
    (["--gpus-per-cell", "-1"], "--gpus-per-cell: -1: use 0, a fraction up to 1"),
    (["--gpus-per-cell", "1.5"], "--gpus-per-cell: 1.5: use 0, a fraction up to 1"),
    (["--cpus-per-cell", "lots"], "--cpus-per-cell: 'lots' is not a number"),
    (["--nproc-per-cell", "0"], "--nproc-per-cell: '0': use a whole number of processes, 1 or more"),
    (["--nproc-per-cell", "2", "--gpus-per-cell", "1"], "--gpus-per-cell must be 2 (or 0 for processes on CPU)"),
    (["--cpus-per-cell", "0", "--gpus-per-cell", "0"], "reserves nothing"),
    (["--stages", "train_*", "trian_*"], "--stages 'trian_*' matches no stage; the stages are aggregate,"),
])
def test_bad_values_are_refused_before_any_work(tmp_path, args, message):
    repo = tiny_repo_copy(tmp_path)
    r = sh(repo, *FANOUT, *args, check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert not (repo / "data/prepared").exists() and not (repo / "dvc.lock").exists()


def test_a_cell_runs_its_commands_in_order_as_dvc_would(tmp_path):
    """run_cell by itself (what each Ray task calls): the stage's commands in order up to the
    first failure, with what `dvc repro` tells a stage, into the cell's log."""
    from scale.fanout import Cell, run_cell

    commands = ("echo first $DVC_STAGE in $(pwd) with $STRUCTINIT_NPROC", "exit 3", "echo never")
    cell = Cell("train_x@a-1", commands, str(tmp_path), "logs/fanout/train_x_a-1.log", ())
    result = run_cell(str(tmp_path), cell, {"STRUCTINIT_NPROC": "2"}, 0.0)
    assert (result.address, result.returncode, result.ok, result.error) == ("train_x@a-1", 3, False, None)
    log = (tmp_path / cell.log).read_text()
    assert f"first train_x@a-1 in {tmp_path} with 2\n" in log and "never" not in log
    missing = run_cell(str(tmp_path / "elsewhere"), cell, {}, 0.0)
    assert missing.returncode is None and "is not visible on Ray node" in missing.error
    assert "every node must see it at the same path" in missing.error


class StubRay:
    """What connect() asks of Ray, for a cluster of the given nodes' resources: the GPU-shaped
    choices are tested here on CPU (the run above has no GPUs)."""

    def __init__(self, *nodes: dict):
        self.node_resources = nodes

    def init(self, address=None):
        pass

    def cluster_resources(self) -> dict:
        return {k: sum(n.get(k, 0) for n in self.node_resources) for k in ("CPU", "GPU")}

    def nodes(self) -> list[dict]:
        return [{"Alive": True, "Resources": n} for n in self.node_resources]


@pytest.mark.parametrize("args, gpus", [
    ([], 1),                                         # a cluster with GPUs: one GPU per cell by default
    (["--gpus-per-cell", "0.25"], 0.25),             # small cells share a GPU
    (["--nproc-per-cell", "8"], 8),                  # a DDP cell: one GPU per process, on one node
    (["--nproc-per-cell", "2", "--gpus-per-cell", "0"], 0),    # DDP processes on CPU
])
def test_gpus_each_cell_reserves(args, gpus):
    from scale.fanout import connect, parse_args

    eight_gpu_node = {"CPU": 32, "GPU": 8}
    assert connect(StubRay(eight_gpu_node, eight_gpu_node), parse_args(args)) == gpus
    assert connect(StubRay({"CPU": 4}), parse_args([])) == 0          # no GPU anywhere: none reserved


def test_a_cell_no_node_can_hold_is_refused():
    from scale.fanout import FanoutError, connect, parse_args

    with pytest.raises(FanoutError, match="reserves 1 CPU and 8 GPU, but no Ray node has that much "
                                          r"\(nodes: 16 CPU/4 GPU, 16 CPU/4 GPU\)"):
        connect(StubRay({"CPU": 16, "GPU": 4}, {"CPU": 16, "GPU": 4}), parse_args(["--nproc-per-cell", "8"]))


def test_a_cell_without_a_gpu_sees_none_and_one_with_keeps_rays(tmp_path, monkeypatch):
    from scale.fanout import Cell, run_cell

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")          # as Ray sets it for a task given GPU 3
    cell = Cell("train_x@a-1", ("echo gpus=[$CUDA_VISIBLE_DEVICES]",), str(tmp_path), "logs/x.log", ())
    for gpus, seen in ((0.0, "gpus=[]"), (1.0, "gpus=[3]")):
        assert run_cell(str(tmp_path), cell, {}, gpus).ok
        assert f"{seen}\n" in (tmp_path / cell.log).read_text()
