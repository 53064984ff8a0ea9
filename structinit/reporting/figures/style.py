"""What every figure shares: the Agg backend, the look, and PNG bytes that
depend only on what is drawn (no timestamp or version in the file), so a re-run writes the
same file and DVC sees no change."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")                        # headless: stages run without a display
import matplotlib.pyplot as plt  # noqa: E402

from structinit.io import write_atomic  # noqa: E402

DPI = 110

plt.rcParams.update({"font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9,
                     "legend.fontsize": 8, "figure.dpi": DPI, "savefig.dpi": DPI,
                     "axes.spines.top": False, "axes.spines.right": False})


def save_figure(fig, path: str | Path) -> None:
    """Write `fig` as a PNG (atomically) and close it. metadata Software=None drops the
    matplotlib version from the file: the bytes are a function of the drawing alone."""
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", metadata={"Software": None},
                                               bbox_inches="tight"))
    plt.close(fig)


def write_per_dataset(frame, draw, out_dir: str | Path) -> list[Path]:
    """<out_dir>/<dataset>.png = draw(frame, dataset) for every dataset of the frame (in order);
    PNGs of datasets no longer in it are removed (a shrunk grid leaves no stale figure).
    Returns the paths written."""
    out_dir = Path(out_dir)
    datasets = list(dict.fromkeys(frame.dataset))
    paths = [out_dir / f"{d}.png" for d in datasets]
    for d, path in zip(datasets, paths):
        save_figure(draw(frame, d), path)
    for stale in set(out_dir.glob("*.png")) - set(paths):
        stale.unlink()
    return paths
