"""Mimetic initialization (Trockman & Kolter 2023; the math: init/mimetic.py), on top of timm's
default."""
from structinit.init.baselines import trunc_normal
from structinit.init.mimetic import mimetic
from structinit.init.registry import register_initializer


@register_initializer("mimetic", options=("alpha", "beta", "alpha_v", "beta_v"))
def _mimetic(model, *, seed, generator, **options):
    trunc_normal(model)
    mimetic(model, generator, **options)
