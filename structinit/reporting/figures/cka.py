"""CKA heat maps: each model's blocks at init against its blocks trained, and the blocks of two
trained models with different initializers (every pair)."""
from __future__ import annotations

import numpy as np


from structinit.reporting.figures.style import plt             # the Agg backend and the shared look, before any figure
from structinit.reporting.presentation import init_label

_KW = dict(cmap="viridis", vmin=0, vmax=1, interpolation="nearest")


def _heat(ax, m, xlabel, ylabel, title, ticks_y=True):
    depth = m.shape[0]
    im = ax.imshow(m, **_KW)
    if depth <= 6:                                   # numbers stay legible
        for (i, j), v in np.ndenumerate(m):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6.5,
                    color="white" if v < 0.55 else "black")
    step = max(1, depth // 6)
    ticks = np.arange(0, depth, step)
    ax.set_xticks(ticks, [str(t + 1) for t in ticks], fontsize=7)
    ax.set_yticks(ticks, [str(t + 1) for t in ticks] if ticks_y else [], fontsize=7)
    ax.set_xlabel(xlabel, fontsize=7)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=7)
    ax.set_title(title, fontsize=8)
    return im


def init_vs_trained_figure(init_vs_trained: dict, seeds: int, dataset: str):
    """One panel per initializer: CKA(block i at init, block j trained), mean over seeds."""
    n = len(init_vs_trained)
    fig, axes = plt.subplots(1, n, figsize=(2.2 * n + 0.8, 2.9), squeeze=False)
    for c, (init, m) in enumerate(init_vs_trained.items()):
        im = _heat(axes[0, c], m, "block, trained", "block, at init" if c == 0 else "", init_label(init),
                   ticks_y=c == 0)
    fig.suptitle(f"{dataset}: linear CKA of each model's blocks at init vs trained, on the test images "
                 f"(mean over {seeds} seeds; 1 = unchanged up to rotation and scale)", fontsize=8.5, y=1.02)
    fig.colorbar(im, ax=axes, shrink=0.8, pad=0.01, label="linear CKA")
    return fig


def between_inits_figure(between: dict, inits: list[str], seeds: int, dataset: str):
    """Upper triangle of initializer pairs: row = a, column = b, panel = CKA(block i of trained
    a, block j of trained b), same seed, mean over seeds."""
    n = len(inits)
    if n < 2:                                        # the index links this file: say why it is empty
        fig, ax = plt.subplots(figsize=(4, 1))
        ax.axis("off")
        ax.text(0.5, 0.5, f"{dataset}: one initializer in the grid, no pair to compare", ha="center")
        return fig
    fig, axes = plt.subplots(n - 1, n - 1, figsize=(2.0 * (n - 1) + 1.2, 2.0 * (n - 1) + 0.6), squeeze=False)
    for r in range(n - 1):
        for c in range(n - 1):
            a, b = inits[r], inits[c + 1]
            ax = axes[r, c]
            if (a, b) not in between:
                ax.axis("off")
                continue
            im = _heat(ax, between[a, b], f"block of {init_label(b)}",
                       f"block of {init_label(a)}", f"{init_label(a)} vs {init_label(b)}")
    fig.suptitle(f"{dataset}: linear CKA between trained models with different initializers, on the "
                 f"test images\n(same seed, mean over {seeds} seeds; the diagonal compares the same block)",
                 fontsize=8.5)
    fig.tight_layout()
    fig.colorbar(im, ax=axes, shrink=0.5, pad=0.02, label="linear CKA")
    return fig
