import pytest
import torch

import structinit as si
from structinit.models.convmixer import spatial_filters


def _train_steps(model, steps=5):
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(torch.randn(8, 3, 16, 16)),
                                                 torch.randint(0, 10, (8,)))
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.parametrize("mode", ["random", "impulse", "box"])
def test_frozen_filters_stay_frozen_while_the_rest_learns(mode):
    model = si.create_convmixer(32, 2, 3, 2, 10, filter_mode=mode, seed=0)
    before = [c.weight.detach().clone() for c in spatial_filters(model)]
    mixer = model.blocks[0][1].weight.detach().clone()           # 1x1 channel mixing
    _train_steps(model)
    assert all(torch.equal(b, c.weight) for b, c in zip(before, spatial_filters(model)))
    assert not torch.equal(mixer, model.blocks[0][1].weight)


def test_learned_filters_learn():
    model = si.create_convmixer(32, 2, 3, 2, 10, filter_mode="learned")
    before = spatial_filters(model)[0].weight.detach().clone()
    _train_steps(model)
    assert not torch.equal(before, spatial_filters(model)[0].weight)


def test_filter_values_per_mode():
    k = 5
    impulse = spatial_filters(si.create_convmixer(64, 1, k, 2, 10, filter_mode="impulse"))[0].weight
    flat = impulse.view(64, k * k)
    assert torch.equal(flat.sum(1), torch.ones(64))
    assert torch.equal((flat != 0).sum(1), torch.ones(64, dtype=torch.long))
    assert len(flat.argmax(1).unique()) > 10                 # taps differ between channels
    box = spatial_filters(si.create_convmixer(8, 1, k, 2, 10, filter_mode="box"))[0].weight
    assert torch.allclose(box, torch.full_like(box, 1 / k ** 2))
    rnd = spatial_filters(si.create_convmixer(64, 1, k, 2, 10, filter_mode="random"))[0].weight
    assert rnd.abs().max() <= 1 / k and rnd.std() > 0.5 / k / 3 ** 0.5


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown filter_mode 'gabor'; choose one of"):
        si.create_convmixer(8, 1, 3, 2, 10, filter_mode="gabor")


@pytest.mark.parametrize("mode", ["learned", "random"])
def test_same_seed_same_convmixer_whatever_the_global_rng(mode):
    """A study cell's model is a function of its seed alone (it was built under the unseeded
    global RNG: cells differed run to run)."""
    torch.manual_seed(1)
    a = si.create_convmixer(16, 2, 3, 1, 10, in_chans=1, filter_mode=mode, seed=0)
    torch.manual_seed(2)
    b = si.create_convmixer(16, 2, 3, 1, 10, in_chans=1, filter_mode=mode, seed=0)
    c = si.create_convmixer(16, 2, 3, 1, 10, in_chans=1, filter_mode=mode, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())
    state = torch.get_rng_state()
    si.create_convmixer(16, 2, 3, 1, 10, in_chans=1, filter_mode=mode, seed=0)
    assert torch.equal(state, torch.get_rng_state())      # the global RNG is not consumed
