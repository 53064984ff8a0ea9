"""Solvers for the structured init's W_q, W_k ("pre-optimization").

Both take the pseudo-input x (N, C) and the per-head 0/1 targets (H, N, N) and return
Q (H, C, r), K (H, r, C) with softmax(x Q_h K_h x^T * scale) ~ target_h.

  solve_qk_adam         the paper's iterative solver (Adam, column renormalisation)
  solve_qk_closed_form  least squares in logit space + one softness scalar per head
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from structinit.config import SOLVER_NAMES
from structinit.init.softness import official_target_mass

def attention_from_qk(x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """(H, N, N) softmax(x Q_h K_h x^T * scale)."""
    logits = (x @ q) @ (k @ x.T) * scale  # (H, N, r) @ (H, r, N)
    return logits.softmax(-1)


def mean_target_mass(maps: torch.Tensor, targets: torch.Tensor) -> float:
    """Mean over heads and rows-with-a-target of the attention mass on the target key."""
    has_target = targets.sum(-1) > 0                      # (H, N)
    mass = (maps * targets).sum(-1)                       # (H, N)
    return (mass[has_target].mean()).item()


def adam_start(x, targets, *, head_dim, generator):
    """The official loop's start: Q (H, C, r) then K (H, r, C) drawn U(-a, a), a = sqrt(1 / (r *
    heads)), from `generator`, and the cap, the mean norm of Q's columns (length-C vectors)."""
    H, C, r = targets.shape[0], x.shape[1], head_dim
    a = math.sqrt(1.0 / (r * H))
    q = (torch.rand(H, C, r, generator=generator) * 2 - 1) * a
    k = (torch.rand(H, r, C, generator=generator) * 2 - 1) * a
    return q, k, q.norm(dim=1).mean()


def solve_qk_adam(x, targets, *, head_dim, scale, generator, steps=10_000, lr=1e-4,
                  renorm_every=100, early_stop=False, tol=1e-3, window=1000):
    """The paper's solver as its official code runs it (`impulse_init`, timm fork).

    Q (H, C, r) then K (H, r, C) start U(-a, a), a = sqrt(1 / (r * heads)). The cap is the
    mean norm of Q's columns (length-C vectors) at the start. At steps 0, 100, ..., each
    column of Q (over C) and each column of K (over r) is rescaled to the cap, *before* that
    step's Adam update; Q and K are returned right after the last Adam step, with no final
    rescaling: the last 100 free steps sharpen the maps (mass 0.28 vs 0.21 on ViT-T/2), and
    that is the official init. Loss: MSE over heads and all N x N entries.

    early_stop (off by default; the paper runs all `steps`): stop at the end of a
    renormalisation cycle, as the official loop ends, once the loss fell by less than `tol`
    (relative) over the last `window` steps. The info dict reports where it stopped.
    """
    q, k, cap = adam_start(x, targets, head_dim=head_dim, generator=generator)
    q, k, info = adam_loop(x, targets, q, k, cap, scale=scale, steps=steps, lr=lr, renorm_every=renorm_every,
                           early_stop=early_stop, tol=tol, window=window)
    return q, k, info


def solve_qk_adam_stacked(x, targets, starts, *, scale, steps=10_000, lr=1e-4, renorm_every=100, **_ignored):
    """Several problems of one shape in one official loop, all `steps` (no early stop): targets
    (S, H, N, N), starts S (q, k, cap) of `adam_start`, one pseudo-input x (N, C) shared by all.
    Returns Q (S, H, C, r), K (S, H, r, C) and one info dict per problem. Each problem's loss is
    its own MSE and Adam's update is elementwise, so each problem's Q, K are the bits its own
    `solve_qk_adam` gives (on the CPU; tests/test_solvers.py checks it): one loop's host
    overhead instead of S loops'."""
    q = torch.stack([s[0] for s in starts])
    k = torch.stack([s[1] for s in starts])
    caps = torch.stack([s[2] for s in starts]).view(-1, 1, 1, 1)
    return adam_loop(x, targets, q, k, caps, scale=scale, steps=steps, lr=lr, renorm_every=renorm_every)


@torch.enable_grad()     # an autograd loop: it must run inside initialize()'s no_grad too
def adam_loop(x, targets, q, k, cap, *, scale, steps, lr, renorm_every, early_stop=False, tol=1e-3,
              window=1000):
    """The official loop from a start (adam_start). One problem: targets (H, N, N), Q (H, C, r),
    K (H, r, C), cap a scalar. Stacked problems (no early stop): a leading dimension S on
    targets, Q and K, cap (S, 1, 1, 1), and a loss whose gradient is each problem's own MSE's:
    the summed squared error over the entries of one problem (mse_loss's own backward computes
    (map - target) * 2 / n for a mean and (map - target) * 2 * g for a sum; with g = 1 / n those
    are the same float products, as 2 / n and 2 * (1 / n) are)."""
    stacked = targets.dim() == 4
    if stacked and early_stop:
        raise ValueError("stacked problems run every step: early_stop is for one problem")
    q, k = q.clone().requires_grad_(), k.clone().requires_grad_()
    opt = torch.optim.Adam([q, k], lr=lr)
    history: list = []                                    # (steps done, loss) at cycle ends
    t0 = time.perf_counter()
    step = -1
    for step in range(steps):
        if step % renorm_every == 0:
            with torch.no_grad():
                q.mul_(cap / q.norm(dim=-2, keepdim=True))
                k.mul_(cap / k.norm(dim=-2, keepdim=True))
        maps = attention_from_qk(x, q, k, scale)
        if stacked:     # each problem's mean-MSE gradient, 2 (map - target) / n, to the bit
            loss_t = F.mse_loss(maps, targets, reduction="sum") * (1 / targets[0].numel())
        else:
            loss_t = F.mse_loss(maps, targets)
        opt.zero_grad(set_to_none=True)
        loss_t.backward()
        opt.step()
        if (step + 1) % renorm_every == 0:                # a cycle ends: log, maybe stop
            if stacked:                                   # each problem's own loss, as it alone logs it
                with torch.no_grad():
                    history.append((step + 1, [F.mse_loss(m, t).item() for m, t in zip(maps, targets)]))
            else:
                history.append((step + 1, loss_t.item()))
            back = window // renorm_every
            if early_stop and len(history) > back and \
                    history[-1 - back][1] - history[-1][1] < tol * history[-1 - back][1]:
                break
    seconds = time.perf_counter() - t0

    def info(loss_history):
        return {"solver": "adam", "steps_run": step + 1, "max_steps": steps, "early_stop": early_stop,
                "stopped_early": step + 1 < steps, "seconds": seconds, "loss_history": loss_history}
    if not stacked:
        return q.detach(), k.detach(), info(history)
    return q.detach(), k.detach(), [info([(n, l[i]) for n, l in history]) for i in range(len(targets))]


def solve_qk_closed_form(x, targets, *, head_dim, scale, generator,
                         target_mass=None, rtol=0.03, filler_std=0.02):
    """Least squares in logit space, then a per-head softness scalar.

    For head h the ideal logits are beta * T_h (row-wise shifts do not change a softmax).
    The least-squares bilinear form is W = pinv(x) T_h pinv(x)^T / scale; with the thin SVD
    x = U S V^T (rank rho) it is W = V M V^T, M = S^-1 U^T T_h U S^-1 (rho x rho), so only
    rho x rho matrices are factorised, whatever the width C. Its logits x W x^T * scale are
    U U^T T_h U U^T: the target projected onto what the pseudo-input can express, linear
    in beta, so beta is found by bisection (all heads at once) to put a mean mass of
    `target_mass` on the target key: by default the official solver's softness for this
    shape (softness.py: N tokens, width C, H heads), or the number given.

    Q = V A sqrt(S_M), K = sqrt(S_M) B^T V^T from M = A S_M B^T, truncated to r columns.
    When rho < r, the remaining r - rho columns of Q and K would be exactly zero, a saddle
    that gradient descent never leaves; they get timm's default N(0, filler_std) instead,
    which moves the logits on x by ~1e-3 of their spread.
    """
    H, N, _ = targets.shape
    C = x.shape[1]
    source = "softness law (official solver)" if target_mass is None else "explicit"
    if target_mass is None:
        target_mass = official_target_mass(N, C, H)
    elif not 0 < target_mass < 1:
        raise ValueError(f"target_mass={target_mass!r}: a mean attention mass in (0, 1), or None "
                         "for the official solver's softness at this shape")
    xd = x.double()
    # x is far from full rank (the LN-ed sin-cos encoding of a 16x16 grid has ~20 useful
    # directions out of 192). An exact pseudo-inverse puts huge weights on the near-null
    # directions: harmless on x itself, but real tokens do have energy there, and the
    # logits explode (std ~1e7 on random LN-ed tokens; training then never starts). Keeping
    # singular values >= rtol * the largest gives ||Q K|| and logit scales on generic inputs
    # like the Adam solver's, at the same fit.
    u, sv, vh = torch.linalg.svd(xd, full_matrices=False)
    keep = sv >= rtol * sv[0]
    u, sv, v = u[:, keep], sv[keep], vh[keep].T                  # (N, rho), (rho,), (C, rho)
    rho = int(keep.sum())
    t = targets.double()
    m = (u.T @ t @ u) / (sv[:, None] * sv[None, :]) / scale     # (H, rho, rho)
    a, sm, bh = torch.linalg.svd(m)
    rank = min(rho, head_dim)
    root = sm[:, :rank].sqrt()                                   # (H, rank)
    q1 = (v @ a[:, :, :rank]) * root[:, None, :]                 # (H, C, rank)
    k1 = root[:, :, None] * (bh[:, :rank] @ v.T)                 # (H, rank, C)
    logits1 = (xd @ q1) @ (k1 @ xd.T) * scale                    # (H, N, N), beta = 1
    beta = _calibrate_softness(logits1, t, target_mass)          # (H,)
    q = torch.zeros(H, C, head_dim, dtype=torch.float64)
    k = torch.zeros(H, head_dim, C, dtype=torch.float64)
    q[:, :, :rank] = q1 * beta.sqrt()[:, None, None]
    k[:, :rank] = k1 * beta.sqrt()[:, None, None]
    if rank < head_dim:
        fill = lambda *shape: torch.nn.init.trunc_normal_(  # noqa: E731
            torch.empty(shape, dtype=torch.float64), std=filler_std, generator=generator)
        q[:, :, rank:] = fill(H, C, head_dim - rank)
        k[:, rank:] = fill(H, head_dim - rank, C)
    return q.float(), k.float(), {
        "solver": "closed_form", "target_mass_goal": target_mass,
        "target_mass_source": source, "rtol": rtol,
        "pseudo_input_rank": rho, "solved_rank": rank, "beta": beta.tolist()}


def _calibrate_softness(logits1, target, goal, iters=50):
    """Per head, the beta with mean target mass(beta * logits1) = goal (bisection in log beta)."""
    rows = target.sum(-1) > 0                                    # (H, N)

    def mass(beta):                                              # (H,)
        m = ((beta[:, None, None] * logits1).softmax(-1) * target).sum(-1)
        return (m * rows).sum(-1) / rows.sum(-1)

    lo = torch.full((len(logits1),), 1e-6, dtype=logits1.dtype)
    hi = torch.ones_like(lo)
    while (low := mass(hi) < goal).any():
        hi = torch.where(low, hi * 2, hi)
        if hi.max() > 1e8:
            raise RuntimeError(f"target_mass={goal} is out of reach for this pseudo-input")
    for _ in range(iters):
        mid = (lo * hi).sqrt()
        below = mass(mid) < goal
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return hi


SOLVERS = {"closed_form": solve_qk_closed_form, "adam": solve_qk_adam}
assert set(SOLVERS) == set(SOLVER_NAMES), "config.SOLVER_NAMES names the solvers for params.yaml's schema"
