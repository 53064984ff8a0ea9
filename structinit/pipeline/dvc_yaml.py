"""dvc.yaml is generated: dvc.template.yaml (every stage as DVC reads it: matrix, cmd, params,
outs, the data and per-cell dependencies) with each stage's code dependencies filled in from
the imports of the script its command runs.

    python -m structinit.pipeline.dvc_yaml            # is dvc.yaml the template's? (exit 1: stale)
    python -m structinit.pipeline.dvc_yaml --write    # regenerate dvc.yaml

In the template, a deps entry `- CODE` stands for the import closure of the stage's script
(`python -m stages.<script>` in its cmd): every project module it imports, at any depth,
function-level imports included, with the __init__.py of each package on the way. What no
import statement shows stays written in the template: an initializer's own file
(`structinit/init/methods/${item.init}.py`: the registry loads it by name) and data. So an
edit's reach is the import graph's, and the template holds what a reader needs to read.
tests/test_dvc_deps.py fails when dvc.yaml is not this module's output, and when a stage's
deps miss a module its script (or its initializer's file) imports.
"""
from __future__ import annotations

import argparse
import ast
import functools
import re
import sys
from pathlib import Path

import structinit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("stages", "structinit", "benchmarks", "tools")
TEMPLATE, TARGET = "dvc.template.yaml", "dvc.yaml"
CODE = re.compile(r"^(?P<indent> +)- CODE\b.*$", re.M)
GPU_ANALYSES = re.compile(r"^(?P<indent> +)- GPU_ANALYSES\b.*\n", re.M)
SCRIPT = re.compile(r"python -m (stages\.\w+)")
STAGE = re.compile(r"^  (?=[a-z_]+:)", re.M)          # a stage's first line, under `stages:`
HEADER = ("# GENERATED from dvc.template.yaml by `python -m structinit.pipeline.dvc_yaml --write`:\n"
          "# edit the template (each `- CODE` there is the stage script's import closure), not this file.\n")


# ---- the import closure of a module ---------------------------------------------------------

def module_file(name: str) -> Path | None:
    """A project module's file (package: its __init__.py); None outside the project."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = REPO / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


@functools.cache
def lazy_exports(package: str) -> dict[str, str]:
    """A project package's PEP 562 exports, {name: defining module}: the dict literal
    `LAZY_EXPORTS` of its __init__.py (structinit, structinit.models), read without importing."""
    path = module_file(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "LAZY_EXPORTS":
            return ast.literal_eval(node.value)
    return {}


def imported_modules(path: Path, name: str) -> set[str]:
    """Every module an `import` anywhere in the file names (function-level imports included:
    they run when the stage runs; `if TYPE_CHECKING:` blocks excluded: they never run),
    resolved to project module names, and every module that a package's lazy loader imports
    for a name imported from it (`from structinit.models import create_vit`) or, for the
    structinit package, an attribute of it (`si.get_spec`, `structinit.reporting.tables.x`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    out, package_names = set(), set()       # package_names: local names bound to structinit
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
            package_names |= {a.asname or "structinit" for a in node.names
                              if a.name == "structinit" or (a.name.startswith("structinit.") and not a.asname)}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            out.add(base)
            for alias in node.names:
                if module_file(f"{base}.{alias.name}"):                # `from pkg import module`
                    out.add(f"{base}.{alias.name}")
                elif alias.name in (lazy := lazy_exports(base)):        # a lazy export
                    out.add(lazy[alias.name])
    for node in ast.walk(tree):             # structinit.__getattr__ imports on attribute access
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in package_names:
            if node.attr in structinit.LAZY_EXPORTS:
                out.add(structinit.LAZY_EXPORTS[node.attr])
            elif module_file(f"structinit.{node.attr}"):
                out.add(f"structinit.{node.attr}")
    return out


def import_closure(module: str) -> set[str]:
    """The files (repository paths) of `module` and of every project module it imports,
    transitively, with the __init__.py of every package on the way (importing a.b runs
    a/__init__.py first)."""
    seen, todo, files = set(), [module], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]    # parent packages
        path = module_file(name)
        if path is None:
            continue
        files.add(path.relative_to(REPO).as_posix())
        todo += [m for m in imported_modules(path, name) if module_file(m)]
    return files


# ---- the template, filled -------------------------------------------------------------------

def render(template: str) -> str:
    """dvc.yaml's text: the template with each stage's `- CODE` line replaced by one deps line
    per file of its script's import closure, sorted, at the same indentation."""
    blocks = STAGE.split(template)
    out = []
    for block in blocks:
        marker = CODE.search(block)
        if marker:
            script = SCRIPT.search(block)
            if not script:
                first = block.split(":", 1)[0].strip()
                raise ValueError(f"{TEMPLATE}: stage {first!r} has `- CODE` but no `python -m stages.<script>`")
            lines = "".join(f"{marker['indent']}- {f}\n" for f in sorted(import_closure(script[1])))
            block = block[:marker.start()] + lines.rstrip("\n") + block[marker.end():]
        out.append(block)
    return GPU_ANALYSES.sub(gpu_analyses, HEADER + "  ".join(out))


def gpu_analyses(marker: re.Match) -> str:
    """`- GPU_ANALYSES`: one deps line per GPU dataset's committed analysis (analyze_gpu's
    results/analysis_gpu/<dataset>.pt, written on the GPU machine, which rewrites dvc.yaml
    after), none before any: a dependency DVC cannot find fails the stage."""
    files = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "results/analysis_gpu").glob("*.pt"))
    return "".join(f"{marker['indent']}- {f}\n" for f in files)


# The GPU datasets' stages (grid.gpu_datasets) are frozen in dvc.yaml: a CPU never trains them.
# A GPU's run unfreezes them for itself (tools/fashion_mnist.py) and writes the frozen file back.
GPU_FROZEN = "frozen: true         # GPU"


def unfrozen_gpu(text: str) -> str:
    """dvc.yaml's text with the GPU datasets' stages unfrozen."""
    if GPU_FROZEN not in text:
        raise ValueError(f"{TEMPLATE} has no `{GPU_FROZEN}` line: nothing to unfreeze")
    return text.replace(GPU_FROZEN, "frozen: false        # GPU: unfrozen for a GPU's run")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="write dvc.yaml (else: say whether it is stale)")
    ap.add_argument("--unfreeze-gpu", action="store_true",
                    help="with --write: the GPU datasets' stages unfrozen, for a GPU's run of them only")
    a = ap.parse_args(argv)
    if a.unfreeze_gpu and not a.write:
        ap.error("--unfreeze-gpu goes with --write")
    text = render((REPO / TEMPLATE).read_text())
    text = unfrozen_gpu(text) if a.unfreeze_gpu else text
    if a.write:
        (REPO / TARGET).write_text(text)
        print(f"{TARGET} written from {TEMPLATE}")
        return 0
    if (REPO / TARGET).read_text() != text:
        print(f"{TARGET} is stale: run python -m structinit.pipeline.dvc_yaml --write", file=sys.stderr)
        return 1
    print(f"{TARGET} is {TEMPLATE}'s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
