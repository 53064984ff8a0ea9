"""How soft the official solver's maps are, as a function of the model's shape.

The official solver (`solve_qk_adam`) caps every column of Q and K at the same norm, about
1/sqrt(3) whatever the shape (a = sqrt(1 / (r * heads)) = sqrt(1 / C), so a Q column of C
entries U(-a, a) has norm^2 ~ C * a^2 / 3 = 1/3). The cap, not the loss, decides how sharp
the maps get. Its effect is a logit advantage z of the target key over the others:
softmax over one target and N - 1 others with advantage z puts

    mass = 1 / (1 + (N - 1) * exp(-z))                                        (1)

on the target. Tokens are layer-normalized (norm sqrt(C)) and the capped factors keep a
fixed norm per column, so the logits the cap allows grow with the width C: measured on the
official loop, z / sqrt(C) stays within 0.28..0.34 from C = 32 to C = 768. How fast z grows
with C depends on the grid (the sin-cos encoding of a small grid has few distinct
directions, so extra width adds less there), and more heads of the same total width come
out slightly softer (0.276 vs 0.259 for 3 vs 8 heads on ViT-T/2). The law

    log z = c0 + c1 log C + c2 log N + c3 log C log N + c4 log H               (2)

(z ~ C ** (c1 + c3 log N): exponent 0.61 on an 8x8 grid, 0.53 on 16x16) is fitted by least
squares on 28 shapes that are *not* in params.yaml and checked on every shape that is, plus
ViT-B/16: all within 0.03 of the official solver (largest miss 0.020, ViT-T/2 and h8;
the fit shapes themselves stay within 0.05);
the frozen stage softness_law re-runs the official solver, refits and writes both (docs/library.md).
(1) turns z back into a mass, and the closed form is calibrated to it
(`solve_qk_closed_form`). The law is for the P pseudo-input (the paper's default); U, G and
A make the official maps much sharper (0.40 / 0.42 / 0.28 vs 0.11 on the digits shape) and
are not covered: give `target_mass` there.
"""
from __future__ import annotations

import math

# Fitted by the softness_law stage (data: results/evidence/softness_law/softness_law.csv).
COEFFICIENTS = (-2.8389, 0.8434, 0.2888, -0.0561, -0.0178)


def features(num_tokens: int, embed_dim: int, num_heads: int) -> tuple[float, ...]:
    """The terms of (2), in COEFFICIENTS' order."""
    lc, ln = math.log(embed_dim), math.log(num_tokens)
    return (1.0, lc, ln, lc * ln, math.log(num_heads))


def target_logit_advantage(num_tokens: int, embed_dim: int, num_heads: int) -> float:
    """z of (2): the official solver's logit advantage of the target key."""
    return math.exp(sum(c * f for c, f in zip(COEFFICIENTS, features(num_tokens, embed_dim, num_heads))))


def official_target_mass(num_tokens: int, embed_dim: int, num_heads: int) -> float:
    """Mean attention mass on the target key that the official 10,000-step solver reaches
    on the P pseudo-input for N = num_tokens patches, width C = embed_dim and H heads, by
    (1)-(2)."""
    if num_tokens < 2 or embed_dim < 1 or num_heads < 1:
        raise ValueError(f"need >= 2 tokens, a positive width and heads; got N={num_tokens}, "
                         f"C={embed_dim}, H={num_heads}")
    z = target_logit_advantage(num_tokens, embed_dim, num_heads)
    return 1.0 / (1.0 + (num_tokens - 1) * math.exp(-z))
