"""The structured init, and `initialize(model, method, **options)`: one entry point for every
initializer registered in registry.py (the one place to add one):

    trunc_normal     timm's default                                   (baselines.py)
    kaiming_uniform  PyTorch's module defaults                        (baselines.py)
    mimetic          Trockman & Kolter 2023                           (mimetic.py)
    impulse          the structured init of the paper                 (impulse.py, solvers.py)

Every method leaves the fixed sin-cos position encoding in place, and the same seed gives
the same weights (the global RNG is forked, not consumed).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from structinit.init.impulse import (ImpulseSolution, apply_impulse_solution, impulse_attention_target,
                                     kernel_offset, make_pseudo_input, solve_impulse_qk)
from structinit.init.baselines import kaiming_uniform, trunc_normal
from structinit.init.mimetic import mimetic
from structinit.init.registry import (INITIALIZERS, Initializer, allowed_options, get_initializer,
                                      register_initializer)
from structinit.models.vit import check_structured_vit, reset_position_encoding

METHODS = INITIALIZERS.keys()    # a live view: an initializer registered later is listed too


@dataclass
class InitRecord:
    """What `initialize` did. offsets[l][h] = (m, n) of head h in block l (impulse only)."""
    method: str
    seed: int
    options: dict
    offsets: list | None = None
    solve_seconds: float = 0.0
    fit_mse: float | None = None       # the solve's fit on the pseudo-input (ImpulseSolution)
    target_mass: float | None = None
    solver_info: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def initialize(model, method: str, *, seed: int = 0, **options) -> InitRecord:
    """Initialize a timm VisionTransformer (no class token, avg pooling) in place with the
    registered initializer `method` (init/registry.py)."""
    init = get_initializer(method)
    allowed = allowed_options(init, options)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {method!r}; allowed: {list(allowed)}")
    check_structured_vit(model)
    if init.check is not None:
        init.check(model, **options)
    record = InitRecord(method=method, seed=seed, options={k: v for k, v in options.items() if k != "solution"})
    with torch.random.fork_rng(devices=[]), torch.no_grad():     # weights are set, not trained
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        # Every module gets PyTorch's default first, so that no weight (e.g. the patch
        # embedding, which timm leaves at PyTorch's default) depends on the global RNG.
        kaiming_uniform(model)
        facts = init.apply(model, seed=seed, generator=gen, **options)
    for key, value in (facts or {}).items():
        setattr(record, key, value)
    reset_position_encoding(model)
    return record


__all__ = ["METHODS", "INITIALIZERS", "Initializer", "InitRecord", "initialize", "register_initializer",
           "ImpulseSolution", "solve_impulse_qk",
           "apply_impulse_solution", "impulse_attention_target", "kernel_offset",
           "make_pseudo_input", "trunc_normal", "kaiming_uniform", "mimetic"]
