"""Attention figures: offset profiles per block and head, impulse kernels as k x k grids, and
mean attention distance per block.

Inputs are ModelAnalysis objects (structinit/analysis/model.py) of one seed per initializer, or, for
the distance plot, every seed. An offset profile is drawn as an image centred on offset (0, 0)
(the query's own patch, marked +); a structured-init head's impulse offset is outlined.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from structinit.reporting.presentation import init_color, init_label

STATES = {"at_init": "at init", "trained": "trained"}


def shown_blocks(depth: int) -> list[int]:
    """First, middle and last block (fewer when the model is shallower)."""
    return sorted({0, depth // 2, depth - 1})


def uniform_distance(patch_grid: tuple[int, int]) -> float:
    """Mean attention distance (patches) of uniform attention on the grid: the no-structure
    reference every map starts near when weights are small."""
    gh, gw = patch_grid
    i, j = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    pos = np.stack([i.ravel(), j.ravel()], 1).astype(float)
    return float(np.sqrt(((pos[:, None] - pos[None]) ** 2).sum(-1)).mean())


def shown_radius(profile_shape) -> int:
    """Offsets drawn: |m|, |n| <= half the grid. Farther offsets are averaged over few queries
    (the one query at a corner for the largest), so their values are noise that would set the
    colour scale."""
    return (profile_shape[-2] + 1) // 2 // 2


def _outline(ax, m, n, radius, color="lime"):
    ax.add_patch(Rectangle((n + radius - 0.5, m + radius - 0.5), 1, 1, fill=False, ec=color, lw=0.8))


def profile_vmax(analyses: dict) -> float:
    """One colour scale for both sources (pseudo-input and images), so the two figures compare:
    the largest drawn value of the first, middle and last blocks."""
    first = next(iter(analyses.values()))["at_init"]
    full, r = (first.profile_images.shape[-2] - 1) // 2, shown_radius(first.profile_images.shape)
    blocks = shown_blocks(first.distance_images.shape[0])
    return max(float(getattr(a[s], f"profile_{src}")[blocks][..., full - r:full + r + 1, full - r:full + r + 1].max())
               for a in analyses.values() for s in STATES for src in ("images", "pseudo"))


def profile_grid(analyses: dict, source: str, title: str, vmax: float):
    """Rows: initializer x {at init, trained}; columns: first/middle/last block x every head.
    analyses: init -> {"at_init": ModelAnalysis, "trained": ModelAnalysis} (one seed).
    source: "images" or "pseudo". One colour scale (vmax, colour bar) for every panel, and the
    caller passes the same one to the pseudo-input and the images figures."""
    first = next(iter(analyses.values()))["at_init"]
    depth, heads = first.distance_images.shape
    blocks = shown_blocks(depth)
    full = (first.profile_images.shape[-2] - 1) // 2
    radius = shown_radius(first.profile_images.shape)
    crop = slice(full - radius, full + radius + 1)
    profiles = {(init, s): getattr(a[s], f"profile_{source}").numpy()[..., crop, crop]
                for init, a in analyses.items() for s in STATES}
    rows, cols = len(profiles), len(blocks) * heads
    fig, axes = plt.subplots(rows, cols, figsize=(0.95 * cols + 1.6, 0.95 * rows + 0.9), squeeze=False)
    for r, ((init, state), prof) in enumerate(profiles.items()):
        offsets = analyses[init][state].offsets
        for b_i, b in enumerate(blocks):
            for h in range(heads):
                ax = axes[r, b_i * heads + h]
                im = ax.imshow(prof[b, h], cmap="magma", vmin=0, vmax=vmax, interpolation="nearest")
                ax.plot(radius, radius, "+", color="cyan", ms=5, mew=0.9)
                if offsets is not None:
                    _outline(ax, *offsets[b][h], radius)
                ax.set_xticks([])
                ax.set_yticks([])
                if r == 0:
                    ax.set_title(f"block {b + 1}\nhead {h + 1}", fontsize=7)
        axes[r, 0].set_ylabel(f"{init_label(init)}\n{STATES[state]}", fontsize=7, rotation=0,
                              ha="right", va="center", color=init_color(init))
    fig.suptitle(title, fontsize=9)
    fig.colorbar(im, ax=axes, shrink=0.5, pad=0.01, label="mean attention on the key at that offset")
    return fig


def kernel_grids(analyses: dict, kernel_of: dict):
    """Each impulse head's k x k window around its query, as numbers: the assigned impulse
    (the target), the attention at init on the pseudo-input and on the images, and trained on
    the images. One band of four rows per structured-init cell; columns = first/middle/last
    block x every head. analyses: impulse init -> {"at_init", "trained"} (one seed); kernel_of:
    init -> k."""
    rows_spec = [("target", None, None), ("pseudo-input,\nat init", "at_init", "pseudo"),
                 ("test images,\nat init", "at_init", "images"), ("test images,\ntrained", "trained", "images")]
    columns = {init: [(b, h) for b in shown_blocks(a["at_init"].distance_images.shape[0])
                      for h in range(a["at_init"].distance_images.shape[1])]
               for init, a in analyses.items()}
    cols = max(len(c) for c in columns.values())
    rows = len(rows_spec) * len(analyses)
    size = max(kernel_of.values())
    fig, axes = plt.subplots(rows, cols, figsize=(0.34 * size * cols + 1.6, 0.34 * size * rows + 0.8),
                             squeeze=False)
    for band, (init, a) in enumerate(analyses.items()):
        k = kernel_of[init]
        radius = (a["at_init"].profile_images.shape[-2] - 1) // 2
        lo, hi = radius - k // 2, radius + k // 2 + 1
        # one colour scale for the band's measured rows, so the drop from the pseudo-input to
        # real images shows in colour as well as in the numbers
        band_max = max(float(getattr(a[st], f"profile_{src}")[..., lo:hi, lo:hi].max())
                       for _, st, src in rows_spec[1:])
        for c in range(cols):
            for r in range(len(rows_spec)):
                axes[band * len(rows_spec) + r, c].axis("off")
        for c, (b, h) in enumerate(columns[init]):
            m0, n0 = a["at_init"].offsets[b][h]
            for r, (name, state, source) in enumerate(rows_spec):
                ax = axes[band * len(rows_spec) + r, c]
                ax.axis("on")
                if state is None:
                    window = np.zeros((k, k))
                    window[m0 + k // 2, n0 + k // 2] = 1.0
                else:
                    window = getattr(a[state], f"profile_{source}").numpy()[b, h, lo:hi, lo:hi]
                top = 1.0 if state is None else band_max
                ax.imshow(window, cmap="Blues", vmin=0, vmax=top)
                for (i, j), v in np.ndenumerate(window):
                    ax.text(j, i, "1" if v >= 0.995 else f"{v:.2f}"[1:], ha="center", va="center",
                            fontsize=6 if k > 3 else 7, color="black" if v < 0.6 * top else "white")
                _outline(ax, m0, n0, k // 2, color="red")
                ax.set_xticks([])
                ax.set_yticks([])
                if r == 0:
                    ax.set_title(f"block {b + 1} head {h + 1}", fontsize=7)
                if c == 0:
                    ax.set_ylabel(f"{init_label(init)}\n{name}" if r == 0 else name, fontsize=7,
                                  rotation=0, ha="right", va="center",
                                  color=init_color(init) if r == 0 else "black")
    fig.suptitle("Structured init: each head's k×k window of attention by offset (red: the head's "
                 "impulse offset; numbers: mean attention, .xx;\none colour scale per initializer "
                 "for the three measured rows)", fontsize=9)
    return fig


def distance_plot(distances: dict, uniform: float, depth: int):
    """Mean attention distance per block, on the test images and on the pseudo-input.
    distances: init -> {(state, source): array (seeds, L)} (mean over heads)."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    x = np.arange(1, depth + 1)
    for ax, source, name in zip(axes, ("images", "pseudo"), ("test images", "pseudo-input")):
        for i, (init, d) in enumerate(distances.items()):
            shift = (i - (len(distances) - 1) / 2) * 0.06   # keep error bars apart
            for state, style in (("at_init", "--"), ("trained", "-")):
                v = d[(state, source)]
                ax.errorbar(x + shift, v.mean(0), yerr=v.std(0, ddof=1) if len(v) > 1 else None,
                            color=init_color(init), ls=style, marker="o" if state == "trained" else "",
                            ms=3.5, lw=1.3, capsize=2,
                            label=f"{init_label(init)} {STATES[state]}")
        ax.axhline(uniform, color="black", lw=0.8, ls=":", label="uniform attention")
        ax.set_xticks(x)
        ax.set_xlabel("block")
        ax.set_title(f"on the {name}")
    n = len(next(iter(distances.values()))[("trained", "images")])
    axes[0].set_ylabel("mean attention distance (patches)")
    axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=7)
    fig.suptitle(f"Mean attention distance per block (mean over heads; error bars: std over {n} seeds; "
                 "dashed = at init, solid = trained)", fontsize=9, y=1.03)
    return fig
