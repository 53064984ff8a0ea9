"""How the reports show each initializer: its label and colour. The one place the reports read;
nothing that trains imports it, so editing a label or a colour retrains nothing.

An initializer without an entry is shown by its own name, in a colour picked from its name
(stable across runs), so a newly registered initializer (init/registry.py) appears in every
table and figure without an entry here. The paper's numbers for an initializer are keyed by
the same name in reporting/paper.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from structinit.pipeline.cells import impulse_kernel


@dataclass(frozen=True)
class Shown:
    label: str
    color: str


SHOWN = {
    "kaiming_uniform": Shown("Kaiming Uniform", "#7f7f7f"),
    "trunc_normal": Shown("Trunc Normal", "#1f77b4"),
    "mimetic": Shown("Mimetic", "#2ca02c"),
    "mimetic_qk": Shown("Mimetic Q/K only", "#98df8a"),      # beyond the paper: the confound arm
    "impulse3": Shown("Imp.-3", "#d62728"),
    "impulse5": Shown("Imp.-5", "#ff7f0e"),
    "impulse7": Shown("Imp.-7", "#9467bd"),
}
_FALLBACK_COLORS = ["#8c564b", "#e377c2", "#bcbd22", "#17becf"]


def init_label(init: str) -> str:
    """How the reports name an initializer: "Trunc Normal", "Imp.-3" (any other name as it is)."""
    if init in SHOWN:
        return SHOWN[init].label
    kernel = impulse_kernel(init)
    return f"Imp.-{kernel}" if kernel is not None else init


def init_color(init: str) -> str:
    if init in SHOWN:
        return SHOWN[init].color
    return _FALLBACK_COLORS[sum(map(ord, init)) % len(_FALLBACK_COLORS)]   # stable across runs (no hash())
