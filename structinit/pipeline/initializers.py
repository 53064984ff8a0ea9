"""What params.yaml's schema needs of each initializer, read from its file without importing it.

    method_names()          the initializers that have a file in init/methods/ (registry.method_names)
    declared("mimetic")     Declared(name, takes_kernel, options): its @register_initializer(...)
                            arguments, read from the file's syntax tree; None when they are not
                            literals there (the schema then imports the file, as the registry does)

The check_params stage runs before every other stage and should take a second, not the four
that importing a method file costs (torch, and timm through init/__init__.py): the names, the
`takes_kernel` flag and a literal `options=(...)` tuple are what `register_initializer`
receives, written in the file; nothing has to run to know them. tests/test_params.py checks
that every method file reads here as the registry loads it.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# The initializers this repository ships (the paper's, and the confound arm). The studies'
# stages depend on exactly these files (a study's list mixes impulse<k> with names, which
# dvc.yaml's templates cannot map to one file each), so check_params keeps a study to them.
SHIPPED = ("impulse", "kaiming_uniform", "mimetic", "mimetic_qk", "trunc_normal")
METHODS_DIR = Path(__file__).resolve().parents[1] / "init" / "methods"


@dataclass(frozen=True)
class Declared:
    name: str
    takes_kernel: bool
    options: tuple[str, ...] | None   # None: computed by a function in the file (options=<callable>)


def method_names() -> list[str]:
    """The initializers that have a file in init/methods/, sorted (as registry.method_names)."""
    return sorted(p.stem for p in METHODS_DIR.glob("*.py") if p.stem != "__init__")


def declared(name: str) -> Declared | None:
    """`name`'s registration as written in init/methods/<name>.py: the one
    `@register_initializer(name, ...)` decorator whose arguments are literals (options may name
    a function: options=None). None when the file has no such decorator, or more than one, or
    arguments that only running the file would tell."""
    path = METHODS_DIR / f"{name}.py"
    if not name.isidentifier() or not path.exists():
        return None
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and _called(deco.func) == "register_initializer":
                found.append(_read(deco))
    if len(found) != 1 or found[0] is None or found[0].name != name:
        return None
    return found[0]


def _called(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _read(call: ast.Call) -> Declared | None:
    if len(call.args) != 1 or not isinstance(call.args[0], ast.Constant) or not isinstance(call.args[0].value, str):
        return None
    takes_kernel, options = False, ()
    for kw in call.keywords:
        if kw.arg == "takes_kernel":
            if not isinstance(kw.value, ast.Constant) or not isinstance(kw.value.value, bool):
                return None
            takes_kernel = kw.value.value
        elif kw.arg == "options":
            if isinstance(kw.value, (ast.Tuple, ast.List)):
                if not all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in kw.value.elts):
                    return None
                options = tuple(e.value for e in kw.value.elts)
            elif isinstance(kw.value, ast.Name):
                options = None                     # a function of the options given (impulse's)
            else:
                return None
        else:                                      # check=..., or anything else: not needed here,
            continue                               # but a ** or unknown keyword is no literal
    if any(kw.arg is None for kw in call.keywords):
        return None
    return Declared(call.args[0].value, takes_kernel, options)
