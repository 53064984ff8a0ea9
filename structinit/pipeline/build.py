"""A cell's model and structured-init options from params.yaml's plain dicts (stages/, benchmarks/)."""
from __future__ import annotations

from structinit.config import IMPULSE_SOLVE_OPTIONS
from structinit.data.specs import DatasetSpec
from structinit.models.vit import create_vit


def build_model(model_cfg: dict, spec: DatasetSpec):
    """A ViT of a recipe's shape (recipes.<dataset>.model) for the dataset, timm's default init."""
    return create_vit(img_size=spec.image_size, in_chans=spec.channels,
                      num_classes=spec.num_classes, **model_cfg)


def impulse_options(solve: dict) -> dict:
    """initialize()/solve_impulse_qk() options from params.yaml's `solve` section."""
    opts = {k: solve[k] for k in IMPULSE_SOLVE_OPTIONS if solve.get(k) is not None}
    solver = opts.get("solver", "closed_form")
    opts.update(solve.get(solver) or {})   # e.g. solve.adam: {steps: ..., lr: ...}
    return opts


def load_impulse_solution(path, remake_hint: str):
    """A preoptimize artifact (checked file) -> ImpulseSolution; CorruptFileError if it is not one."""
    from structinit.init import ImpulseSolution
    from structinit.io import CorruptFileError, load_checked

    solution = load_checked(path, remake_hint)
    try:
        return ImpulseSolution.from_dict(solution)
    except (TypeError, KeyError, AttributeError) as e:
        raise CorruptFileError(f"{path} is not a pre-optimization artifact ({e})") from None


def initialized_vit(model_cfg: dict, spec: DatasetSpec, init: str, seed: int, **options):
    """A ViT of the recipe's shape, initialized by `init` for `seed`, exactly as a training stage
    starts it: (model, InitRecord). The analysis stages call this to rebuild a cell's model at
    initialization (only the trained weights are kept as outputs)."""
    from structinit.init import initialize

    model = build_model(model_cfg, spec)
    return model, initialize(model, init, seed=seed, **options)
