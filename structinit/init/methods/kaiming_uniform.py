"""PyTorch's module defaults: what `initialize` has already given every module."""
from structinit.init.registry import register_initializer


@register_initializer("kaiming_uniform")
def _kaiming_uniform(model, *, seed, generator):
    pass
