"""The structured ("impulse") initialization of attention: the paper's method.

Each head's W_q, W_k are solved so that, on a data-free pseudo-input, its attention map
approximates the N x N matrix of a k x k convolution with a one-hot (impulse) filter: the
head attends from patch (i, j) to patch (i + m, j + n). Everything else keeps timm's
default init, and everything stays trainable. Method page, sections 2-3.

Pieces, in the order they are used:
  kernel_offset / assign_offsets     which offset (m, n) each head gets
  impulse_attention_target           the N x N 0/1 target of one offset
  make_pseudo_input                   P / U / G / A / B, layer-normalized (N, C)
  solve_impulse_qk                    targets + pseudo-input -> per-layer Q, K (solvers.py)
  solve_impulse_qk_seeds              the same for several seeds (the official loop: all at once)
  apply_impulse_solution              writes Q, K into a timm VisionTransformer
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from structinit.config import OFFSET_ORDERS, PSEUDO_INPUTS, check_kernel
from structinit.models.vit import check_structured_vit, patch_grid_of, sincos_position_encoding
from structinit.init.solvers import (SOLVERS, adam_start, attention_from_qk, mean_target_mass,
                                     solve_qk_adam_stacked)



def kernel_offset(kappa: int, kernel: int) -> tuple[int, int]:
    """Filter index kappa in [0, k^2) -> grid offset (m, n), |m|, |n| <= k // 2."""
    return kappa // kernel - kernel // 2, kappa % kernel - kernel // 2


def fixed_offset_order(kernel: int) -> list[int]:
    """Centre, up, right, left, down, then the rest by distance (diagonals first).

    The NeurIPS version's order; taps further out than the 3x3 ring follow by Euclidean
    distance, ties broken clockwise from "up", so the order is total and reproducible.
    """
    c = kernel // 2
    first = [(0, 0), (-1, 0), (0, 1), (0, -1), (1, 0)]
    rest = [(m, n) for m in range(-c, c + 1) for n in range(-c, c + 1) if (m, n) not in first]
    rest.sort(key=lambda mn: (mn[0] ** 2 + mn[1] ** 2, math.atan2(mn[1], -mn[0]) % (2 * math.pi)))
    return [(m + c) * kernel + (n + c) for m, n in first + rest]


def assign_offsets(num_heads: int, kernel: int, order: str, generator: torch.Generator) -> list[int]:
    """One filter index per head. "random": uniform with replacement (the paper's code)."""
    if order == "random":
        return torch.randint(0, kernel * kernel, (num_heads,), generator=generator).tolist()
    if order == "fixed":
        seq = fixed_offset_order(kernel)
        return [seq[h % len(seq)] for h in range(num_heads)]
    raise ValueError(f"unknown offset_order={order!r}; choose one of {OFFSET_ORDERS}")


def impulse_attention_target(patch_grid: tuple[int, int], offset: tuple[int, int]) -> torch.Tensor:
    """(N, N) target: row t(i, j) has a single 1 at t(i+m, j+n) when that is on the grid.

    Rows whose shifted position falls off the grid stay all-zero (zero padding).
    """
    H, W = patch_grid
    m, n = offset
    i, j = torch.meshgrid(torch.arange(H), torch.arange(W), indexing="ij")
    i2, j2 = i + m, j + n
    inside = (i2 >= 0) & (i2 < H) & (j2 >= 0) & (j2 < W)
    target = torch.zeros(H * W, H * W)
    rows = (i * W + j)[inside]
    cols = (i2 * W + j2)[inside]
    target[rows, cols] = 1.0
    return target


def layer_norm_rows(x: torch.Tensor) -> torch.Tensor:
    """Per-token LayerNorm without affine, eps 1e-5: what a fresh block's norm1 computes."""
    return F.layer_norm(x, x.shape[-1:], eps=1e-5)


def make_pseudo_input(kind: str, patch_grid: tuple[int, int], embed_dim: int,
                 generator: torch.Generator) -> torch.Tensor:
    """Data-free stand-in for the tokens a layer sees, (N, C), layer-normalized.

    P: the model's fixed 2-D sin-cos encoding; U: i.i.d. U(-1, 1); G: truncated normal,
    std sqrt(0.5) cut at +-2; A = P + U; B = P + G.
    """
    if kind not in PSEUDO_INPUTS:
        raise ValueError(f"unknown pseudo_input {kind!r}; choose one of {PSEUDO_INPUTS}")
    shape = (patch_grid[0] * patch_grid[1], embed_dim)
    pe = sincos_position_encoding(patch_grid, embed_dim)
    uniform = lambda: torch.rand(shape, generator=generator) * 2 - 1  # noqa: E731
    gaussian = lambda: torch.nn.init.trunc_normal_(  # noqa: E731
        torch.empty(shape), std=math.sqrt(0.5), a=-2.0, b=2.0, generator=generator)
    x = {"P": lambda: pe, "U": uniform, "G": gaussian,
         "A": lambda: pe + uniform(), "B": lambda: pe + gaussian()}[kind]()
    return layer_norm_rows(x)


@dataclass
class ImpulseSolution:
    """Solved Q, K for every block, plus what it took to get them.

    q: (L, H, C, r) and k: (L, H, r, C) with L = depth (a shared solve repeats one entry).
    kappas[l][h] is head h's filter index in block l; offsets[l][h] its (m, n).
    """
    q: torch.Tensor
    k: torch.Tensor
    kappas: list[list[int]]
    offsets: list[list[tuple[int, int]]]
    patch_grid: tuple[int, int]
    options: dict
    solve_seconds: float | None     # None when read back from an artifact (timings are not kept)
    fit_mse: float          # MSE between solved maps and targets on the pseudo-input (block 0)
    target_mass: float      # mean attention mass on the target key (rows with a target)
    solver_info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ImpulseSolution":
        d = {"solve_seconds": None, **d}
        d["offsets"] = [[tuple(o) for o in layer] for layer in d["offsets"]]
        d["patch_grid"] = tuple(d["patch_grid"])
        return cls(**d)


def check_impulse_options(patch_grid, embed_dim, num_heads, *, kernel=3, offset_order="random",
                          pseudo_input="P", pseudo_input_rest=None, solver="closed_form",
                          **_ignored) -> None:
    """Raise a clear error for a bad option, before any work is done."""
    check_kernel(kernel, tuple(patch_grid))
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
    for kind in (pseudo_input, pseudo_input_rest or pseudo_input):
        if kind not in PSEUDO_INPUTS:
            raise ValueError(f"unknown pseudo_input {kind!r}; choose one of {PSEUDO_INPUTS}")
    if offset_order not in OFFSET_ORDERS:
        raise ValueError(f"unknown offset_order={offset_order!r}; choose one of {OFFSET_ORDERS}")
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {tuple(SOLVERS)}")


def solve_impulse_qk(patch_grid: tuple[int, int], embed_dim: int, num_heads: int, depth: int, *,
                     kernel: int = 3, offset_order: str = "random", pseudo_input: str = "P",
                     pseudo_input_rest: str | None = None, per_layer: bool = False,
                     solver: str = "closed_form", seed: int = 0, **solver_options) -> ImpulseSolution:
    """Solve W_q, W_k for every block of a (patch grid, width, heads, depth) ViT. No model needed.

    pseudo_input is what block 0 sees; pseudo_input_rest (default: the same) what later
    blocks see. Shared (per_layer=False): block 0 is solved on pseudo_input and every later
    block reuses one solve on pseudo_input_rest (one solve in all when they are equal).
    per_layer=True solves every block afresh, with new offsets and a new pseudo-input draw.
    """
    patch_grid = tuple(patch_grid)
    check_impulse_options(patch_grid, embed_dim, num_heads, kernel=kernel, offset_order=offset_order,
                          pseudo_input=pseudo_input, pseudo_input_rest=pseudo_input_rest,
                          solver=solver)
    pseudo_input_rest = pseudo_input_rest or pseudo_input
    head_dim = embed_dim // num_heads
    scale = head_dim ** -0.5
    gen = torch.Generator().manual_seed(seed)
    solve = SOLVERS[solver]

    plan = _solve_plan(depth, per_layer, pseudo_input, pseudo_input_rest)
    solved: dict[int, tuple] = {}
    t0 = time.perf_counter()
    for l, key in enumerate(plan):
        if key in solved:
            continue
        kind = pseudo_input if l == 0 else pseudo_input_rest
        kappas, mn, targets, x = _draw_problem(kind, patch_grid, embed_dim, num_heads, kernel, offset_order, gen)
        q, k, info = solve(x, targets, head_dim=head_dim, scale=scale, generator=gen,
                           **solver_options)
        solved[key] = (q, k, kappas, mn, _with_fit(info, x, q, k, targets, scale))
    options = dict(kernel=kernel, offset_order=offset_order, pseudo_input=pseudo_input,
                   pseudo_input_rest=pseudo_input_rest, per_layer=per_layer, solver=solver,
                   seed=seed, embed_dim=embed_dim, num_heads=num_heads, depth=depth, **solver_options)
    return _solution(plan, solved, patch_grid, options, time.perf_counter() - t0)


def solve_impulse_qk_seeds(patch_grid: tuple[int, int], embed_dim: int, num_heads: int, depth: int, *,
                           seeds, solver: str = "closed_form", **options) -> list[ImpulseSolution]:
    """[solve_impulse_qk(..., seed=s) for s in seeds], the same bits, faster where the official
    solver's problems can share one loop: solver="adam" without early stop, one solve per model
    (a shared solve on one pseudo-input) and the same pseudo-input for every seed (P, the
    sin-cos encoding, is; a random draw is not). Those are solved stacked, every seed's Q, K in
    one autograd loop (solvers.solve_qk_adam_stacked): the loop's cost is its ops' launches, not
    their arithmetic, so S seeds cost about one. Anything else is solved seed by seed.

    On the CPU, with one intra-op thread while it runs (restored after): the problems are a few
    thousand numbers, which a GPU or more threads only wait on (launches, fork and join per
    op); the thread count does not move the bits (tests/test_solvers.py)."""
    patch_grid = tuple(patch_grid)
    seeds = list(seeds)
    kw = dict(options, solver=solver)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = options.get("pseudo_input", "P")
        plan = _solve_plan(depth, options.get("per_layer", False), first, options.get("pseudo_input_rest") or first)
        stackable = (solver == "adam" and not options.get("early_stop", False) and len(seeds) > 1
                     and len(set(plan)) == 1)
        if not stackable:
            return [solve_impulse_qk(patch_grid, embed_dim, num_heads, depth, seed=s, **kw) for s in seeds]
        return _solve_adam_stacked(patch_grid, embed_dim, num_heads, depth, seeds, kw)
    finally:
        torch.set_num_threads(threads)


def _solve_adam_stacked(patch_grid, embed_dim, num_heads, depth, seeds, kw) -> list[ImpulseSolution]:
    check_impulse_options(patch_grid, embed_dim, num_heads, **kw)
    head_dim = embed_dim // num_heads
    scale = head_dim ** -0.5
    solver_options = {k: v for k, v in kw.items() if k not in _LAYOUT_OPTIONS + ("solver",)}
    layout = {"kernel": 3, "offset_order": "random", "pseudo_input": "P", "pseudo_input_rest": None,
              "per_layer": False, **{k: v for k, v in kw.items() if k in _LAYOUT_OPTIONS}}
    layout["pseudo_input_rest"] = layout["pseudo_input_rest"] or layout["pseudo_input"]
    t0 = time.perf_counter()
    problems, starts = [], []
    for seed in seeds:            # each seed's generator draws what solve_impulse_qk's draws, in order
        gen = torch.Generator().manual_seed(seed)
        problem = _draw_problem(layout["pseudo_input"], patch_grid, embed_dim, num_heads, layout["kernel"],
                                layout["offset_order"], gen)
        problems.append(problem)
        starts.append(adam_start(problem[3], problem[2], head_dim=head_dim, generator=gen))
    x = problems[0][3]
    if any(not torch.equal(p[3], x) for p in problems):      # a random pseudo-input: one loop each
        return [solve_impulse_qk(patch_grid, embed_dim, num_heads, depth, seed=s, **kw) for s in seeds]
    targets = torch.stack([p[2] for p in problems])
    q, k, infos = solve_qk_adam_stacked(x, targets, starts, scale=scale, **solver_options)
    seconds = time.perf_counter() - t0
    plan = _solve_plan(depth, layout["per_layer"], layout["pseudo_input"], layout["pseudo_input_rest"])
    out = []
    for i, seed in enumerate(seeds):
        kappas, mn, t, _ = problems[i]
        qi, ki = q[i].clone(), k[i].clone()
        info = dict(_with_fit(infos[i], x, qi, ki, t, scale), stacked_seeds=len(seeds))
        options = dict(layout, solver="adam", seed=seed, embed_dim=embed_dim, num_heads=num_heads, depth=depth,
                       **solver_options)
        out.append(_solution(plan, {0: (qi, ki, kappas, mn, info)}, patch_grid, options, seconds))
    return out


# solve_impulse_qk's keywords that shape the problem; the rest go to the solver
_LAYOUT_OPTIONS = ("kernel", "offset_order", "pseudo_input", "pseudo_input_rest", "per_layer")


def _solve_plan(depth, per_layer, pseudo_input, pseudo_input_rest) -> list[int]:
    """Which (pseudo-input, fresh offsets) each block's solve uses; equal keys share one solve."""
    return [(l if per_layer else (0 if (l == 0 or pseudo_input_rest == pseudo_input) else 1))
            for l in range(depth)]


def _draw_problem(kind, patch_grid, embed_dim, num_heads, kernel, offset_order, gen):
    """One block's problem, drawn from gen: offsets, then the pseudo-input."""
    kappas = assign_offsets(num_heads, kernel, offset_order, gen)
    mn = [kernel_offset(k, kernel) for k in kappas]
    targets = torch.stack([impulse_attention_target(patch_grid, o) for o in mn])  # (H, N, N)
    x = make_pseudo_input(kind, patch_grid, embed_dim, gen)                  # (N, C)
    return kappas, mn, targets, x


def _with_fit(info, x, q, k, targets, scale) -> dict:
    maps = attention_from_qk(x, q, k, scale)
    return dict(info, fit_mse=F.mse_loss(maps, targets).item(), target_mass=mean_target_mass(maps, targets))


def _solution(plan, solved, patch_grid, options, seconds) -> ImpulseSolution:
    per_block = [solved[key] for key in plan]
    first = per_block[0][4]
    return ImpulseSolution(
        q=torch.stack([b[0] for b in per_block]), k=torch.stack([b[1] for b in per_block]),
        kappas=[b[2] for b in per_block], offsets=[b[3] for b in per_block],
        patch_grid=patch_grid, options=options,
        solve_seconds=seconds, fit_mse=first["fit_mse"], target_mass=first["target_mass"],
        solver_info={"solves": len(solved), "layer0": first,
                     "per_solve": [v[4] for _, v in sorted(solved.items())]},
    )


@torch.no_grad()
def apply_impulse_solution(model, solution: ImpulseSolution) -> None:
    """Write the solved Q_h^T / K_h into each block's fused qkv weight (3C x C).

    Rows [q | k | v]; head h owns rows h*r:(h+1)*r of the q and k blocks. qkv bias, V,
    proj and everything else are left as they are. The solve covers the patch grid alone;
    a model's prefix tokens (class, register) go through the same W_q, W_k with no target
    of their own (docs/library.md, "Which timm ViTs").
    """
    check_structured_vit(model)
    L, H, C, r = solution.q.shape
    if (len(model.blocks), model.blocks[0].attn.num_heads, model.embed_dim) != (L, H, C) \
            or patch_grid_of(model) != tuple(solution.patch_grid):
        raise ValueError(
            f"solution is for depth={L}, heads={H}, width={C}, patch grid={solution.patch_grid}; the model has "
            f"depth={len(model.blocks)}, heads={model.blocks[0].attn.num_heads}, "
            f"width={model.embed_dim}, patch grid={patch_grid_of(model)}")
    for l, block in enumerate(model.blocks):
        w = block.attn.qkv.weight  # (3C, C)
        for h in range(H):
            w[h * r:(h + 1) * r] = solution.q[l, h].T.to(w)
            w[C + h * r:C + (h + 1) * r] = solution.k[l, h].to(w)
