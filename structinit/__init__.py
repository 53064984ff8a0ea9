"""structinit: structured initialization of attention for Vision Transformers.

Where things are:
    structinit/init/impulse.py   the structured (impulse) init: targets, pseudo-inputs, Q/K
    structinit/init/solvers.py   the paper's Adam solver and the fast closed-form solver
    structinit/init/             initialize(model, method): every initializer by name
    structinit/models/           create_vit (timm ViT), ConvMixer filter modes
    structinit/attention.py      attention maps and mass on each head's offset
    structinit/analysis.py       a model's attention and representations (reports/attention.md)
    structinit/cka.py            linear CKA between layers of models
    structinit/cells.py          which cells params.yaml asks for, and their names
    structinit/build.py          a cell's model and init options from params.yaml
    structinit/datasets.py       dataset registry (digits, cifar10, cifar100, svhn, imagenet)
    structinit/data.py           a dataset as one uint8 tensor on the device (download, load)
    structinit/train.py          the trainer: several models of one cell at once (train_models)
    structinit/stacked.py        N models of one architecture run as one (torch.func.vmap)
    structinit/cpu_chunks.py     CPU: a batch as one single-threaded chunk per core
    structinit/steps.py          held optimizer steps for the data-size study
    structinit/curves.py         per-epoch curves of a grid's runs
    structinit/report.py         the comparison tables
    structinit/figures/          every figure in reports/ (matplotlib)

The names below are imported on first use (PEP 562), not at `import structinit`: timm and
torchvision take ~4 s to import, and the stages that never build a model (download,
aggregate, the study reports) should not pay for them on every `dvc repro`. The one list of
them is the TYPE_CHECKING block at the end (what type checkers and IDEs read); the lazy
loader reads the same block into LAZY_EXPORTS (public name -> the module that defines it),
which tests/test_dvc_deps.py also reads: a lazy export is an import DVC must see.
Submodules load the same way on attribute access (`structinit.train`).
"""
from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING


def _type_checking_imports() -> dict[str, str]:
    """name -> "structinit.module" of every `from .module import name` under `if TYPE_CHECKING:` below."""
    tree = ast.parse(Path(__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If)
                 and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
    return {alias.name: f"{__name__}.{node.module}" for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


LAZY_EXPORTS: dict[str, str] = _type_checking_imports()   # public name -> module defining it
_SUBMODULES = tuple(m.name for m in pkgutil.iter_modules(__path__))
__all__ = list(LAZY_EXPORTS)


def __getattr__(name: str):
    if name in _SUBMODULES:                     # `structinit.train` without importing it first
        return importlib.import_module(f".{name}", __name__)
    if name not in LAZY_EXPORTS:
        raise AttributeError(f"module 'structinit' has no attribute {name!r}")
    value = getattr(importlib.import_module(LAZY_EXPORTS[name]), name)
    globals()[name] = value                     # later lookups skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))


if TYPE_CHECKING:                               # the public names (read by _type_checking_imports)
    from .attention import AttentionMaps, attention_maps
    from .data import ImageData, prepare_dataset, stratified_subset
    from .datasets import DATASETS, get_spec
    from .init import METHODS, ImpulseSolution, InitRecord, initialize, solve_impulse_qk
    from .models import FILTER_MODES, VIT_T2_CIFAR, create_convmixer, create_vit
    from .train import TrainConfig, default_device, train_model, train_models
