"""The import structure (tools/import_graph.py): no module imports itself through others, a tool
never imports a benchmark (a benchmark may use a tool: tools/scratch.py, tools/probe_file.py),
and the library imports none of the entry points around it (stages, tools, benchmarks, scale)."""
from pathlib import Path

from tools import import_graph

REPO = Path(__file__).resolve().parents[1]


def test_no_import_cycle_between_the_projects_modules():
    _, edges = import_graph.graph(REPO)
    cycles = import_graph.strongly_connected(edges)
    assert not cycles, [" -> ".join(import_graph.one_cycle(c, edges)) for c in cycles]


def crossing(source: str, targets: tuple[str, ...]) -> list[str]:
    _, edges = import_graph.graph(REPO)
    return [f"{a} -> {b}" for a, imported in sorted(edges.items()) for b in sorted(imported)
            if a.split(".")[0] == source and b.split(".")[0] in targets]


def test_tools_never_import_benchmarks():
    assert crossing("tools", ("benchmarks",)) == []


def test_the_library_imports_no_entry_point():
    assert crossing("structinit", ("stages", "tools", "benchmarks", "scale")) == []


def test_a_cycle_is_found_and_spelled_out(tmp_path):
    """The circle this replaced: benchmarks.gpu_hours read the probe file with gpu_probe's
    reader, and gpu_probe counted FLOPs with gpu_hours' counter (inside a function)."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks/__init__.py").write_text("")
    (tmp_path / "benchmarks/gpu_hours.py").write_text("from benchmarks.gpu_probe import read_probe\n")
    (tmp_path / "benchmarks/gpu_probe.py").write_text(
        "def part_step():\n    from benchmarks.gpu_hours import count_train_flops\n")
    (tmp_path / "benchmarks/other.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from benchmarks import gpu_hours\n"
        "from . import gpu_probe\n")
    _, edges = import_graph.graph(tmp_path, ("benchmarks",))
    assert edges["benchmarks.other"] == {"benchmarks.gpu_probe"}          # TYPE_CHECKING imports never run
    assert import_graph.strongly_connected(edges) == [["benchmarks.gpu_hours", "benchmarks.gpu_probe"]]
    text, cyclic = import_graph.report(tmp_path, ("benchmarks",))
    assert cyclic and "benchmarks.gpu_hours -> benchmarks.gpu_probe -> benchmarks.gpu_hours" in text
    assert "benchmarks                         4" in text                 # modules per package
