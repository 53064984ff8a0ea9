"""Beyond the paper: Mimetic's Q/K alone, V/proj left at timm's default (the confound arm: the
structured init touches only Q/K). Same Q/K as "mimetic" at the same seed (init/mimetic.py)."""
from structinit.init.baselines import trunc_normal
from structinit.init.mimetic import mimetic
from structinit.init.registry import register_initializer


@register_initializer("mimetic_qk", options=("alpha", "beta"))
def _mimetic_qk(model, *, seed, generator, **options):
    trunc_normal(model)
    mimetic(model, generator, value_proj=False, **options)
