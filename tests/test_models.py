import pytest
import torch
from timm.models import VisionTransformer

import structinit as si
from structinit.training import trainer
from structinit.models.vit import sincos_position_encoding
from conftest import small_vit


def test_vit_is_timm_model_in_paper_configuration():
    m = si.create_vit(**si.VIT_T2_CIFAR, num_classes=10)
    assert isinstance(m, VisionTransformer)
    assert m.cls_token is None and m.num_prefix_tokens == 0
    assert m.global_pool == "avg"
    assert isinstance(m.fc_norm, torch.nn.LayerNorm) and isinstance(m.norm, torch.nn.Identity)
    assert m.patch_embed.grid_size == (16, 16) and m.embed_dim == 192 and len(m.blocks) == 12
    assert m.blocks[0].attn.num_heads == 3 and m.blocks[0].attn.qkv.bias is not None
    assert m.pos_embed.shape == (1, 256, 192)


@pytest.mark.parametrize("grid, dim", [((8, 8), 48), ((14, 14), 96), ((16, 16), 192), ((4, 7), 12), ((1, 1), 4)])
def test_sincos_encoding_has_timm_s_bits(grid, dim):
    """The library computes the encoding itself (no timm import for the stages that only solve);
    it must be timm's to the bit, or a model's pos_embed and the solve's pseudo-input differ."""
    from timm.layers import build_sincos2d_pos_embed

    ours = sincos_position_encoding(grid, dim)
    assert ours.dtype == torch.float32 and ours.shape == (grid[0] * grid[1], dim)
    assert torch.equal(ours, build_sincos2d_pos_embed(list(grid), dim=dim))


def test_geometry_imports_no_timm():
    """`structinit.models.vit`'s geometry (and the Q/K solve built on it) loads without timm: the
    preoptimize stage pays torch's import, not timm's model zoo."""
    import subprocess
    import sys

    code = ("import sys, structinit.models.vit, structinit.init.impulse, stages.preoptimize; "
            "print(sorted(m for m in sys.modules if m == 'timm' or m.startswith('timm.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_position_encoding_is_fixed_sincos_and_survives_every_init():
    m = small_vit()
    pe = sincos_position_encoding((8, 8), 48)
    assert not m.pos_embed.requires_grad
    for method in si.METHODS:
        si.initialize(m, method)
        assert torch.equal(m.pos_embed[0], pe), method
        assert not m.pos_embed.requires_grad
    assert all(p is not m.pos_embed for g in trainer.param_groups(m, 0.1) for p in g["params"])


def test_forward_shape_any_grid():
    m = si.create_vit(img_size=12, patch_size=2, embed_dim=32, depth=2, num_heads=4,
                      num_classes=7, in_chans=3)
    assert m(torch.randn(2, 3, 12, 12)).shape == (2, 7)


@pytest.mark.parametrize("kw,msg", [(dict(img_size=10, patch_size=3), "not divisible by patch_size"),
                                    (dict(embed_dim=50, num_heads=3), "not divisible by num_heads")])
def test_bad_shapes_raise(kw, msg):
    with pytest.raises(ValueError, match=msg):
        small_vit(**kw)


def test_the_public_names_of_the_previous_release_still_import():
    """Users' notebooks import these from `structinit`; the restructure moved modules, not names."""
    import subprocess
    import sys

    names = ["AttentionMaps", "attention_maps", "ImageData", "prepare_dataset", "stratified_subset", "DATASETS",
             "get_spec", "METHODS", "ImpulseSolution", "InitRecord", "initialize", "solve_impulse_qk",
             "FILTER_MODES", "VIT_T2_CIFAR", "create_convmixer", "create_vit", "TrainConfig", "default_device",
             "train_model", "train_models"]
    assert set(names) <= set(si.__all__)
    code = f"from structinit import {', '.join(names)}, register_initializer; assert 'impulse' in METHODS"
    subprocess.run([sys.executable, "-c", code], check=True)
