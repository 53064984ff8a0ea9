"""Linear CKA (Kornblith et al., 2019): how alike two sets of representations of the same inputs
are, invariant to rotations and isotropic scaling of either, in [0, 1].

    layer_representations(model, images) -> [(B, C)] one per block (token mean of its output)
    cka_matrix(reps_a, reps_b)           -> (len(a), len(b)) CKA of every pair of layers

Used to compare the layers of models with different initializers, or a model at init with
itself after training, on the same test images.
"""
from __future__ import annotations

import torch

from structinit.analysis.attention import eval_forward_with_hooks


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """x (n, p), y (n, q): rows are the same n inputs. ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)."""
    return float(_linear_cka(x, y))


def _linear_cka(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """linear_cka as a 0-dim float64 tensor on the inputs' device: no host read, so a matrix
    of them costs one transfer at its end, not one sync per pair."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows, y {y.shape[0]}: both must be the same inputs")
    x = x.double() - x.double().mean(0)
    y = y.double() - y.double().mean(0)
    cross = (y.T @ x).square().sum()
    norm = (x.T @ x).square().sum().sqrt() * (y.T @ y).square().sum().sqrt()
    return torch.where(norm > 0, cross / norm, torch.zeros_like(norm))


@torch.no_grad()
def layer_representations(model, images: torch.Tensor) -> list[torch.Tensor]:
    """Each transformer block's output on `images`, averaged over tokens: [(B, C)] * depth."""
    outputs = []
    eval_forward_with_hooks(model, images, lambda block: block.register_forward_hook(
        lambda m, args, out: outputs.append(out.mean(1).float())))          # (B, N, C) -> (B, C)
    return outputs


def cka_matrix(reps_a: list[torch.Tensor], reps_b: list[torch.Tensor]) -> torch.Tensor:
    """(len(reps_a), len(reps_b)): linear CKA between every layer of a and every layer of b
    (float32, on the representations' device)."""
    return torch.stack([torch.stack([_linear_cka(a, b) for b in reps_b]) for a in reps_a]).float()
