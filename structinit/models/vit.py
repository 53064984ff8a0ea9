"""The paper's ViT, built by timm (never forked).

No class token, global average pooling with LayerNorm *after* pooling (timm's `fc_norm`),
qkv bias, and a fixed (non-trained) 2-D sin-cos positional encoding with no class slot.
The structured init needs average pooling: with a class token, row 0 of every attention map
would belong to a token that has no grid position, so no impulse target exists for it.
"""
from __future__ import annotations

import torch
from timm.layers import build_sincos2d_pos_embed
from timm.models import VisionTransformer

# create_vit's arguments for the paper's ViT-T/2 on 32x32 images (method page, section 5).
VIT_T2_CIFAR = dict(img_size=32, patch_size=2, embed_dim=192, depth=12, num_heads=3)


def sincos_position_encoding(patch_grid: tuple[int, int], embed_dim: int) -> torch.Tensor:
    """Fixed 2-D sin-cos encoding, (H*W, C), token t(i, j) = i*W + j."""
    if embed_dim % 4:
        raise ValueError(f"embed_dim={embed_dim}: a 2-D sin-cos encoding needs a multiple of 4")
    return build_sincos2d_pos_embed(list(patch_grid), dim=embed_dim)


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


def reset_position_encoding(model: VisionTransformer) -> None:
    """Write the fixed sin-cos encoding into `pos_embed` and freeze it.

    Every initializer calls this last, so no re-init (timm's or PyTorch's) can leave a
    random or trainable encoding behind.
    """
    check_structured_vit(model)
    pe = sincos_position_encoding(patch_grid_of(model), model.embed_dim)  # (N, C)
    with torch.no_grad():
        model.pos_embed.copy_(pe.unsqueeze(0).to(model.pos_embed))
    model.pos_embed.requires_grad_(False)


def check_structured_vit(model) -> None:
    """Raise a clear error for a model the structured init cannot handle."""
    if not isinstance(model, VisionTransformer):
        raise TypeError(f"expected a timm VisionTransformer, got {type(model).__name__}")
    if model.cls_token is not None or model.num_prefix_tokens:
        raise ValueError(
            f"model has {model.num_prefix_tokens} prefix token(s) (class/register tokens); the "
            "structured init needs a model without them: class_token=False, global_pool='avg'")
    if model.pos_embed is None or model.pos_embed.shape[1] != model.patch_embed.num_patches:
        raise ValueError("model needs a pos_embed with one slot per patch (no_embed_class=True)")
