"""structinit: structured initialization of attention for Vision Transformers.

Where things are (one concern per folder):
    init/         THE STRUCTURED INIT and every other initializer, by name (initialize)
                    methods/     one file per initializer (trunc_normal.py, ..., impulse.py): the place to add one
                    registry.py  finds an initializer by name (loads methods/<name>.py on first use)
                    impulse.py   impulse targets, pseudo-inputs, the Q/K solve
                    solvers.py   the paper's Adam solver and the fast closed-form solver
    models/       create_vit (timm's VisionTransformer), ConvMixer filter modes
    data/         dataset specs, a dataset as one tensor on the device, batched augmentation,
                  ImageNet streaming
    training/     the recipe (TrainConfig), what both trainers share, the on-device stacked
                  trainer, the streamed trainer, DDP
    analysis/     attention maps, mean distance, CKA of a model
    reporting/    statistics, tables, figures, how each initializer is shown, the paper's numbers
    pipeline/     what the DVC stages share: params schema, cell names, a cell's model, verify
    evidence/     the frozen stages' evidence (epoch budget, replication, regime, softness law), its freshness
    config.py     the structured init's option names (torch-free, read by the params schema)
    io.py         atomic writes, checksummed files
    distributed.py  torchrun / DDP: one cell on several processes (training and data sharding)
    numerics.py   what a CPU computes with (bf16, threads): facts only, nothing is changed
    errors.py     StructinitError, the base of every error with a message meant for users

Outside the library: stages/ (one thin CLI per DVC stage), scale/ (fan-out over Ray).

The public names below are imported on first use (PEP 562), not at `import structinit`:
timm and torchvision take seconds to import, and stages that never build a model should not
pay for them. Importing structinit changes nothing in the process (no environment variable,
no thread count).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# public name -> the module that defines it (tests/test_dvc_deps.py reads this too: a lazy
# export is an import DVC must see)
LAZY_EXPORTS: dict[str, str] = {
    "AttentionMaps": "structinit.analysis.attention",
    "attention_maps": "structinit.analysis.attention",
    "ImageData": "structinit.data.tensors",
    "prepare_dataset": "structinit.data.tensors",
    "stratified_subset": "structinit.data.tensors",
    "DATASETS": "structinit.data.specs",
    "get_spec": "structinit.data.specs",
    "METHODS": "structinit.init",
    "ImpulseSolution": "structinit.init",
    "InitRecord": "structinit.init",
    "initialize": "structinit.init",
    "register_initializer": "structinit.init",
    "solve_impulse_qk": "structinit.init",
    "FILTER_MODES": "structinit.models.convmixer",
    "VIT_T2_CIFAR": "structinit.models.vit",
    "create_convmixer": "structinit.models.convmixer",
    "create_vit": "structinit.models.vit",
    "TrainConfig": "structinit.training.config",
    "default_device": "structinit.training.trainer",
    "train_model": "structinit.training.trainer",
    "train_models": "structinit.training.trainer",
}
_SUBPACKAGES = ("analysis", "config", "data", "distributed", "errors", "init", "io", "models", "numerics",
                "pipeline", "reporting", "training")
__all__ = list(LAZY_EXPORTS)


def __getattr__(name: str):
    if name in _SUBPACKAGES:                    # `structinit.training` without importing it first
        return importlib.import_module(f".{name}", __name__)
    if name not in LAZY_EXPORTS:
        raise AttributeError(f"module 'structinit' has no attribute {name!r}")
    value = getattr(importlib.import_module(LAZY_EXPORTS[name]), name)
    globals()[name] = value                     # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBPACKAGES))


if TYPE_CHECKING:                               # what type checkers and IDEs read
    from structinit.analysis.attention import AttentionMaps, attention_maps
    from structinit.data.specs import DATASETS, get_spec
    from structinit.data.tensors import ImageData, prepare_dataset, stratified_subset
    from structinit.init import (METHODS, ImpulseSolution, InitRecord, initialize, register_initializer,
                                 solve_impulse_qk)
    from structinit.models import FILTER_MODES, VIT_T2_CIFAR, create_convmixer, create_vit
    from structinit.training.config import TrainConfig
    from structinit.training.trainer import default_device
    from structinit.training.trainer import train_model, train_models
