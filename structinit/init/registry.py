"""Every initializer, by name. Adding one is one file: `init/methods/<name>.py`.

An initializer is a function `apply(model, *, seed, generator, **options)` that sets a timm
VisionTransformer's weights in place, given the options it accepts. `initialize` (init/__init__.py)
calls it inside a forked RNG seeded by the run's seed and under `torch.no_grad()`, after every
module has received PyTorch's defaults, so no weight depends on the caller's RNG; `generator`
is seeded the same way. It may return a dict of facts to record (InitRecord fields: options,
offsets, ...) or None.

The pipeline finds initializer X in `init/methods/X.py` (imported on first use, so that a
cell depends on its own initializer's file and on no other's: methods/__init__.py). A script
or notebook may also register one anywhere, for `initialize` alone:

    # structinit/init/methods/zero_qk.py   then: dvc exp run -S 'grid.baselines=[...,zero_qk]'
    from structinit.init.baselines import trunc_normal
    from structinit.init.registry import register_initializer

    @register_initializer("zero_qk")
    def zero_qk(model, *, seed, generator):
        trunc_normal(model)
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * model.embed_dim].zero_()

How the reports show an initializer (label, colour, the paper's row) is separate:
structinit/reporting/presentation.py. A name there is optional: an unlisted initializer is
shown by its name, so a label edit never touches what trains.
"""
from __future__ import annotations

import importlib
from collections.abc import MutableMapping, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

METHODS_PACKAGE = "structinit.init.methods"
METHODS_DIR = Path(__file__).resolve().parent / "methods"


@dataclass(frozen=True)
class Initializer:
    name: str
    apply: Callable            # apply(model, *, seed, generator, **options) -> dict | None
    options: tuple[str, ...] | Callable   # the keyword options it accepts (or options -> them)
    takes_kernel: bool = False  # cells are named <name><k> (impulse3): the structured init
    check: Callable | None = None   # check(model, **options): ValueError before any weight is set


_REGISTERED: dict[str, Initializer] = {}      # those registered so far (method files load on first use)


class _Registry(MutableMapping):
    """INITIALIZERS: every initializer by name, the method files' included, without the caller
    importing anything first. A lookup (`name in`, `[name]`) loads that method's file alone, so
    that a cell's code is its own initializer's file and no other's (checkpoint.code_fingerprint);
    a listing (iterating, len) loads every method file."""
    def __getitem__(self, name) -> Initializer:
        _load(name)
        return _REGISTERED[name]

    def __contains__(self, name) -> bool:
        _load(name)
        return name in _REGISTERED

    def __iter__(self):
        for name in method_names():
            _load(name)
        return iter(list(_REGISTERED))        # a copy: a caller may unregister while iterating

    def __len__(self) -> int:
        return len(list(iter(self)))

    def __setitem__(self, name, init: Initializer) -> None:
        _REGISTERED[name] = init

    def __delitem__(self, name) -> None:      # a test's or a notebook's cleanup
        del _REGISTERED[name]

    def __repr__(self) -> str:
        return f"INITIALIZERS{sorted(self)}"


INITIALIZERS = _Registry()


def register_initializer(name: str, *, options: tuple[str, ...] | Callable = (), takes_kernel: bool = False,
                         check: Callable | None = None):
    """Decorator: make `apply` available as initialize(model, name) and as a grid initializer."""
    if not name.isidentifier():
        raise ValueError(f"initializer name {name!r}: use letters, digits and underscores "
                         "(it becomes part of cell and stage names)")

    def add(apply: Callable) -> Callable:
        # _REGISTERED, not INITIALIZERS: this runs while a method file is imported, and a lookup
        # in INITIALIZERS would try to load that file again
        if name in _REGISTERED and _REGISTERED[name].apply is not apply:
            raise ValueError(f"initializer {name!r} is registered already ({_REGISTERED[name].apply.__module__})")
        _REGISTERED[name] = Initializer(name, apply, options if callable(options) else tuple(options),
                                        takes_kernel, check)
        return apply
    return add


def method_names() -> list[str]:
    """The initializers that have a file in init/methods/ (what the pipeline can train), sorted."""
    return sorted(p.stem for p in METHODS_DIR.glob("*.py") if p.stem != "__init__")


def available() -> list[str]:
    """Every initializer `get_initializer` can return: the method files' (listed, not loaded),
    and any registered elsewhere in this process."""
    return sorted(set(method_names()) | set(_REGISTERED))


def _load(name) -> None:
    """Import init/methods/<name>.py if `name` has such a file and is not registered yet."""
    if (not isinstance(name, str) or name in _REGISTERED or not name.isidentifier()
            or not (METHODS_DIR / f"{name}.py").exists()):
        return
    module = importlib.import_module(f"{METHODS_PACKAGE}.{name}")
    if name not in _REGISTERED:             # imported before, then unregistered (a test's cleanup)
        module = importlib.reload(module)
    if name not in _REGISTERED:
        raise ValueError(f"{module.__file__} registers no initializer {name!r}: a method file "
                         f"registers the initializer it is named after (@register_initializer({name!r}))")


def get_initializer(name: str) -> Initializer:
    """The initializer `name`: registered already, or loaded from init/methods/<name>.py."""
    _load(name)
    if name not in _REGISTERED:
        raise ValueError(f"unknown init method {name!r}; choose one of {available()}")
    return _REGISTERED[name]


def load_all() -> MutableMapping[str, Initializer]:
    """Every method file's initializer loaded (for listings and checks; the trainer loads one)."""
    for name in method_names():
        _load(name)
    return INITIALIZERS


def allowed_options(init: Initializer, options: dict) -> tuple[str, ...]:
    return init.options(options) if callable(init.options) else init.options


class _Names(Set):
    """A live view of available(): an initializer added later is listed too."""
    def __contains__(self, name) -> bool:
        return name in available()

    def __iter__(self):
        return iter(available())

    def __len__(self) -> int:
        return len(available())

    def __repr__(self) -> str:
        return f"METHODS{available()}"


METHODS = _Names()

