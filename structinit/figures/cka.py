"""CKA heat maps: each model's layers at init against the same layers trained, and, per block,
every pair of initializers after training."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .attention import shown_blocks
from .style import init_label


def _annotate(ax, m):
    for (i, j), v in np.ndenumerate(m):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6.5,
                color="white" if v < 0.55 else "black")


def cka_figure(init_vs_trained: dict, between: np.ndarray, inits: list[str], seeds: int):
    """init_vs_trained: init -> (L, L) CKA(layer i at init, layer j trained), mean over seeds.
    between: (L, I, I) CKA of block l between trained models of two initializers (same seed),
    mean over seeds."""
    depth = between.shape[0]
    blocks = shown_blocks(depth) if depth > 6 else list(range(depth))   # deep models: 3 blocks
    n_top, n_bottom = len(init_vs_trained), len(blocks)
    cols = max(n_top, n_bottom)
    fig, axes = plt.subplots(2, cols, figsize=(2.3 * cols + 0.8, 5.4), squeeze=False)
    kw = dict(cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    ticks = np.arange(depth)
    for c, (init, m) in enumerate(init_vs_trained.items()):
        ax = axes[0, c]
        im = ax.imshow(m, **kw)
        if depth <= 6:                               # numbers stay legible
            _annotate(ax, m)
        ax.set_title(init_label(init), fontsize=8)
        ax.set_xticks(ticks, [str(t + 1) for t in ticks])
        ax.set_yticks(ticks, [str(t + 1) for t in ticks])
        ax.set_xlabel("block, trained", fontsize=7)
        if c == 0:
            ax.set_ylabel("block, at init", fontsize=7)
    names = [init_label(i) for i in inits]
    for c, b in enumerate(blocks):
        ax = axes[1, c]
        ax.imshow(between[b], **kw)
        _annotate(ax, between[b])
        ax.set_title(f"block {b + 1}, trained", fontsize=8)
        ax.set_xticks(range(len(inits)), names, rotation=60, ha="right", fontsize=6.5)
        ax.set_yticks(range(len(inits)), names if c == 0 else [], fontsize=6.5)
    for row, used in ((0, n_top), (1, n_bottom)):
        for c in range(used, cols):
            axes[row, c].axis("off")
    fig.subplots_adjust(wspace=0.35, hspace=0.45)
    fig.suptitle(f"Linear CKA on the test images (mean over {seeds} seeds). Top: each model's "
             "blocks at init vs trained.\nBottom: the same block of two trained models "
                 "with different initializers.", fontsize=8.5)
    fig.colorbar(im, ax=axes, shrink=0.6, pad=0.01, label="linear CKA")
    return fig
