"""benchmarks/gpu_probe.py: the --tiny run (toy sizes, on the CPU) writes every part of the probe
file with numbers in it, and every committed probe file (benchmarks/gpu_probe-<card>-<commit>.md,
one per GPU run; tools/gpu_hours.py's PRICED is the one it prices from) parses
as gpu_hours reads it and names its card, torch and commit."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_probe import SECTIONS
from tools.gpu_hours import (PRICED, RATE_ROW, STACK_ROW, TINY_LABEL, number, probe_files, probe_name, read_probe,
                             table_rows)

REPO = Path(__file__).resolve().parents[1]


def bodies(text: str) -> dict[str, str]:
    """{section title: its text up to the next one}."""
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


def values(body: str) -> dict[str, str]:
    return {row["what"]: row["value"] for row in table_rows(body) if "what" in row}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("probe") / "probe.md"
    # no GPU even where there is one (the tiny run is the CPU's), and PYTHONPATH extended, never
    # replaced: a GPU image may keep the project's packages in a folder named there
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_probe", "--tiny", "--out", str(out)], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=900)   # a hang guard, not a speed gate
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out.read_text()


def test_the_tiny_run_writes_every_part_with_numbers(tiny):
    assert tiny.startswith(f"# GPU probe: {TINY_LABEL}\n")
    parts = bodies(tiny)
    for title in SECTIONS.values():
        body = parts[title]                       # KeyError: a part the file lacks
        # a part that failed or ran out of budget writes one line instead of its table
        assert not re.match(r"\s*(error|skipped|not run yet)", body), f"{title}: {body.strip()[:300]}"
        assert re.search(r"\d", body), title
    counts = table_rows(parts[SECTIONS["a"]])[0]
    assert sum(int(counts[k]) for k in ("passed", "failed", "errors", "skipped")) >= 1
    steps = {row["step"]: row for row in table_rows(parts[SECTIONS["b"]]) if "step" in row}
    assert set(steps) == {"the project's trainer, 1 model", f"{STACK_ROW} 5"}
    assert all(number(row["ms per step, min"]) > 0 for row in steps.values()), steps
    assert number(values(parts[SECTIONS["b"]])["FLOPs per training image, GFLOP"]) > 0
    assert number(values(parts[SECTIONS["c"]])[RATE_ROW]) > 0
    # the digits cell with the step's CUDA graph off: both timed (on the CPU neither captures)
    digits = values(parts[SECTIONS["d"]])
    assert re.fullmatch(r"\d+\.\d\dx", digits["the whole-step graph's gain per epoch (median off / median on)"])


def test_gpu_hours_refuses_a_tiny_file(tiny, tmp_path):
    (tmp_path / "probe.md").write_text(tiny)
    r = subprocess.run([sys.executable, "-m", "tools.gpu_hours", "--probe", str(tmp_path / "probe.md")], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode != 0 and r.stdout == "", r.stdout
    assert f"is a {TINY_LABEL}: run python -m benchmarks.gpu_probe on a GPU" in r.stderr, r.stderr


@pytest.mark.parametrize("path", probe_files(), ids=lambda p: p.name)
def test_each_committed_probe_file_parses_and_names_its_card_torch_and_commit(path):
    """A GPU's own run of the probe, unedited: its title naming the card, torch and the commit it
    ran at (the file's name says card and commit too), a rate, FLOPs and a peak."""
    text = path.read_text()
    assert TINY_LABEL not in text.splitlines()[0]
    probe = read_probe(path)                      # a full run's: a --tiny one's is refused
    assert re.fullmatch(r"[0-9a-f]{7,40}", probe["commit"]), probe
    assert text.startswith(f"# GPU probe: {probe['card']}, torch {probe['torch']}, project at {probe['commit']}\n")
    assert "`python -m benchmarks.gpu_probe" in text.split("\n\n")[1]          # written by the probe itself
    assert path.name == probe_name(probe["card"], probe["commit"])
    assert probe["rate"] > 0 and probe["gflop"] > 0 and probe["peak_gib"] > 0, probe


def test_the_priced_file_is_a_committed_one():
    """tools/gpu_hours.py prices from PRICED, one of the files side by side in benchmarks/ (the
    H200's run at 02d9857 until a later run's file is named there)."""
    assert PRICED in probe_files()
    assert probe_name("NVIDIA H200", "02d9857") == "gpu_probe-h200-02d9857.md"
    assert probe_name("NVIDIA H100 80GB HBM3", "4380d9d") == "gpu_probe-h100-80gb-hbm3-4380d9d.md"
