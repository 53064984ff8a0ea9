"""The project's import structure: packages, modules and lines, who imports whom, and cycles.

    python -m tools.import_graph                     # this checkout
    python -m tools.import_graph --root /path/to/a/checkout
    python -m tools.import_graph --packages structinit stages tools benchmarks scale

Reads every .py file of the packages with `ast` (nothing is imported or run). An edge A -> B
is an `import B` / `from B import x` anywhere in A, function-level imports included (they
run when the function does), `if TYPE_CHECKING:` blocks excluded (they never run); `from
pkg import name` counts pkg.name when that is a module, else pkg. Only the project's own
modules count. Prints, per package (a top-level one and each of its subpackages), the
modules and the lines (every line of every file); then which top-level package imports
which; then every import cycle between modules (each strongly connected component of the
graph, with one cycle through it spelled out) and between top-level packages. Exit status 1
when a module cycle exists.
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGES = ("structinit", "stages", "scale", "tools", "benchmarks")
SKIP = {"__pycache__", ".venv", ".git"}


def module_files(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """{dotted module name: file} for every .py under each package folder (a package's
    __init__.py is the package's own name)."""
    out = {}
    for top in packages:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if SKIP & set(rel.parts):
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _drop_type_checking(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")):
            node.body = []


def imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules that module `name` (file `path`) imports."""
    tree = ast.parse(path.read_text(), str(path))
    _drop_type_checking(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def known(dotted: str) -> str | None:          # the longest prefix that is a project module
        parts = dotted.split(".")
        for i in range(len(parts), 0, -1):
            if ".".join(parts[:i]) in modules:
                return ".".join(parts[:i])
        return None

    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {m for a in node.names if (m := known(a.name))}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                target = f"{base}.{alias.name}"
                m = target if target in modules else known(base)
                if m:
                    out.add(m)
    out.discard(name)
    return out


def graph(root: Path, packages=PACKAGES) -> tuple[dict[str, Path], dict[str, set[str]]]:
    modules = module_files(root, packages)
    return modules, {name: imports(name, path, modules) for name, path in modules.items()}


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one member (or a self-loop)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == node:
                            break
                    if len(component) > 1 or node in edges.get(node, ()):
                        out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def one_cycle(component: list[str], edges: dict[str, set[str]]) -> list[str]:
    """A cycle through the component's first member, as a path that returns to it."""
    start, members = component[0], set(component)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for w in sorted(edges.get(path[-1], ())):
            if w == start:
                return path + [start]
            if w in members and w not in seen:
                seen.add(w)
                paths.append(path + [w])
    return [start]


def package_of(module: str, depth: int) -> str:
    return ".".join(module.split(".")[:depth])


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def report(root: Path, packages=PACKAGES) -> tuple[str, bool]:
    """The printout, and whether a module cycle exists."""
    modules, edges = graph(root, packages)
    out = [f"Import structure of {root} (packages: {', '.join(packages)}; ast, function-level imports "
           "included, TYPE_CHECKING excluded)", "", f"{'package':<28} {'modules':>7} {'lines':>7}"]
    total_m = total_l = 0
    for top in packages:
        mine = {m: p for m, p in modules.items() if package_of(m, 1) == top}
        if not mine:
            out.append(f"{top:<28} {'-':>7} {'-':>7}")
            continue
        count, size = len(mine), sum(lines(p) for p in mine.values())
        total_m, total_l = total_m + count, total_l + size
        out.append(f"{top:<28} {count:>7} {size:>7}")
        for sub in sorted(m for m, p in mine.items() if m.count(".") == 1 and p.name == "__init__.py"):
            inner = [p for m, p in mine.items() if m == sub or m.startswith(sub + ".")]
            out.append(f"  {sub:<26} {len(inner):>7} {sum(lines(p) for p in inner):>7}")
    out.append(f"{'total':<28} {total_m:>7} {total_l:>7}")

    tops = defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            if package_of(a, 1) != package_of(b, 1):
                tops[package_of(a, 1)].add(package_of(b, 1))
    out += ["", "Top-level packages import:"]
    out += [f"  {top} -> {', '.join(sorted(tops[top])) or '(none)'}" for top in packages
            if any(package_of(m, 1) == top for m in modules)]

    cycles = strongly_connected(edges)
    out += ["", f"Module import cycles: {len(cycles)}"]
    for component in cycles:
        out.append(f"  {len(component)} modules: {', '.join(component)}")
        out.append(f"    e.g. {' -> '.join(one_cycle(component, edges))}")
    package_cycles = strongly_connected({k: set(v) for k, v in tops.items()})
    out += [f"Top-level package cycles: {len(package_cycles)}"]
    for component in package_cycles:
        out.append(f"  {', '.join(component)}: e.g. {' -> '.join(one_cycle(component, tops))}")
        crossing = defaultdict(list)
        for a, targets in sorted(edges.items()):
            for b in sorted(targets):
                pa, pb = package_of(a, 1), package_of(b, 1)
                if pa != pb and pa in component and pb in component:
                    crossing[pa, pb].append(f"{a} -> {b}")
        for (pa, pb), found in sorted(crossing.items()):
            out.append(f"    {pa} -> {pb}: {len(found)} import(s), e.g. {'; '.join(found[:2])}")
    return "\n".join(out) + "\n", bool(cycles)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1], help="a checkout (default: this)")
    ap.add_argument("--packages", nargs="+", default=list(PACKAGES), help="top-level package folders to read")
    a = ap.parse_args(argv)
    text, cyclic = report(a.root.resolve(), tuple(a.packages))
    print(text, end="")
    return 1 if cyclic else 0


if __name__ == "__main__":
    sys.exit(main())
