"""timm's default ViT init (init/baselines.py)."""
from structinit.init.baselines import trunc_normal
from structinit.init.registry import register_initializer


@register_initializer("trunc_normal")
def _trunc_normal(model, *, seed, generator):
    trunc_normal(model)
