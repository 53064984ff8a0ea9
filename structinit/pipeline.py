"""Glue between params.yaml's plain dicts and the library (used by stages/)."""
from __future__ import annotations

from .config import parse_pseudo_variant  # noqa: F401  (re-exported)
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
