"""The import structure, read with `ast` (nothing imported or run): no module imports itself
through others, a tool never imports a benchmark (a benchmark may use a tool), and the library
imports none of the entry points around it (stages, tools, benchmarks, scale), the data code
imports no training code, and no module imports another's private name."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("structinit", "stages", "scale", "tools", "benchmarks")


def graph(root: Path = REPO, packages=PACKAGES) -> dict[str, set[str]]:
    """{module: the project's modules it imports}, function-level imports included (they run when
    the function does), `if TYPE_CHECKING:` blocks excluded (they never run); `from pkg import
    name` counts pkg.name when that is a module, else pkg."""
    files = {".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
             for pkg in packages for p in (root / pkg).rglob("*.py") if "__pycache__" not in p.parts}
    edges = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):               # TYPE_CHECKING blocks emptied before the imports are read
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        edges[name] = {m for m in found if m in files and m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every module that reaches itself, grouped by the set it cycles through (sorted)."""
    def reach(start):
        seen, todo = set(), list(edges[start])
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(edges.get(m, ()))
        return seen
    reached = {m: reach(m) for m in edges}
    groups = {frozenset(n for n in reached[m] if m in reached[n]) for m in edges if m in reached[m]}
    return sorted(sorted(g) for g in groups)


def crossing(source: str, targets: tuple[str, ...]) -> list[str]:
    return [f"{a} -> {b}" for a, imported in sorted(graph().items()) for b in sorted(imported)
            if a.startswith(source) and b.split(".")[0] in targets]


def test_no_import_cycle_between_the_projects_modules():
    assert cycles(graph()) == []


def test_tools_never_import_benchmarks():
    assert crossing("tools", ("benchmarks",)) == []


def test_the_library_imports_no_entry_point():
    assert crossing("structinit", ("stages", "tools", "benchmarks", "scale")) == []


def test_the_data_code_imports_no_training_code():
    assert [e for e in crossing("structinit.data", ("structinit",)) if "structinit.training" in e] == []


def test_reports_import_no_trainer_and_no_evidence_code():
    """A report reads what training and the evidence stages wrote (structinit.records reads the
    evidence's records); the recipe (training.config, torch-free) is not a trainer."""
    edges = crossing("structinit.reporting", ("structinit",))
    assert [e for e in edges if "structinit.evidence" in e
            or ("structinit.training" in e and not e.endswith("structinit.training.config"))] == []


def test_a_stage_imports_no_tool():
    assert crossing("stages", ("tools",)) == []


def test_no_private_name_is_imported_across_modules():
    private = [f"{path}: from {node.module} import {a.name}"
               for pkg in PACKAGES for path in sorted((REPO / pkg).rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PACKAGES
               for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert private == []


def test_a_cycle_is_found(tmp_path):
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
    edges = graph(tmp_path, ("benchmarks",))
    assert edges["benchmarks.other"] == {"benchmarks.gpu_probe"}          # TYPE_CHECKING imports never run
    assert cycles(edges) == [["benchmarks.gpu_hours", "benchmarks.gpu_probe"]]
