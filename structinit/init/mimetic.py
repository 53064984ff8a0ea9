"""Mimetic initialization (Trockman & Kolter, ICML 2023), the strongest data-free baseline.

Per head: W_q W_k^T ~ rank-r part of (alpha Z + beta I); per layer: W_v W_proj ~
alpha_v Z - beta_v I (full rank). Z is i.i.d. uniform with variance 1/C, fresh per head and
per layer. Everything else keeps timm's default init.

`value_proj=False` sets Q/K only (the "Mimetic Q/K" arm, beyond the paper): the structured
init touches only Q/K, so Imp.-k vs Mimetic mixes attention structure with Mimetic's V/proj.
It draws the same Z for V/proj and discards them, so at one seed its Q/K equal Mimetic's
exactly and the two arms differ in V/proj alone.
"""
from __future__ import annotations

import math

import torch


def _factor(m: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """m (C, C) ~ A @ B with A (C, rank), B (rank, C), the best rank-`rank` split by SVD."""
    u, s, vh = torch.linalg.svd(m)
    root = s[:rank].sqrt()
    return u[:, :rank] * root, root[:, None] * vh[:rank]


def _uniform_unit_variance(c: int, generator: torch.Generator) -> torch.Tensor:
    bound = math.sqrt(3.0 / c)  # U(-b, b) has variance b^2 / 3 = 1 / C
    return (torch.rand(c, c, generator=generator) * 2 - 1) * bound


@torch.no_grad()
def mimetic(model, generator: torch.Generator, alpha: float = 0.7, beta: float = 0.7,
            alpha_v: float = 0.4, beta_v: float = 0.4, value_proj: bool = True) -> None:
    for block in model.blocks:
        attn = block.attn
        C, H = attn.qkv.in_features, attn.num_heads
        r = C // H
        w = attn.qkv.weight  # (3C, C): rows [q | k | v]
        for h in range(H):
            # q = x W_q^T, k = x W_k^T, so q k^T = x (W_q^T W_k) x^T: factor W_q^T W_k.
            z = _uniform_unit_variance(C, generator)
            qt, k = _factor(alpha * z + beta * torch.eye(C), r)
            w[h * r:(h + 1) * r] = qt.T
            w[C + h * r:C + (h + 1) * r] = k
        # out = x W_v^T W_proj^T: factor W_v^T W_proj^T = alpha_v Z - beta_v I.
        z = _uniform_unit_variance(C, generator)   # drawn either way: Q/K paired with Mimetic's
        if not value_proj:
            continue
        vt, projt = _factor(alpha_v * z - beta_v * torch.eye(C), C)
        w[2 * C:] = vt.T
        attn.proj.weight.copy_(projt.T)
