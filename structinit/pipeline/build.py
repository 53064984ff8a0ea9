"""A cell's model, built and initialized exactly as its training stage starts it: the one
function that training and analysis both call (stages/train.py, stages/analyze.py), from
params.yaml's plain dicts. Benchmarks use build_model for a recipe's untouched ViT."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from structinit.config import IMPULSE_SOLVE_OPTIONS
from structinit.data.specs import DatasetSpec
from structinit.errors import StructinitError
from structinit.models.vit import create_vit
from structinit.pipeline.cells import IMPULSE, parse_init, parse_pseudo_variant, seed_dir, solve_stage, variant


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


@dataclass(frozen=True)
class CellModel:
    """What makes one cell's model (a stage's flags): a ViT with an initializer, or a ConvMixer
    with a filter mode."""
    dataset: str
    init: str | None = None            # a registered initializer or impulse<k> (ViT)
    solutions: str | Path | None = None  # impulse<k>: a preoptimize folder (seed<s>.pt); else solved here
    pseudo: str | None = None          # impulse<k>: a pseudo-input variant (the pseudo-input study)
    shape: str | None = None           # a key of params.yaml's model_shapes (the heads/width study)
    convmixer: str | None = None       # a key of params.yaml's convmixer_sizes
    filter_mode: str | None = None     # the ConvMixer's spatial filters


def build_cell_model(cell: CellModel, params: dict, spec: DatasetSpec, seed: int):
    """One seed's model of a cell, initialized, and its init record (the init.json the training
    stage writes and the analysis stage checks its rebuild against): (model, dict)."""
    if cell.convmixer:
        from structinit.models.convmixer import create_convmixer

        sizes = params["convmixer_sizes"]
        if cell.convmixer not in sizes:
            raise StructinitError(f"unknown ConvMixer size {cell.convmixer!r}; convmixer_sizes has {sorted(sizes)}")
        model = create_convmixer(**sizes[cell.convmixer], num_classes=spec.num_classes,
                                 in_chans=spec.channels, filter_mode=cell.filter_mode, seed=seed)
        return model, {"model": "convmixer", "size": sizes[cell.convmixer], "filter_mode": cell.filter_mode}
    from structinit.init import initialize

    method, kernel = parse_init(cell.init)
    own = variant(params, cell.init)       # grid.variants or studies.regime.arms: an initializer at other options
    if own is not None:
        method, kernel = own["init"], own["options"].get("kernel")
    model_cfg = dict(params["recipes"][cell.dataset]["model"])
    if cell.shape:
        shapes = params["model_shapes"]
        if cell.shape not in shapes:
            raise StructinitError(f"unknown model shape {cell.shape!r}; model_shapes has {sorted(shapes)}")
        model_cfg.update(shapes[cell.shape])
    options = {}
    if method == IMPULSE:
        if cell.solutions:
            options["solution"] = load_impulse_solution(
                seed_dir(cell.solutions, seed).with_suffix(".pt"), "a pre-optimization artifact: re-create "
                f"it with dvc repro -f {solve_stage(cell.dataset, kernel)}")
        else:
            options = {**impulse_options(params["solve"]), "kernel": kernel,
                       **(parse_pseudo_variant(cell.pseudo) if cell.pseudo else {})}
    if own is not None:                    # the variant's options over the defaults (impulse: over solve)
        options.update(own["options"])
    model = build_model(model_cfg, spec)
    record = initialize(model, method, seed=seed, **options)
    return model, {"model": "vit", **model_cfg, **record.to_dict()}
