import math

import pytest
import torch
from timm.models import VisionTransformer

import structinit as si
from structinit.init import solve_impulse_qk
from conftest import small_vit


def _qk(model, layer=0):
    attn = model.blocks[layer].attn
    C, r = model.embed_dim, attn.head_dim
    w = attn.qkv.weight.detach()
    return [(w[h * r:(h + 1) * r], w[C + h * r:C + (h + 1) * r]) for h in range(attn.num_heads)]


@pytest.mark.parametrize("kernel", [3, 5])
def test_impulse_layer0_mass_peaks_on_each_heads_offset(kernel):
    model = small_vit(depth=2, num_heads=4, embed_dim=64)
    rec = si.initialize(model, "impulse", kernel=kernel, seed=1)
    maps = si.attention_maps(model, offsets=rec.offsets)  # on the pseudo-input
    profile = maps.offset_mass()                          # (L, H, 15, 15)
    gh, gw = maps.patch_grid
    for h, (m, n) in enumerate(rec.offsets[0]):
        own = profile[0, h, m + gh - 1, n + gw - 1].item()
        others = profile[0, h].clone()
        others[m + gh - 1, n + gw - 1] = -1
        # "clearly more": the argmax by a 1.5x margin over the runner-up (neighbouring
        # offsets get the spill-over of a soft map), and far above uniform (1/64)
        assert own > 1.5 * others.max().item(), (h, (m, n), own, others.max().item())
        assert own > 5 / 64
    # the record's mass is the mass attention_maps measures, and the softness goal holds
    assert maps.target_mass()[0].mean().item() == pytest.approx(rec.target_mass, abs=0.02)
    # the official solver's softness on this shape (8x8, C=64: 0.148 measured, law 0.150)
    assert rec.target_mass == pytest.approx(0.148, abs=0.03)
    print(f"k={kernel}: layer-0 mass on target offsets {maps.target_mass()[0].tolist()}")


def test_impulse_on_vit_t2_reports_mass():
    model = si.create_vit(**si.VIT_T2_CIFAR, num_classes=10)
    rec = si.initialize(model, "impulse", kernel=3, seed=0)
    mass = si.attention_maps(model, offsets=rec.offsets).target_mass()
    assert mass.shape == (12, 3)
    assert mass.min().item() > 0.15            # uniform would be 1/256


def test_impulse_on_real_images_keeps_some_locality():
    """On real digits the patch embedding of a 1-pixel grayscale patch dominates the
    encoding, so locality is much weaker than on the pseudo-input, but still there."""
    data = si.prepare_dataset("digits")
    model = small_vit(depth=1)
    rec = si.initialize(model, "impulse", kernel=3, seed=0)
    x = (data.train_images[:64].float() / 255 - 0.3) / 0.38
    maps = si.attention_maps(model, x, offsets=rec.offsets)
    assert maps.target_mass()[0].mean().item() > 2 / 64           # uniform: 1 / 64


def test_same_seed_same_weights_different_seed_differs():
    a, b, c = small_vit(), small_vit(), small_vit()
    torch.manual_seed(123)  # the global RNG must not matter
    si.initialize(a, "impulse", seed=3)
    torch.rand(5)
    si.initialize(b, "impulse", seed=3)
    si.initialize(c, "impulse", seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["blocks.0.mlp.fc1.weight"], sc["blocks.0.mlp.fc1.weight"])


def test_shared_vs_per_layer_solve():
    shared = solve_impulse_qk((8, 8), 48, 3, 4, kernel=3, seed=0)
    assert shared.solver_info["solves"] == 1
    assert all(o == shared.offsets[0] for o in shared.offsets)
    assert torch.equal(shared.q[0], shared.q[3])
    per = solve_impulse_qk((8, 8), 48, 3, 4, kernel=5, seed=0, per_layer=True)
    assert per.solver_info["solves"] == 4
    assert len({tuple(o) for o in per.offsets}) > 1
    mixed = solve_impulse_qk((8, 8), 48, 3, 4, kernel=3, seed=0, pseudo_input="P",
                             pseudo_input_rest="U")
    assert mixed.solver_info["solves"] == 2 and torch.equal(mixed.q[1], mixed.q[3])
    assert not torch.equal(mixed.q[0], mixed.q[1])


def test_fixed_offset_order_and_solution_round_trip():
    sol = solve_impulse_qk((8, 8), 48, 3, 2, kernel=3, offset_order="fixed", seed=0)
    assert sol.offsets[0] == [(0, 0), (-1, 0), (0, 1)]        # centre, up, right
    again = si.ImpulseSolution.from_dict(sol.to_dict())
    a, b = small_vit(depth=2), small_vit(depth=2)
    si.initialize(a, "impulse", solution=sol)
    si.initialize(b, "impulse", solution=again)
    assert torch.equal(a.blocks[1].attn.qkv.weight, b.blocks[1].attn.qkv.weight)


@pytest.mark.parametrize("pseudo", ["P", "U", "G", "A", "B"])
def test_every_pseudo_input_gives_a_local_map(pseudo):
    model = small_vit(depth=1)
    rec = si.initialize(model, "impulse", kernel=3, pseudo_input=pseudo, seed=0)
    assert rec.target_mass > 6 / 64                      # the official softness here: 0.11


def test_mimetic_qk_is_identity_plus_noise():
    model = small_vit(embed_dim=96, num_heads=2, depth=2)
    si.initialize(model, "mimetic", seed=0)
    for wq, wk in _qk(model, 1):
        prod = wq.T @ wk                                     # (C, C) = W_q^T W_k
        diag = prod.diagonal()
        off = prod - torch.diag(diag)
        # rank-r part of 0.7 Z + 0.7 I with r = C/2: the identity survives on the diagonal
        assert diag.mean().item() > 0.3
        assert diag.mean().item() > 5 * off.std().item()
        assert torch.linalg.matrix_rank(prod).item() == 48
    # V/proj: W_v^T W_proj^T = 0.4 Z - 0.4 I exactly (full rank)
    attn = model.blocks[0].attn
    wv = attn.qkv.weight[2 * 96:].detach()
    vp = wv.T @ attn.proj.weight.detach().T
    assert vp.diagonal().mean().item() == pytest.approx(-0.4, abs=0.05)
    assert (vp + 0.4 * torch.eye(96)).std().item() == pytest.approx(0.4 / math.sqrt(96), rel=0.1)


def test_mimetic_qk_arm_is_mimetic_qk_on_trunc_normal_v_proj():
    """The confound arm: at one seed its Q/K are Mimetic's exactly, every other weight (V, proj,
    MLP, ...) is Trunc Normal's exactly, so Mimetic - Mimetic Q/K isolates V/proj."""
    arms = {}
    for name in ("mimetic", "mimetic_qk", "trunc_normal"):
        arms[name] = small_vit(embed_dim=96, num_heads=2, depth=2)
        si.initialize(arms[name], name, seed=3)
    state = {name: m.state_dict() for name, m in arms.items()}
    for key, w in state["mimetic_qk"].items():
        if key.endswith("attn.qkv.weight"):
            assert torch.equal(w[:2 * 96], state["mimetic"][key][:2 * 96]), key        # Q/K: Mimetic's
            assert torch.equal(w[2 * 96:], state["trunc_normal"][key][2 * 96:]), key   # V: Trunc Normal's
        else:
            assert torch.equal(w, state["trunc_normal"][key]), key
    proj = "blocks.0.attn.proj.weight"
    assert not torch.equal(state["mimetic"][proj], state["mimetic_qk"][proj])          # Mimetic sets proj


def test_baseline_spreads():
    model = si.create_vit(img_size=32, patch_size=4, embed_dim=192, depth=2, num_heads=3,
                          num_classes=10)
    si.initialize(model, "trunc_normal", seed=0)
    fc1 = model.blocks[0].mlp.fc1
    assert fc1.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert fc1.bias.abs().max().item() == 0
    si.initialize(model, "kaiming_uniform", seed=0)
    # PyTorch default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), std 1/sqrt(3 fan_in)
    assert fc1.weight.std().item() == pytest.approx(1 / math.sqrt(3 * 192), rel=0.05)
    assert fc1.weight.abs().max().item() <= 1 / math.sqrt(192)
    assert fc1.bias.abs().max().item() > 0


@pytest.mark.parametrize("method,opts,msg", [
    ("xavier", {}, "unknown init method 'xavier'; choose one of"),
    ("impulse", {"kernel": 4}, "kernel=4: the impulse filter needs an odd size"),
    ("impulse", {"kernel": 9}, "kernel=9 is larger than the 8x8 patch grid; allowed: odd sizes up to 7"),
    ("impulse", {"pseudo_input": "Z"}, "unknown pseudo_input 'Z'; choose one of"),
    ("impulse", {"offset_order": "spiral"}, "unknown offset_order='spiral'"),
    ("impulse", {"solver": "lbfgs"}, "unknown solver 'lbfgs'"),
    ("impulse", {"kernal": 3}, r"unknown option\(s\) \['kernal'\]"),
    ("mimetic", {"kernel": 3}, r"unknown option\(s\) \['kernel'\] for method 'mimetic'"),
])
def test_bad_options_raise_clear_errors_before_touching_weights(method, opts, msg):
    model = small_vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=msg):
        si.initialize(model, method, **opts)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_class_token_model_is_accepted_and_solved_on_the_grid():
    """A class token used to be refused; now the solve covers the patch grid and the class token
    gets no target (tests/test_timm_vits.py checks the maps)."""
    model = VisionTransformer(img_size=8, patch_size=1, in_chans=1, embed_dim=48, depth=1,
                              num_heads=3, class_token=True, global_pool="token")
    rec = si.initialize(model, "impulse", kernel=3, seed=0, pos_embed="sincos")
    plain = small_vit(depth=1)
    assert rec.offsets == si.initialize(plain, "impulse", kernel=3, seed=0).offsets
    qk = slice(0, 2 * 48)                                # the solved rows: Q and K
    assert torch.equal(model.blocks[0].attn.qkv.weight[qk], plain.blocks[0].attn.qkv.weight[qk])


def test_a_model_without_a_position_embedding_is_refused_by_the_structured_init():
    model = VisionTransformer(img_size=8, patch_size=1, in_chans=1, embed_dim=48, depth=1,
                              num_heads=3, class_token=False, global_pool="avg", pos_embed="none")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"no pos_embed \(pos_embed='none'\)"):
        si.initialize(model, "impulse")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_initializer_needs_no_no_grad_of_its_own():
    """initialize runs the initializer under torch.no_grad(): writing into a slice of a
    parameter works without a decorator (docs/library.md's example has none)."""
    from structinit.init.registry import INITIALIZERS, register_initializer

    @register_initializer("_test_zero_qk")
    def _zero_qk(model, *, seed, generator):
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * model.embed_dim].zero_()

    try:
        model = small_vit(depth=1)
        si.initialize(model, "_test_zero_qk", seed=0)
        assert not model.blocks[0].attn.qkv.weight[:96].any()
        assert model.blocks[0].attn.qkv.weight[96:].any()
    finally:
        del INITIALIZERS["_test_zero_qk"]
