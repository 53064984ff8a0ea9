"""The structured init of the paper (init/impulse.py, init/solvers.py), on top of timm's
default: each head's Q/K from a solve, or from a ready `solution` (a preoptimize artifact).
Cells name it impulse<k>, one per kernel (takes_kernel)."""
import inspect

from structinit.config import IMPULSE_SOLVE_OPTIONS
from structinit.init import solvers
from structinit.init.baselines import trunc_normal
from structinit.init.impulse import apply_impulse_solution, check_impulse_options, solve_impulse_qk
from structinit.init.registry import register_initializer
from structinit.models.vit import patch_grid_of


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
    trunc_normal(model)
    if solution is None:
        blocks = model.blocks
        solution = solve_impulse_qk(patch_grid_of(model), model.embed_dim, blocks[0].attn.num_heads,
                                    len(blocks), seed=seed, **options)
    apply_impulse_solution(model, solution)
    return {"options": solution.options, "offsets": solution.offsets, "solve_seconds": solution.solve_seconds,
            "fit_mse": solution.fit_mse, "target_mass": solution.target_mass,
            "solver_info": {k: v for k, v in solution.solver_info["layer0"].items() if k != "loss_history"}}
