"""Glue between params.yaml's plain dicts and the library (used by stages/)."""
from __future__ import annotations

from .data import DatasetSpec
from .models.vit import create_vit

IMPULSE_PARAM_KEYS = ("solver", "offsets", "pseudo_input", "pseudo_input_rest", "per_layer")


def model_grid(model_cfg: dict, spec: DatasetSpec) -> tuple[int, int]:
    side = spec.image_size // model_cfg["patch_size"]
    return side, side


def build_model(model_cfg: dict, spec: DatasetSpec):
    return create_vit(img_size=spec.image_size, in_chans=spec.channels,
                      num_classes=spec.num_classes, **model_cfg)


def impulse_options(init_params: dict) -> dict:
    """initialize()/solve_impulse_qk() options from params.yaml's `init` section."""
    opts = {k: init_params[k] for k in IMPULSE_PARAM_KEYS if init_params.get(k) is not None}
    solver = opts.get("solver", "closed_form")
    opts.update(init_params.get(solver) or {})   # e.g. init.adam: {steps: ..., lr: ...}
    return opts


def parse_pseudo_variant(variant: str) -> dict:
    """Pseudo-input ablation cell name -> impulse options.

    "<first><rest>[L]": pseudo-input of block 0, of the later blocks (P, U, G, A, B), and an
    optional "L" for a per-layer solve (default: one shared solve). "PP" is the main grid's
    structured init; "UPL" = U for block 0, P after, each block solved afresh.
    """
    from .init.impulse import PSEUDO_INPUTS

    per_layer = variant.endswith("L")
    core = variant[:-1] if per_layer else variant
    if len(core) != 2 or any(c not in PSEUDO_INPUTS for c in core):
        raise ValueError(f"pseudo-input variant {variant!r}: expected two of {PSEUDO_INPUTS} "
                         "(first block, later blocks) and an optional 'L' (per-layer solve), e.g. 'UP', 'PPL'")
    return {"pseudo_input": core[0], "pseudo_input_rest": core[1], "per_layer": per_layer}
