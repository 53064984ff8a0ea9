"""The structured init, and `initialize(model, method, **options)`: one entry point for every
initializer, each in its own file methods/<name>.py (the one place to add one):

    trunc_normal     timm's default                                   (baselines.py)
    kaiming_uniform  PyTorch's module defaults                        (baselines.py)
    mimetic          Trockman & Kolter 2023                           (mimetic.py)
    impulse          the structured init of the paper                 (impulse.py, solvers.py)

The same seed gives the same weights on every device, and the caller's RNG is left as it was
(initialize draws from a CPU generator it seeds inside a fork). The model's position encoding
and its prefix tokens (class, register) are initialize's own business: see `initialize`.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import asdict, dataclass
from itertools import chain

import torch

from structinit.init.impulse import (ImpulseSolution, apply_impulse_solution, impulse_attention_target,
                                     kernel_offset, make_pseudo_input, solve_impulse_qk)
from structinit.init.baselines import kaiming_uniform, trunc_normal
from structinit.init.mimetic import mimetic
from structinit.init.registry import (INITIALIZERS, METHODS, Initializer, allowed_options, get_initializer,
                                      register_initializer)
from structinit.models.vit import (check_sincos_slots, check_structured_vit, check_vit, is_sincos_position_encoding,
                                   prefix_token_parameters, write_sincos_position_encoding)

# Initializers whose Q/K are solved against the fixed 2-D sin-cos encoding: by default
# initialize writes that encoding into the model for them (pos_embed=None below), and checks
# the model against the solve's assumptions (check_structured_vit) before any weight is set.
# A registered initializer that solves against the encoding the same way adds its name here.
SINCOS_SOLVED: set[str] = {"impulse"}

# What `initialize(..., pos_embed=...)` accepts besides None (each method's default).
POS_EMBED_CHOICES = ("keep", "sincos")

# timm's init of a prefix token (VisionTransformer.init_weights): N(0, 1e-6^2).
PREFIX_TOKEN_STD = 1e-6


@dataclass
class InitRecord:
    """What `initialize` did. offsets[l][h] = (m, n) of head h in block l (impulse only).

    pos_embed, when set, says initialize's choice changed or contradicts the model's encoding:
    "sincos_written" (it wrote the fixed sin-cos encoding over a different one) or
    "kept_not_sincos" (pos_embed="keep" left an encoding that is not the sin-cos the
    structured init was solved against). prefix_tokens: how many prefix tokens (class,
    register, distillation) the model has, each drawn N(0, 1e-6^2) from the seed.
    """
    method: str
    seed: int
    options: dict
    offsets: list | None = None
    solve_seconds: float = 0.0
    fit_mse: float | None = None       # the solve's fit on the pseudo-input (ImpulseSolution)
    target_mass: float | None = None
    solver_info: dict | None = None
    pos_embed: str | None = None
    prefix_tokens: int = 0

    def to_dict(self) -> dict:
        """The record as a dict. pos_embed and prefix_tokens appear only when set: the paper's
        ViT (sin-cos encoding, no prefix tokens) keeps the record it always had, so the
        pipeline's init.json files do not change."""
        d = asdict(self)
        for key in ("pos_embed", "prefix_tokens"):
            if not d[key]:
                del d[key]
        return d


def initialize(model, method: str, *, seed: int = 0, pos_embed: str | None = None,
               **options) -> InitRecord:
    """Initialize a timm VisionTransformer in place with the registered initializer `method`
    (init/registry.py); returns what was done.

    Every module first gets PyTorch's default, then the initializer runs; all of it draws from
    a CPU generator seeded by `seed` (the model is moved to the CPU for it and back, so a GPU
    model gets the CPU model's weights and the caller's CUDA RNG is never drawn from).

    pos_embed, the model's position encoding:
      None      the method's default: "sincos" for the structured init (SINCOS_SOLVED), which
                is solved against it; "keep" for every other initializer
      "keep"    left exactly as it was, values and trainability (restored after the
                initializer, so no re-init inside it can change it)
      "sincos"  the fixed 2-D sin-cos encoding is written into the patch slots, zeros into any
                prefix-token slots; whether it trains is left as it was
    When the default "sincos" writes over a different encoding (e.g. timm's learned one) it
    warns and sets record.pos_embed; an explicit choice does not warn.
    Prefix tokens (class, register, distillation) are drawn N(0, 1e-6^2) from the seed, as
    timm initializes them; the structured init solves on the patch grid alone and gives them
    no target (docs/library.md, "Which timm ViTs").
    """
    init = get_initializer(method)
    allowed = allowed_options(init, options)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for method {method!r}; allowed: {list(allowed)}")
    if pos_embed is not None and pos_embed not in POS_EMBED_CHOICES:
        raise ValueError(f"pos_embed={pos_embed!r}: choose one of {POS_EMBED_CHOICES}, or None for "
                         f"the method's default ('sincos' for {sorted(SINCOS_SOLVED)}, else 'keep')")
    solved_on_sincos = method in SINCOS_SOLVED
    choice = pos_embed or ("sincos" if solved_on_sincos else "keep")
    if solved_on_sincos:
        check_structured_vit(model)
    elif choice == "sincos":
        check_sincos_slots(model)
    else:
        check_vit(model)
    if init.check is not None:
        init.check(model, **options)
    record = InitRecord(method=method, seed=seed, options={k: v for k, v in options.items() if k != "solution"})
    prefix = prefix_token_parameters(model)
    with _untouched_rng(), _on_cpu(model), torch.no_grad():     # weights are set, not trained
        encoding = None if model.pos_embed is None else model.pos_embed.detach().clone()
        was_sincos = encoding is not None and is_sincos_position_encoding(model)
        torch.default_generator.manual_seed(seed)   # the CPU generator only (see _untouched_rng)
        gen = torch.Generator().manual_seed(seed)
        # Every module gets PyTorch's default first, so that no weight (e.g. the patch
        # embedding, which timm leaves at PyTorch's default) depends on the global RNG.
        kaiming_uniform(model)
        facts = init.apply(model, seed=seed, generator=gen, **options)
        # Prefix tokens last, from the same generator: every other weight is then the same as
        # in the same model without them at the same seed.
        for p in prefix.values():
            p.copy_(torch.randn(p.shape, generator=gen) * PREFIX_TOKEN_STD)
        if encoding is not None:
            if choice == "sincos":
                write_sincos_position_encoding(model)
            else:
                model.pos_embed.copy_(encoding)
    for key, value in (facts or {}).items():
        setattr(record, key, value)
    record.prefix_tokens = model.num_prefix_tokens
    if choice == "sincos" and not was_sincos:
        record.pos_embed = "sincos_written"
        if pos_embed is None:
            warnings.warn(
                f"initialize(model, {method!r}) wrote the fixed 2-D sin-cos position encoding into "
                "pos_embed over the model's own encoding (the structured init is solved against "
                "it); whether pos_embed trains is unchanged (requires_grad="
                f"{model.pos_embed.requires_grad}). Pass pos_embed='keep' to leave the model's "
                "encoding as it is, or pos_embed='sincos' to choose this without the warning.",
                UserWarning, stacklevel=2)
    elif choice == "keep" and solved_on_sincos and not was_sincos:
        record.pos_embed = "kept_not_sincos"
    return record


@contextlib.contextmanager
def _untouched_rng():
    """Fork the caller's RNG: the CPU generator, and every CUDA device's that is already set up.

    torch.manual_seed would also reseed every CUDA device (and queue the seed for one not yet
    initialized), resetting the caller's CUDA stream; initialize seeds the CPU generator alone
    and draws nothing on a device (_on_cpu), so the fork of the CUDA states only guards
    against an initializer that does. A device not yet initialized is not forked: reading its
    state would initialize CUDA.
    """
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda, device_type="cuda"):
        yield


@contextlib.contextmanager
def _on_cpu(model):
    """Run the body with the model's parameters and buffers on the CPU, then put each back on
    its own device. In-place `.data` moves keep every Parameter the same object, so an
    optimizer built on the model stays valid. A model already on the CPU is not touched."""
    tensors = list(chain(model.parameters(), model.buffers()))
    homes = [t.device for t in tensors]
    if all(d.type == "cpu" for d in homes):
        yield
        return
    for t in tensors:
        t.data = t.data.cpu()
    try:
        yield
    finally:
        for t, home in zip(tensors, homes):
            t.data = t.data.to(home)


__all__ = ["METHODS", "INITIALIZERS", "Initializer", "InitRecord", "initialize", "register_initializer",
           "SINCOS_SOLVED", "POS_EMBED_CHOICES",
           "ImpulseSolution", "solve_impulse_qk",
           "apply_impulse_solution", "impulse_attention_target", "kernel_offset",
           "make_pseudo_input", "trunc_normal", "kaiming_uniform", "mimetic"]
