"""Every initializer, by name: the one place the trainer reads. Adding one is one entry here.

An initializer is a function `apply(model, *, seed, generator, **options)` that sets a timm
VisionTransformer's weights in place, given the options it accepts. `initialize` (init/__init__.py)
calls it inside a forked RNG seeded by the run's seed, after every module has received
PyTorch's defaults, so no weight depends on the caller's RNG; `generator` is seeded the same way.
It may return a dict of facts to record (InitRecord fields: options, offsets, ...) or None.

How the reports show an initializer (label, colour, the paper's row) is separate:
structinit/reporting/presentation.py. A name there is optional: an unlisted initializer is
shown by its name, so a label edit never touches what trains.

    from structinit.init.registry import register_initializer

    @register_initializer("zero_qk")              # then: dvc exp run -S 'grid.baselines=[...,zero_qk]'
    def zero_qk(model, *, seed, generator):
        trunc_normal(model)
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * model.embed_dim].zero_()
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from structinit.config import IMPULSE_SOLVE_OPTIONS
from structinit.init import solvers
from structinit.init.baselines import trunc_normal
from structinit.init.impulse import apply_impulse_solution, check_impulse_options, solve_impulse_qk
from structinit.init.mimetic import mimetic
from structinit.models.vit import patch_grid_of


@dataclass(frozen=True)
class Initializer:
    name: str
    apply: Callable            # apply(model, *, seed, generator, **options) -> dict | None
    options: tuple[str, ...] | Callable   # the keyword options it accepts (or options -> them)
    takes_kernel: bool = False  # cells are named <name><k> (impulse3): the structured init
    check: Callable | None = None   # check(model, **options): ValueError before any weight is set


INITIALIZERS: dict[str, Initializer] = {}


def register_initializer(name: str, *, options: tuple[str, ...] | Callable = (), takes_kernel: bool = False,
                         check: Callable | None = None):
    """Decorator: make `apply` available as initialize(model, name) and as a grid initializer."""
    if not name.isidentifier():
        raise ValueError(f"initializer name {name!r}: use letters, digits and underscores "
                         "(it becomes part of cell and stage names)")

    def add(apply: Callable) -> Callable:
        if name in INITIALIZERS and INITIALIZERS[name].apply is not apply:
            raise ValueError(f"initializer {name!r} is registered already ({INITIALIZERS[name].apply.__module__})")
        INITIALIZERS[name] = Initializer(name, apply, options if callable(options) else tuple(options),
                                         takes_kernel, check)
        return apply
    return add


def get_initializer(name: str) -> Initializer:
    if name not in INITIALIZERS:
        raise ValueError(f"unknown init method {name!r}; choose one of {tuple(INITIALIZERS)}")
    return INITIALIZERS[name]


def allowed_options(init: Initializer, options: dict) -> tuple[str, ...]:
    return init.options(options) if callable(init.options) else init.options


# ---- the paper's initializers ---------------------------------------------------------------

@register_initializer("trunc_normal")
def _trunc_normal(model, *, seed, generator):
    """timm's default (baselines.py)."""
    trunc_normal(model)


@register_initializer("kaiming_uniform")
def _kaiming_uniform(model, *, seed, generator):
    """PyTorch's module defaults: what every module already holds."""


@register_initializer("mimetic", options=("alpha", "beta", "alpha_v", "beta_v"))
def _mimetic(model, *, seed, generator, **options):
    """Trockman & Kolter 2023 (mimetic.py), on top of timm's default."""
    trunc_normal(model)
    mimetic(model, generator, **options)


@register_initializer("mimetic_qk", options=("alpha", "beta"))
def _mimetic_qk(model, *, seed, generator, **options):
    """Beyond the paper: Mimetic's Q/K alone, V/proj left at timm's default (the confound arm:
    the structured init touches only Q/K). Same Q/K as "mimetic" at the same seed."""
    trunc_normal(model)
    mimetic(model, generator, value_proj=False, **options)


def _impulse_options(options: dict) -> tuple[str, ...]:
    """kernel, the solve's options (config.IMPULSE_SOLVE_OPTIONS), a ready `solution`, and the
    chosen solver's own keyword options (solvers.py)."""
    solver = options.get("solver", "closed_form")
    fn = solvers.SOLVERS.get(solver)
    if fn is None:
        raise ValueError(f"unknown solver {solver!r}; choose one of {tuple(solvers.SOLVERS)}")
    return ("kernel", *IMPULSE_SOLVE_OPTIONS, "solution",
            *(p.name for p in inspect.signature(fn).parameters.values()
              if p.kind is p.KEYWORD_ONLY and p.name not in ("head_dim", "scale", "generator")))


def _check_impulse(model, *, solution=None, **options) -> None:
    if solution is None:      # a bad kernel / pseudo-input / solver fails before the solve
        check_impulse_options(patch_grid_of(model), model.embed_dim, model.blocks[0].attn.num_heads, **options)


@register_initializer("impulse", options=_impulse_options, takes_kernel=True, check=_check_impulse)
def _impulse(model, *, seed, generator, solution=None, **options):
    """The structured init (impulse.py, solvers.py) on top of timm's default: each head's Q/K
    from a solve (or a ready `solution`, e.g. a preoptimize artifact)."""
    trunc_normal(model)
    if solution is None:
        blocks = model.blocks
        solution = solve_impulse_qk(patch_grid_of(model), model.embed_dim, blocks[0].attn.num_heads,
                                    len(blocks), seed=seed, **options)
    apply_impulse_solution(model, solution)
    return {"options": solution.options, "offsets": solution.offsets, "solve_seconds": solution.solve_seconds,
            "fit_mse": solution.fit_mse, "target_mass": solution.target_mass,
            "solver_info": {k: v for k, v in solution.solver_info["layer0"].items() if k != "loss_history"}}
