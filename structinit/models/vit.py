"""The paper's ViT, built by timm (never forked).

No class token, global average pooling with LayerNorm *after* pooling (timm's `fc_norm`),
qkv bias, and a fixed (non-trained) 2-D sin-cos positional encoding with no class slot.

The library also takes other timm ViTs (class token, register tokens, a learned encoding):
`check_vit` and `check_structured_vit` say what each initializer needs, docs/library.md
("Which timm ViTs") what the structured init does with the prefix tokens.
"""
from __future__ import annotations

import torch

# timm is imported where a model is built or checked, not here: importing it costs seconds
# (every timm model registers itself), and the stages that only solve Q/K or read results need
# this module's geometry (the patch grid, the sin-cos encoding) without a model.

# create_vit's arguments for the paper's ViT-T/2 on 32x32 images (method page, section 5).
VIT_T2_CIFAR = dict(img_size=32, patch_size=2, embed_dim=192, depth=12, num_heads=3)


def sincos_position_encoding(patch_grid: tuple[int, int], embed_dim: int) -> torch.Tensor:
    """Fixed 2-D sin-cos encoding, (H*W, C), token t(i, j) = i*W + j: the channels are
    [sin(i f), sin(j f), cos(i f), cos(j f)] over C/4 frequencies f_k = 10000^(-k/(C/4)).

    It is timm's `build_sincos2d_pos_embed` at its defaults, computed by the same float32
    operations so the bits are equal (tests/test_models.py compares them), without importing timm.
    """
    if embed_dim % 4:
        raise ValueError(f"embed_dim={embed_dim}: a 2-D sin-cos encoding needs a multiple of 4")
    n = embed_dim // 4
    freqs = 1.0 / (10000.0 ** (torch.arange(n, dtype=torch.int64).to(torch.float32) / n))
    rows, cols = (torch.arange(s, dtype=torch.int64).to(torch.float32) for s in patch_grid)
    grid = torch.stack(torch.meshgrid(rows, cols, indexing="ij")).flatten(1).transpose(0, 1)  # (HW, 2): (i, j)
    angles = grid.unsqueeze(-1) * freqs.unsqueeze(0)                                          # (HW, 2, n)
    return torch.stack([torch.sin(angles), torch.cos(angles)], dim=1).flatten(1)


def create_vit(
    img_size: int,
    patch_size: int,
    embed_dim: int,
    depth: int,
    num_heads: int,
    num_classes: int,
    in_chans: int = 3,
    mlp_ratio: float = 4.0,
) -> VisionTransformer:
    """A timm VisionTransformer in the paper's configuration, with timm's default init.

    Call `structinit.initialize(model, method)` afterwards to pick an initializer.
    """
    if img_size % patch_size:
        raise ValueError(f"img_size={img_size} is not divisible by patch_size={patch_size}")
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}")
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(
        img_size=img_size, patch_size=patch_size, in_chans=in_chans, num_classes=num_classes,
        embed_dim=embed_dim, depth=depth, num_heads=num_heads, mlp_ratio=mlp_ratio,
        qkv_bias=True, class_token=False, no_embed_class=True, global_pool="avg",
        fc_norm=True, pos_embed="learn",
    )
    reset_position_encoding(model)
    return model


def patch_grid_of(model: VisionTransformer) -> tuple[int, int]:
    """(H, W) of the model's patch grid."""
    return tuple(model.patch_embed.grid_size)


def prefix_token_parameters(model: VisionTransformer) -> dict[str, torch.nn.Parameter]:
    """The model's learned prefix tokens by name: `cls_token`, `reg_token` (register tokens),
    `dist_token` (DeiT's distillation token); empty for the paper's ViT."""
    return {name: p for name, p in model.named_parameters(recurse=False) if name.endswith("_token")}


def patch_position_slots(model: VisionTransformer) -> torch.Tensor:
    """The part of `pos_embed` that holds the patch grid's positions, (1, N, C), a view.

    timm either keeps no slot for the prefix tokens (no_embed_class=True, the paper's ViT and
    DeiT-3) or puts one slot per prefix token in front of the patch slots (its default)."""
    skip = 0 if model.no_embed_class else model.num_prefix_tokens
    return model.pos_embed[:, skip:]


def is_sincos_position_encoding(model: VisionTransformer) -> bool:
    """Whether `pos_embed` holds exactly what `write_sincos_position_encoding` writes (False for
    a model that cannot hold it: a width not a multiple of 4, or not one slot per patch)."""
    if model.pos_embed is None or model.embed_dim % 4 \
            or patch_position_slots(model).shape[1] != model.patch_embed.num_patches:
        return False
    pe = sincos_position_encoding(patch_grid_of(model), model.embed_dim).unsqueeze(0).to(model.pos_embed)
    prefix = model.pos_embed[:, :model.pos_embed.shape[1] - pe.shape[1]]
    return bool(torch.equal(patch_position_slots(model), pe) and not prefix.any())


def position_tokens(model: VisionTransformer) -> torch.Tensor:
    """(1, P + N, C): the tokens the first block receives when every patch embeds to zero:
    the P prefix tokens, then the patch grid's position encoding (norm_pre applied, if the
    model has one). The pseudo-input `attention_maps` shows each block, prefix tokens included.

    timm's own `_pos_embed` assembles them, so every layout (class/register/distillation
    tokens, with or without their own encoding slots) comes out as the model's forward builds
    it; eval mode switches off the position dropout.
    """
    H, W = patch_grid_of(model)
    zeros = torch.zeros(1, H, W, model.embed_dim, dtype=model.pos_embed.dtype, device=model.pos_embed.device)
    was_training = model.training
    try:
        model.eval()
        x = model._pos_embed(zeros if model.dynamic_img_size else zeros.flatten(1, 2))
        return model.norm_pre(x)
    finally:
        model.train(was_training)


def write_sincos_position_encoding(model: VisionTransformer) -> None:
    """Write the fixed sin-cos encoding into `pos_embed`'s patch slots and zeros into its
    prefix-token slots (when it has any); whether it trains (requires_grad) is left alone.

    Zero prefix slots leave a prefix token as the token itself: the sin-cos encoding gives a
    position only to the grid, and the structured init solves on the grid alone.
    """
    check_sincos_slots(model)
    pe = sincos_position_encoding(patch_grid_of(model), model.embed_dim)  # (N, C)
    with torch.no_grad():
        model.pos_embed.zero_()
        patch_position_slots(model).copy_(pe.unsqueeze(0).to(model.pos_embed))


def reset_position_encoding(model: VisionTransformer) -> None:
    """Write the fixed sin-cos encoding into `pos_embed` and freeze it: the paper's ViT
    (`create_vit`). `initialize` never changes whether an encoding trains."""
    write_sincos_position_encoding(model)
    model.pos_embed.requires_grad_(False)


def check_vit(model) -> None:
    """Raise a clear error for a model no initializer can handle: every initializer here writes
    each block's fused qkv projection (rows [q | k | v]), as timm's Block/Attention have it."""
    # a model built by timm has imported timm already: this import costs nothing then
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer):
        raise TypeError(f"expected a timm VisionTransformer, got {type(model).__name__}: build one "
                        "with timm.create_model('vit_...') or structinit.create_vit")
    C = model.embed_dim
    for i, block in enumerate(model.blocks):
        attn = getattr(block, "attn", None)
        qkv = getattr(attn, "qkv", None)
        if not isinstance(qkv, torch.nn.Linear) or tuple(qkv.weight.shape) != (3 * C, C):
            raise ValueError(
                f"block {i} ({type(block).__name__}) has no fused qkv Linear of shape ({3 * C}, {C}) "
                "at block.attn.qkv: the initializers need timm's Block with its Attention "
                "(block_fn=Block), not a parallel or separate-q/k/v block")


def check_sincos_slots(model) -> None:
    """Raise a clear error for a model that cannot hold the 2-D sin-cos encoding."""
    check_vit(model)
    if model.pos_embed is None:
        raise ValueError("model has no pos_embed (pos_embed='none'): the sin-cos encoding, which "
                         "the structured init solves against, goes into an absolute position "
                         "embedding on the patch grid; build the model with pos_embed='learn'")
    N = model.patch_embed.num_patches
    expected = N if model.no_embed_class else N + model.num_prefix_tokens
    if model.pos_embed.shape[1] != expected:
        raise ValueError(f"pos_embed has {model.pos_embed.shape[1]} slots; expected {expected} "
                         f"({N} patches, {model.num_prefix_tokens} prefix token(s), "
                         f"no_embed_class={model.no_embed_class})")
    if model.embed_dim % 4:
        raise ValueError(f"embed_dim={model.embed_dim}: a 2-D sin-cos encoding needs a multiple of 4")


def check_structured_vit(model) -> None:
    """Raise a clear error for a model the structured init cannot handle (check_vit, and the
    assumptions of the solve: docs/library.md, "Which timm ViTs")."""
    check_sincos_slots(model)
    for i, block in enumerate(model.blocks):
        attn = block.attn
        if not isinstance(getattr(block, "norm1", None), torch.nn.LayerNorm):
            raise ValueError(f"block {i}: norm1 is {type(getattr(block, 'norm1', None)).__name__}; the "
                             "pseudo-input is layer-normalized, so the structured init needs LayerNorm blocks")
        if any(not isinstance(getattr(attn, name, torch.nn.Identity()), torch.nn.Identity)
               for name in ("q_norm", "k_norm")):
            raise ValueError(f"block {i}: qk_norm=True; the structured init solves for plain q.k "
                             "logits, so it needs qk_norm=False")
        head_dim = model.embed_dim // attn.num_heads
        if getattr(attn, "scale", head_dim ** -0.5) != head_dim ** -0.5:
            raise ValueError(f"block {i}: attention scale {attn.scale}; the solve assumes "
                             f"head_dim ** -0.5 = {head_dim ** -0.5}")
