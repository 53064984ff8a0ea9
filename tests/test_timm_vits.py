"""The library on ViTs built by timm.create_model: class and register tokens, a learned position
embedding, and the caller's RNG (docs/library.md, "Which timm ViTs")."""
import contextlib
import io
import re
import warnings
from pathlib import Path

import pytest
import timm
import torch

import structinit as si
from structinit.init import SINCOS_SOLVED
from structinit.models.vit import sincos_position_encoding
from conftest import small_vit

DOCS = Path(__file__).resolve().parents[1] / "docs" / "library.md"

# Prefix-token layouts timm offers: the class token with its own encoding slot (timm's default
# and DeiT's), without one (DeiT-3's no_embed_class), and with register tokens as well.
LAYOUTS = {
    "class token": {},
    "class token, no class slot": dict(no_embed_class=True),
    "class + 4 register tokens": dict(reg_tokens=4),
}
# Two widths on an 8x8 grid: sharp maps (C=192, mass ~0.64) and soft ones (C=48, ~0.11),
# where a prefix token's share of the attention weighs most against the target's.
WIDTHS = {"C192": dict(embed_dim=192, num_heads=3), "C48": dict(embed_dim=48, num_heads=3)}


def timm_vit(**kw):
    cfg = dict(pretrained=False, img_size=32, patch_size=4, depth=2, num_classes=10)
    cfg.update(kw)
    return timm.create_model("vit_tiny_patch16_224", **cfg)


def without_prefix(**kw):
    return timm_vit(class_token=False, global_pool="avg", **kw)


def quietly(fn, *args, **kw):
    """fn(*args, **kw) with the structured init's sin-cos warning (tested on its own) hidden."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*wrote the fixed 2-D sin-cos")
        return fn(*args, **kw)


def no_warnings(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn(*args, **kw)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_prefix_tokens_keep_each_heads_impulse(layout, width):
    """Each head's map on the pseudo-input peaks at its target offset, and its mass there is
    within 0.02 of the same model without prefix tokens."""
    plain, prefixed = without_prefix(**WIDTHS[width]), timm_vit(**WIDTHS[width], **LAYOUTS[layout])
    assert prefixed.num_prefix_tokens >= 1 and plain.num_prefix_tokens == 0
    rec0 = quietly(si.initialize, plain, "impulse", kernel=3, seed=2)
    rec = quietly(si.initialize, prefixed, "impulse", kernel=3, seed=2)
    assert rec.offsets == rec0.offsets                 # the same solve: prefix tokens change nothing
    assert rec.prefix_tokens == prefixed.num_prefix_tokens and "prefix_tokens" not in rec0.to_dict()
    maps0 = si.attention_maps(plain, offsets=rec0.offsets)
    maps = si.attention_maps(prefixed, offsets=rec.offsets)
    N = 64
    assert maps.maps.shape == maps0.maps.shape == (2, 3, N, N)   # the patch-to-patch block
    gh, gw = maps.patch_grid
    profile = maps.offset_mass()                                 # (L, H, 2gh-1, 2gw-1)
    for l, layer in enumerate(rec.offsets):
        for h, (m, n) in enumerate(layer):
            peak = divmod(profile[l, h].argmax().item(), 2 * gw - 1)
            assert (peak[0] - gh + 1, peak[1] - gw + 1) == (m, n), (l, h)
    mass, mass0 = maps.target_mass(), maps0.target_mass()
    assert (mass - mass0).abs().max().item() <= 0.02, (mass, mass0)
    assert mass.min().item() > 5 / N                              # far from uniform (1/64)
    # Why it holds: a prefix token is ~0 on the pseudo-input, so each one takes less of a patch
    # query's attention than an average non-target patch does.
    per_token = maps.prefix_mass / prefixed.num_prefix_tokens      # (L, H)
    assert (per_token < (1 - mass) / (N - 1)).all(), (per_token, mass)
    assert maps0.prefix_mass is None
    # rows of the patch block sum to 1 minus the prefix share
    rows = maps.maps.sum(-1).mean(-1)
    assert torch.allclose(rows, 1 - maps.prefix_mass, atol=1e-5)


def test_prefix_tokens_are_drawn_last_from_the_seed():
    """The prefix tokens are the seed's, like every other weight, and drawn after the
    initializer: every weight shared with the same model without them is equal."""
    for method in ("trunc_normal", "mimetic", "impulse"):
        a, b = (timm_vit(reg_tokens=2, **WIDTHS["C48"]) for _ in range(2))
        plain = without_prefix(**WIDTHS["C48"])
        torch.manual_seed(5)                           # the caller's RNG must not matter
        quietly(si.initialize, a, method, seed=4)
        torch.rand(7)
        quietly(si.initialize, b, method, seed=4)
        quietly(si.initialize, plain, method, seed=4)
        sa, sb, sp = a.state_dict(), b.state_dict(), plain.state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa if k != "pos_embed"), method
        shared = [k for k in sp if k.startswith(("blocks.", "patch_embed.", "head."))]
        assert len(shared) > 20
        assert all(torch.equal(sa[k], sp[k]) for k in shared), method
        for token in ("cls_token", "reg_token"):
            assert 0 < sa[token].std().item() < 2e-6, (method, token)


@pytest.mark.parametrize("method", ["trunc_normal", "kaiming_uniform", "mimetic", "mimetic_qk"])
def test_baselines_leave_a_learned_position_embedding_alone(method):
    model = timm_vit()
    before = model.pos_embed.detach().clone()
    rec = no_warnings(si.initialize, model, method, seed=0)
    assert torch.equal(model.pos_embed, before) and model.pos_embed.requires_grad
    assert "pos_embed" not in rec.to_dict()
    assert rec.to_dict()["prefix_tokens"] == 1


def test_structured_init_writes_sincos_and_says_so():
    model = timm_vit()                                  # timm's learned, trainable encoding
    with pytest.warns(UserWarning, match=r"wrote the fixed 2-D sin-cos position encoding.*"
                                         r"requires_grad=True.*pos_embed='keep'"):
        rec = si.initialize(model, "impulse", kernel=3, seed=0)
    assert rec.to_dict()["pos_embed"] == "sincos_written"
    pe = sincos_position_encoding((8, 8), 192)
    assert torch.equal(model.pos_embed[0, 1:], pe)      # patch slots
    assert not model.pos_embed[0, 0].any()              # the class token's slot: zero
    assert model.pos_embed.requires_grad                # trainability is the caller's

    chosen = timm_vit()                                 # the same, chosen explicitly: no warning
    rec = no_warnings(si.initialize, chosen, "impulse", kernel=3, seed=0, pos_embed="sincos")
    assert rec.pos_embed == "sincos_written" and torch.equal(chosen.pos_embed, model.pos_embed)

    kept = timm_vit()                                   # the model's own encoding, by choice
    before = kept.pos_embed.detach().clone()
    rec = no_warnings(si.initialize, kept, "impulse", kernel=3, seed=0, pos_embed="keep")
    assert torch.equal(kept.pos_embed, before) and rec.pos_embed == "kept_not_sincos"
    # same Q/K either way: the choice is about the encoding alone
    assert torch.equal(kept.blocks[1].attn.qkv.weight, model.blocks[1].attn.qkv.weight)

    # a baseline may take the sin-cos encoding too, by choice
    rec = no_warnings(si.initialize, timm_vit(), "trunc_normal", seed=0, pos_embed="sincos")
    assert rec.pos_embed == "sincos_written"


def test_bad_pos_embed_choice_and_unfit_models_are_refused_before_any_weight_is_set():
    model = timm_vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"pos_embed='learned': choose one of \('keep', 'sincos'\)"):
        si.initialize(model, "impulse", pos_embed="learned")
    for kw, msg in [(dict(pos_embed="none"), "has no pos_embed"),
                    (dict(qk_norm=True), "qk_norm=True"),
                    (dict(embed_dim=42, num_heads=3), "embed_dim=42: a 2-D sin-cos encoding needs a multiple of 4")]:
        unfit = timm_vit(**kw)
        unfit_before = {k: v.clone() for k, v in unfit.state_dict().items()}
        with pytest.raises(ValueError, match=msg):
            si.initialize(unfit, "impulse")
        assert all(torch.equal(unfit_before[k], v) for k, v in unfit.state_dict().items())
        si.initialize(unfit, "trunc_normal")           # the baselines need none of it
    with pytest.raises(TypeError, match="expected a timm VisionTransformer, got Linear"):
        si.initialize(torch.nn.Linear(3, 3), "trunc_normal")
    from timm.models.vision_transformer import ParallelScalingBlock
    with pytest.raises(ValueError, match=r"block 0 \(ParallelScalingBlock\) has no fused qkv Linear"):
        si.initialize(timm_vit(depth=1, block_fn=ParallelScalingBlock), "trunc_normal")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_the_paper_vit_keeps_its_record_and_encoding():
    """create_vit's model (no prefix tokens, fixed sin-cos encoding, frozen): no warning, no new
    record field (the pipeline's init.json files stay as they are), the encoding untouched."""
    old_keys = {"method", "seed", "options", "offsets", "solve_seconds", "fit_mse", "target_mass", "solver_info"}
    pe = sincos_position_encoding((8, 8), 48)
    for method in ("trunc_normal", "kaiming_uniform", "mimetic", "mimetic_qk", "impulse"):
        model = small_vit(depth=1)
        rec = no_warnings(si.initialize, model, method, seed=0)
        assert set(rec.to_dict()) == old_keys, method
        assert torch.equal(model.pos_embed[0], pe) and not model.pos_embed.requires_grad


def test_caller_rng_is_untouched_on_every_device(monkeypatch):
    """initialize seeds no device generator (torch.manual_seed would reseed every CUDA device,
    or queue the seed for one not yet initialized) and leaves the CPU generator as it was."""
    calls = []
    for owner, name in [(torch, "manual_seed"), (torch.random, "manual_seed"), (torch.cuda, "manual_seed"),
                        (torch.cuda, "manual_seed_all"), (torch.cuda, "seed"), (torch.cuda, "seed_all"),
                        (torch.cuda, "set_rng_state"), (torch.cuda, "set_rng_state_all")]:
        monkeypatch.setattr(owner, name, lambda *a, _n=f"{owner.__name__}.{name}", **k: calls.append(_n))
    models = [timm_vit(depth=1), small_vit(depth=1)]   # building a model draws from the RNG
    torch.default_generator.manual_seed(11)
    state = torch.get_rng_state()
    expected_next = torch.rand(4)
    torch.set_rng_state(state)
    for method in ("trunc_normal", "impulse"):
        for model in models:
            quietly(si.initialize, model, method, seed=3)
    assert calls == []
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(torch.rand(4), expected_next)


def test_docs_timm_example_runs_as_shown():
    """docs/library.md's timm example, as written there, prints what its comments say."""
    block = next(b for b in re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)
                 if "timm.create_model" in b)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.warns(UserWarning, match="sin-cos"):
        exec(compile(block, "docs/library.md", "exec"), {})
    first = out.getvalue().splitlines()[0]
    assert first == re.search(r"print\(record\.prefix_tokens, record\.pos_embed\)\s+# (.*)", block).group(1).strip()


def test_sincos_solved_names_a_registered_initializer():
    assert SINCOS_SOLVED <= set(si.METHODS)
