"""benchmarks/gpu_probe.py: the --tiny run (toy sizes, on the CPU) writes every part of the probe
file with numbers in it, and the committed benchmarks/gpu_probe.md (the H100 figures
benchmarks/gpu_hours.py prices the grid from) parses as gpu_hours reads it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu_probe import (COMPILED_ROW, EAGER_ROW, NOT_MEASURED, RATE_ROW, SECTIONS, STACK_ROW, TINY_LABEL,
                                  TRAINER_ROW, ProbeFileError, number, parse_tables, read_probe)

REPO = Path(__file__).resolve().parents[1]


def bodies(text: str) -> dict[str, str]:
    """{section title: its text up to the next one}."""
    parts = re.split(r"^(## .*)$", text, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2])}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("probe") / "probe.md"
    # no GPU even where there is one (the tiny run is the CPU's), and PYTHONPATH extended, never
    # replaced: a GPU image may keep the project's packages in a folder named there
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu_probe", "--tiny", "--out", str(out)], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out.read_text()


def test_the_tiny_run_writes_every_part_with_numbers(tiny):
    assert tiny.startswith(f"# GPU probe: {TINY_LABEL}\n")
    parts = bodies(tiny)
    for title in SECTIONS.values():
        body = parts[title]                       # KeyError: a part the file lacks
        # a part that failed or ran out of budget writes one line instead of its table
        assert not re.match(r"\s*(error|skipped|not run yet)", body), f"{title}: {body.strip()[:300]}"
        assert "| error:" not in body and "| skipped:" not in body, body
        assert re.search(r"\d", body), title
    tables = parse_tables(tiny)
    counts = tables[SECTIONS["a"]][0]
    assert sum(int(counts[k]) for k in ("passed", "failed", "errors", "skipped")) >= 1
    steps = {row["step"]: row for row in tables[SECTIONS["b"]] if "step" in row}
    assert set(steps) == {EAGER_ROW, COMPILED_ROW, TRAINER_ROW, f"{STACK_ROW} 5"}
    for row in steps.values():
        assert number(row["ms per step, min"]) > 0 and number(row["TFLOP/s (at the min)"]) > 0, row
    e2e = {row["what"]: row["value"] for row in tables[SECTIONS["c"]]}
    assert number(e2e[RATE_ROW]) > 0
    assert "backend gloo, device cpu" in parts[SECTIONS["e"]]
    assert "| the same bytes | yes |" in parts[SECTIONS["f"]]


def test_gpu_hours_refuses_a_tiny_file(tiny, tmp_path):
    path = tmp_path / "probe.md"
    path.write_text(tiny)
    with pytest.raises(ProbeFileError, match="tiny"):
        read_probe(path)


def test_the_committed_probe_file_parses_as_gpu_hours_reads_it():
    """Whichever run it holds (the H100 figures of 4380d9d until a probe run on a GPU replaces
    them): the probe's layout, a card, a commit, a rate, FLOPs and a peak."""
    text = (REPO / "benchmarks/gpu_probe.md").read_text()
    assert text.startswith("# GPU probe: ") and TINY_LABEL not in text.splitlines()[0]
    assert all(title in bodies(text) for title in SECTIONS.values())
    probe = read_probe(REPO / "benchmarks/gpu_probe.md")
    assert probe["card"] and re.fullmatch(r"[0-9a-f]{7,40}", probe["commit"]), probe
    assert probe["rate"] > 0 and probe["gflop"] > 0 and probe["peak_gib"] > 0, probe
    if probe["mode"].startswith("before"):        # the first GPU run's figures, as its notes give them
        assert text.startswith("# GPU probe: NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, project at 4380d9d — "
                               "measured by an equivalent script, not this command\n")
        assert (probe["card"], probe["commit"], probe["torch"]) == ("NVIDIA H100 80GB HBM3", "4380d9d", "2.11.0+cu130")
        assert (probe["rate"], probe["gflop"], probe["peak_gib"], probe["estimate_gib"]) == (5032, 9.97, 13.22, 11.1)
        assert probe["stack_peak_gib"] is None        # not measured then


def test_a_probe_file_without_the_rate_is_refused(tmp_path):
    text = (REPO / "benchmarks/gpu_probe.md").read_text()
    path = tmp_path / "probe.md"
    path.write_text(re.sub(rf"\| {re.escape(RATE_ROW)} \| [^|]+\|", f"| {RATE_ROW} | {NOT_MEASURED} |", text))
    with pytest.raises(ProbeFileError, match="has no ViT-T/2 rate"):
        read_probe(path)
    with pytest.raises(ProbeFileError, match="no such probe file"):
        read_probe(tmp_path / "missing.md")
