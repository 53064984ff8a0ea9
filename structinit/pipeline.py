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


def load_impulse_solution(path, remake_hint: str):
    """A preoptimize artifact (checked file) -> ImpulseSolution; CorruptFileError if it is not one."""
    from .init import ImpulseSolution
    from .io import CorruptFileError, load_checked

    solution = load_checked(path, remake_hint)
    try:
        return ImpulseSolution.from_dict(solution)
    except (TypeError, KeyError, AttributeError) as e:
        raise CorruptFileError(f"{path} is not a pre-optimization artifact ({e})") from None


def initialized_vit(model_cfg: dict, spec: DatasetSpec, init: str, seed: int, **options):
    """A ViT of the recipe's shape, initialized by `init` for `seed`, exactly as a training stage
    starts it: (model, InitRecord). The analysis stages call this to rebuild a cell's model at
    initialization (only the trained weights are kept as outputs)."""
    from .init import initialize

    model = build_model(model_cfg, spec)
    return model, initialize(model, init, seed=seed, **options)
