"""The models: timm's ViT in the paper's configuration (vit.py) and timm's ConvMixer (convmixer.py).

Names are loaded on first use (PEP 562), so `import structinit.models.vit` for its geometry
does not import ConvMixer, and with it timm's whole model zoo."""
from __future__ import annotations

import importlib

# public name -> the module that defines it (tests/test_dvc_deps.py reads this literal: a stage
# that imports a name from here depends on its module)
LAZY_EXPORTS: dict[str, str] = {
    "VIT_T2_CIFAR": "structinit.models.vit",
    "create_vit": "structinit.models.vit",
    "patch_grid_of": "structinit.models.vit",
    "reset_position_encoding": "structinit.models.vit",
    "sincos_position_encoding": "structinit.models.vit",
    "FILTER_MODES": "structinit.models.convmixer",
    "create_convmixer": "structinit.models.convmixer",
    "set_spatial_filters": "structinit.models.convmixer",
}
__all__ = list(LAZY_EXPORTS)


def __getattr__(name: str):
    if name not in LAZY_EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(LAZY_EXPORTS[name]), name)


def __dir__():
    return sorted(__all__)
