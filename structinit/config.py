"""Option names and option types, importable without torch: the structured init's, the
ConvMixer study's, and the RandAugment policy string of a training recipe.

params.yaml's schema (pipeline/params.py) checks a file against these, and the modules that
act on them import them from here: ConvMixer filter modes, pseudo-inputs, offset orders,
solvers, the structured init's solve options. (The training recipe is training/config.py;
initializer names are init/methods/'s files.)
"""
from __future__ import annotations

import re
from dataclasses import dataclass

FILTER_MODES = ("learned", "random", "impulse", "box")                # ConvMixer spatial filters
PSEUDO_INPUTS = ("P", "U", "G", "A", "B")         # P sin-cos PE, U uniform, G gaussian, A=P+U, B=P+G
OFFSET_ORDERS = ("random", "fixed")               # how heads get their (m, n) offsets
SOLVER_NAMES = ("adam", "closed_form")            # keys of init/solvers.py's SOLVERS
# solve_impulse_qk's options that params.yaml's `solve` section sets (beside one sub-section
# per solver): the schema, the stages and initialize() all take the names from here
IMPULSE_SOLVE_OPTIONS = ("solver", "offset_order", "pseudo_input", "pseudo_input_rest", "per_layer")


def patch_grid_for(image_size: int, patch_size: int) -> tuple[int, int]:
    """(H, W) of the patch grid of a square image (models.vit.patch_grid_of reads a built model's)."""
    return image_size // patch_size, image_size // patch_size


def check_kernel(kernel: int, patch_grid: tuple[int, int]) -> None:
    """The impulse filter's size must be odd and fit the patch grid (ValueError otherwise)."""
    if not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"kernel={kernel!r}: the impulse filter needs an odd size >= 1 (3, 5, 7, ...)")
    side = min(patch_grid)
    if kernel > side:
        raise ValueError(f"kernel={kernel} is larger than the {patch_grid[0]}x{patch_grid[1]} patch grid; "
                         f"allowed: odd sizes up to {side - (1 - side % 2)}")


@dataclass(frozen=True)
class RandAugmentPolicy:
    magnitude: float = 9.0
    magnitude_std: float = 0.5
    num_layers: int = 2
    prob: float = 0.5
    increasing: bool = True

    @classmethod
    def parse(cls, spec: str) -> "RandAugmentPolicy":
        """timm's config string, e.g. "rand-m9-mstd0.5-inc1" (keys m, mstd, n, p, inc)."""
        parts = spec.split("-")
        if parts[0] != "rand":
            raise ValueError(f"randaugment={spec!r}: must start with 'rand', e.g. 'rand-m9-mstd0.5-inc1'")
        kw = {}
        names = {"m": "magnitude", "mstd": "magnitude_std", "n": "num_layers", "p": "prob", "inc": "increasing"}
        for part in parts[1:]:
            match = re.fullmatch(r"([a-z]+)([\d.]+)", part)
            if not match or match[1] not in names:
                raise ValueError(f"randaugment={spec!r}: unknown part {part!r}; known keys: {list(names)}")
            key, val = names[match[1]], float(match[2])
            kw[key] = int(val) if key == "num_layers" else bool(val) if key == "increasing" else val
        if not kw.get("increasing", False):
            raise ValueError(f"randaugment={spec!r}: only the increasing op set (inc1) is implemented")
        return cls(**kw)
