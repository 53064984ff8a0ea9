"""`initialize(model, method, **options)`: one entry point for every initializer.

    trunc_normal     timm's default                                   (baselines.py)
    kaiming_uniform  PyTorch's module defaults                        (baselines.py)
    mimetic          Trockman & Kolter 2023                           (mimetic.py)
    impulse          the structured init of the paper                 (impulse.py, solvers.py)

Every method leaves the fixed sin-cos position encoding in place, and the same seed gives
the same weights (the global RNG is forked, not consumed).
"""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

import torch

from ..config import IMPULSE_SOLVE_OPTIONS, METHODS
from ..models.vit import check_structured_vit, patch_grid_of, reset_position_encoding
from . import solvers
from .baselines import kaiming_uniform, trunc_normal
from .impulse import (ImpulseSolution, apply_impulse_solution, check_impulse_options,
                      impulse_attention_target,
                      kernel_offset, make_pseudo_input, solve_impulse_qk)
from .mimetic import mimetic

MIMETIC_OPTIONS = ("alpha", "beta", "alpha_v", "beta_v")
IMPULSE_OPTIONS = ("kernel", *IMPULSE_SOLVE_OPTIONS, "solution")


def _solver_options(solver: str) -> tuple[str, ...]:
    fn = solvers.SOLVERS.get(solver)
    if fn is None:
        raise ValueError(f"unknown solver {solver!r}; choose one of {tuple(solvers.SOLVERS)}")
    return tuple(p.name for p in inspect.signature(fn).parameters.values()
                 if p.kind is p.KEYWORD_ONLY and p.name not in ("head_dim", "scale", "generator"))


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
    """Initialize a timm VisionTransformer (no class token, avg pooling) in place."""
    if method not in METHODS:
        raise ValueError(f"unknown init method {method!r}; choose one of {METHODS}")
    allowed = {"trunc_normal": (), "kaiming_uniform": (), "mimetic": MIMETIC_OPTIONS,
               "impulse": IMPULSE_OPTIONS + _solver_options(options.get("solver", "closed_form"))
               }[method]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {method!r}; allowed: {list(allowed)}")
    check_structured_vit(model)
    if method == "impulse" and options.get("solution") is None:
        # Fail on a bad kernel / pseudo-input / solver before any weight is touched.
        check_impulse_options(patch_grid_of(model), model.embed_dim, model.blocks[0].attn.num_heads,
                              **options)
    record = InitRecord(method=method, seed=seed, options={k: v for k, v in options.items()
                                                           if k != "solution"})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        gen = torch.Generator().manual_seed(seed)
        # Every module gets PyTorch's default first, so that no weight (e.g. the patch
        # embedding, which timm leaves at PyTorch's default) depends on the global RNG.
        kaiming_uniform(model)
        if method != "kaiming_uniform":
            trunc_normal(model)
        if method == "mimetic":
            mimetic(model, gen, **options)
        elif method == "impulse":
            solution = options.pop("solution", None)
            if solution is None:
                blocks = model.blocks
                solution = solve_impulse_qk(patch_grid_of(model), model.embed_dim,
                                            blocks[0].attn.num_heads, len(blocks), seed=seed, **options)
            apply_impulse_solution(model, solution)
            record.options = solution.options
            record.offsets = solution.offsets
            record.solve_seconds = solution.solve_seconds
            record.fit_mse = solution.fit_mse
            record.target_mass = solution.target_mass
            record.solver_info = {k: v for k, v in solution.solver_info["layer0"].items()
                                  if k != "loss_history"}
    reset_position_encoding(model)
    return record


__all__ = ["METHODS", "InitRecord", "initialize", "ImpulseSolution", "solve_impulse_qk",
           "apply_impulse_solution", "impulse_attention_target", "kernel_offset",
           "make_pseudo_input", "trunc_normal", "kaiming_uniform", "mimetic"]
