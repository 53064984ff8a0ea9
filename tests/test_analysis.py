"""What the analysis measures: mean attention distance (in patches) and linear CKA."""
import itertools
import math

import numpy as np
import pytest
import torch

import structinit as si
from structinit.analysis.attention import AttentionMaps, attention_maps
from structinit.analysis.cka import cka_matrix, layer_representations, linear_cka
from tests.conftest import small_vit

GRID = (4, 5)


def _coords():
    return [(i, j) for i in range(GRID[0]) for j in range(GRID[1])]


def _maps(rows) -> AttentionMaps:
    return AttentionMaps(torch.tensor(rows, dtype=torch.float32)[None, None], GRID, None)


def test_mean_distance_of_self_shift_and_uniform_attention():
    pts = _coords()
    n = len(pts)
    assert _maps(torch.eye(n).tolist()).mean_distance().item() == 0
    # a pure shift by (1, 2) where the shifted key exists, the query itself elsewhere
    shift, expected = [], 0.0
    for i, j in pts:
        row = [0.0] * n
        target = (i + 1, j + 2) if (i + 1, j + 2) in pts else (i, j)
        row[pts.index(target)] = 1.0
        shift.append(row)
        expected += math.dist((i, j), target) / n
    assert _maps(shift).mean_distance().item() == pytest.approx(expected, rel=1e-6)
    uniform = sum(math.dist(p, q) for p, q in itertools.product(pts, pts)) / n ** 2
    assert _maps([[1 / n] * n] * n).mean_distance().item() == pytest.approx(uniform, rel=1e-6)


def test_structured_init_looks_near_and_a_random_init_looks_everywhere():
    """On the pseudo-input, the structured init's centre head stays at ~0 patches and its
    one-step shift heads near 1; trunc-normal attention is near uniform (mean distance near
    the grid's mean pairwise distance: about 4 patches on 8x8). At the official softness
    (target mass ~0.11 on digits) the structured init sits between: 3.3 patches."""
    model = small_vit()
    offsets = si.initialize(model, "impulse", seed=0, kernel=3, offset_order="fixed", target_mass=0.9).offsets[0]
    dist = attention_maps(model).mean_distance()[0]              # layer 0, (H,)
    for h, (m, n) in enumerate(offsets):
        assert abs(dist[h].item() - math.hypot(m, n)) < 0.6, (offsets, dist)
    base = small_vit()
    si.initialize(base, "trunc_normal", seed=0)
    far = attention_maps(base).mean_distance()[0]
    assert far.min().item() > 3.0 and dist.max().item() < 1.6


def test_linear_cka_properties():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 8, generator=g)
    q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g))
    assert linear_cka(x, x) == pytest.approx(1.0)
    assert linear_cka(x, 3 * x @ q + 7) == pytest.approx(1.0)        # rotation, scale, shift
    y = torch.randn(500, 6, generator=g)
    assert linear_cka(x, y) == pytest.approx(linear_cka(y, x))
    assert linear_cka(x, y) < 0.05                                   # independent
    assert linear_cka(x, torch.cat([x[:, :4], y], 1)) > 0.3          # half shared
    with pytest.raises(ValueError, match="same inputs"):
        linear_cka(x, y[:10])


def test_cka_of_a_model_with_itself_is_one_on_the_diagonal(digits):
    model = small_vit()
    si.initialize(model, "mimetic", seed=0)
    images = (digits.test_images[:64].float() / 255 - 0.3) / 0.37
    reps = layer_representations(model, images)
    assert len(reps) == 3 and reps[0].shape == (64, 48)
    cka = cka_matrix(reps, reps)
    assert cka.shape == (3, 3) and torch.allclose(cka.diagonal(), torch.ones(3, dtype=cka.dtype))
    assert torch.allclose(cka, cka.T)


def test_real_images_blur_the_structured_init_s_attention(digits):
    """The maps measured on real test images (a real forward pass, hooks removed after, the
    model's mode kept): on digits the structured init's mass on its target offset is much
    lower than on the pseudo-input it was solved on (~0.03 vs ~0.11) and its reach is wider."""
    model = small_vit()
    offsets = si.initialize(model, "impulse", seed=0, kernel=3).offsets
    images = (digits.test_images[:64].float() / 255 - 0.3053) / 0.376
    pseudo, real = attention_maps(model, offsets=offsets), attention_maps(model, images, offsets=offsets)
    assert model.training and not any(b.attn._forward_pre_hooks for b in model.blocks)
    assert real.maps.shape == (3, 3, 64, 64)
    assert torch.allclose(real.maps.sum(-1), torch.ones(3, 3, 64), atol=1e-5)
    assert (real.target_mass()[0] < 0.5 * pseudo.target_mass()[0]).all()
    assert (real.mean_distance()[0] > pseudo.mean_distance()[0]).all()


def test_analyze_model_peaks_on_each_head_s_offset_and_batches_do_not_change_it(digits):
    """The offset profile of a sharp structured init peaks at each head's impulse offset on the
    pseudo-input; averaging over images in batches equals one pass; distances and
    representations have the documented shapes."""
    from structinit.analysis.model import ModelAnalysis, analyze_model, test_batch

    model = small_vit()
    offsets = si.initialize(model, "impulse", seed=0, kernel=3, target_mass=0.9).offsets
    images = test_batch(digits, 40)
    a = analyze_model(model, images, offsets, batch_size=40)
    b = analyze_model(model, images, offsets, batch_size=16)                  # 16 + 16 + 8: weighted mean
    assert torch.allclose(a.profile_images, b.profile_images, atol=1e-6)
    assert torch.allclose(a.representations, b.representations, atol=1e-5)
    assert a.profile_pseudo.shape == (3, 3, 15, 15) and a.representations.shape == (3, 40, 48)
    for layer, heads in enumerate(a.offsets):
        for h, (m, n) in enumerate(heads):
            prof = a.profile_pseudo[layer, h]
            assert prof.argmax().item() == (m + 7) * 15 + (n + 7), (layer, h, (m, n))
            assert a.target_pseudo[layer, h] > 0.5
    assert (a.target_images < a.target_pseudo).all()
    again = ModelAnalysis.from_dict(a.to_dict())
    assert again.offsets == a.offsets and torch.equal(again.profile_images, a.profile_images)
    base = small_vit()
    si.initialize(base, "trunc_normal", seed=0)
    plain = analyze_model(base, images)
    assert plain.target_pseudo is None and plain.offsets is None


def test_uniform_distance_matches_a_uniform_map_and_figures_are_byte_stable(digits, tmp_path):
    """The reference line of the distance plot is uniform attention's mean distance; a figure
    drawn twice from the same analysis is the same file (DVC sees no change on a re-run)."""
    from structinit.analysis.model import analyze_model, test_batch
    from structinit.reporting.figures import attention as fig
    from structinit.reporting.figures.style import save_figure

    n = GRID[0] * GRID[1]
    assert fig.uniform_distance(GRID) == pytest.approx(_maps([[1 / n] * n] * n).mean_distance().item(), rel=1e-6)
    model = small_vit()
    offsets = si.initialize(model, "impulse", seed=0, kernel=3).offsets
    a = analyze_model(model, test_batch(digits, 16), offsets)
    analyses = {"impulse3": {"at_init": a, "trained": a}}
    digests = set()
    for i in range(2):
        save_figure(fig.kernel_grids(analyses, {"impulse3": 3}), tmp_path / f"k{i}.png")
        digests.add((tmp_path / f"k{i}.png").read_bytes())
    assert len(digests) == 1 and next(iter(digests))[:8] == b"\x89PNG\r\n\x1a\n"
    assert fig.shown_blocks(12) == [0, 6, 11] and fig.shown_blocks(1) == [0]


def _fake_analysis(reps: torch.Tensor, distance: float, mass=None) -> "object":
    from structinit.analysis.model import ModelAnalysis

    L, H = reps.shape[0], 2
    prof = torch.zeros(L, H, 3, 3)
    return ModelAnalysis(prof, prof, torch.full((L, H), distance), torch.full((L, H), distance),
                         None if mass is None else torch.full((L, H), mass[0]),
                         None if mass is None else torch.full((L, H), mass[1]),
                         None, reps)


def test_attention_summary_cka_pairs_distances_and_the_untrained_caveat():
    """CKA between initializers is per pair of *layers* (L x L), same seed, mean over seeds; a
    model whose blocks kept their representation through training is flagged; distances are
    per seed and block, mean over heads."""
    from structinit.reporting import attention_tables as summary

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 50, 6, generator=g)                       # (L, B, C)
    other = torch.randn(2, 50, 6, generator=g)
    runs = {}
    for s in (0, 1):
        runs["a", s] = {"at_init": _fake_analysis(x, 4.0), "trained": _fake_analysis(x * 2, 3.0 + s)}
        runs["b", s] = {"at_init": _fake_analysis(x, 4.0), "trained": _fake_analysis(other, 4.0)}
    ivt = summary.cka_init_vs_trained(runs, ["a", "b"], [0, 1])
    assert ivt["a"].shape == (2, 2) and np.allclose(np.diagonal(ivt["a"]), 1.0)
    assert summary.barely_trained(ivt) == ["a"]                  # b's representation changed
    between = summary.cka_between_inits(runs, ["a", "b"], [0, 1])
    assert list(between) == [("a", "b")] and between["a", "b"].shape == (2, 2)
    assert np.allclose(between["a", "b"], ivt["b"], atol=1e-6)    # a trained = a at init up to scale
    dist = summary.distances(runs, ["a", "b"], [0, 1])
    assert dist["a"]["trained", "images"].tolist() == [[3.0, 3.0], [4.0, 4.0]]
    assert "3.50 (± 0.71)" in summary.distance_table(dist, 4.14)
    mass = summary.target_mass({("i", 0): {"at_init": _fake_analysis(x, 3.0, (0.2, 0.05)),
                                           "trained": _fake_analysis(x, 3.0, (0.1, 0.04))}}, ["i"], [0])
    assert mass["i"]["at_init", "pseudo"] == pytest.approx([0.2])
    assert mass["i"]["trained", "images"] == pytest.approx([0.04])


def test_a_gpu_datasets_compact_analysis_gives_the_report_the_same_numbers_without_representations(tmp_path):
    """attention_tables.compact keeps what the report reads (distances, masses, the first seed's
    profiles) and the CKA matrices in place of the representations; expand gives them back as
    the report's functions take them; through save_checked / load_checked as the stages write
    and read it. The report refuses one of another grid than params.yaml's."""
    from structinit.errors import StructinitError
    from structinit.io import save_checked
    from structinit.reporting import attention_tables as summary
    from structinit.reporting.attention_report import load_gpu_analysis

    g = torch.Generator().manual_seed(1)
    runs = {(i, s): {"at_init": _fake_analysis(torch.randn(2, 40, 6, generator=g), 4.0, (0.3, 0.1)),
                     "trained": _fake_analysis(torch.randn(2, 40, 6, generator=g), 3.0 + s, (0.2, 0.05 * (s + 1)))}
            for i in ("a", "impulse3") for s in (0, 1)}
    inits, seeds = ["a", "impulse3"], [0, 1]
    save_checked(tmp_path / "ds.pt", summary.compact(runs, inits, seeds, images=40))
    got = load_gpu_analysis(tmp_path / "ds.pt", "ds", inits, seeds)
    back, (ivt, between) = got["runs"], got["cka"]
    assert got["images"] == 40 and set(back) == set(runs)
    assert all(back[k][st].representations is None for k in back for st in ("at_init", "trained"))
    assert back["a", 0]["trained"].profile_images is not None and back["a", 1]["trained"].profile_images is None
    for name, want in summary.cka_init_vs_trained(runs, inits, seeds).items():
        assert np.array_equal(ivt[name], want)
    assert list(between) == [("a", "impulse3")]
    assert np.array_equal(between["a", "impulse3"], summary.cka_between_inits(runs, inits, seeds)["a", "impulse3"])
    assert summary.distances(back, inits, seeds)["impulse3"]["trained", "images"].tolist() == [[3.0, 3.0],
                                                                                             [4.0, 4.0]]
    assert summary.target_mass(back, ["impulse3"], seeds) == summary.target_mass(runs, ["impulse3"], seeds)
    with pytest.raises(StructinitError, match=r"seeds \[0, 1\]; the main grid \(params.yaml\) has \['a', "
                                              r"'impulse3'\] and \[0, 1, 2\].*grid.gpu_datasets=\[\]"):
        load_gpu_analysis(tmp_path / "ds.pt", "ds", inits, [0, 1, 2])


def test_a_gpu_datasets_section_from_its_compact_analysis_is_the_one_from_its_full_runs(tmp_path):
    """dataset_section on the compact file (expand, its CKA passed in) writes the text and the
    figures it writes on the full runs: nothing the report reads is lost. Offsets and masses
    for the impulse arm only (a baseline has none), as the analyses hold them."""
    from structinit.analysis.model import ModelAnalysis
    from structinit.io import save_checked
    from structinit.reporting import attention_tables as summary
    from structinit.reporting.attention_report import dataset_section, load_gpu_analysis

    g = torch.Generator().manual_seed(2)
    L, H, side = 2, 2, 5

    def analysis(impulse: bool, distance: float) -> ModelAnalysis:
        prof = torch.rand(L, H, side, side, generator=g)
        mass = (lambda: torch.rand(L, H, generator=g)) if impulse else (lambda: None)
        return ModelAnalysis(prof, torch.rand(L, H, side, side, generator=g),
                             torch.full((L, H), distance) + torch.rand(L, H, generator=g),
                             torch.full((L, H), distance) + torch.rand(L, H, generator=g), mass(), mass(),
                             [[(0, 1), (1, 0)]] * L if impulse else None, torch.randn(L, 30, 4, generator=g),
                             torch.rand(L, 2, generator=g))
    inits, seeds = ["trunc_normal", "impulse3"], [0, 1, 2]
    runs = {(i, s): {"at_init": analysis(i == "impulse3", 2.0), "trained": analysis(i == "impulse3", 1.5)}
            for i in inits for s in seeds}
    save_checked(tmp_path / "ds.pt", summary.compact(runs, inits, seeds, images=30))
    got = load_gpu_analysis(tmp_path / "ds.pt", "ds", inits, seeds)
    kw = dict(inits=inits, impulse_inits=["impulse3"], seeds=seeds, images=30)
    full = dataset_section("ds", runs, tmp_path / "full", **kw)
    small = dataset_section("ds", got["runs"], tmp_path / "compact", cka=got["cka"], **kw)
    assert small == full and "### CKA (test images)" in full
    pngs = sorted(p.name for p in (tmp_path / "full").glob("*.png"))
    assert len(pngs) == 6 and pngs == sorted(p.name for p in (tmp_path / "compact").glob("*.png"))
    assert all((tmp_path / "full" / p).read_bytes() == (tmp_path / "compact" / p).read_bytes() for p in pngs)


def test_analyze_refuses_a_rebuild_that_is_not_the_trained_model(tmp_path):
    """The analysis rebuilds the model at init; if the training stage's init.json says otherwise
    (another init, seed or offsets), it stops instead of describing another model."""
    import json

    from stages.analyze import check_same_init
    from structinit.errors import StructinitError

    record = {"model": "vit", "method": "impulse", "seed": 0, "offsets": [[(0, 1), (1, 0)]], "solve_seconds": 0.3}
    (tmp_path / "init.json").write_text(json.dumps({k: v for k, v in record.items() if k != "solve_seconds"}))
    check_same_init(tmp_path / "init.json", record)                  # timings aside, the same
    with pytest.raises(StructinitError, match=r"differs from the one trained in \['offsets', 'seed'\]"):
        check_same_init(tmp_path / "init.json", {**record, "seed": 1, "offsets": [[(1, 1), (1, 0)]]})
    with pytest.raises(StructinitError, match="train the cell first"):
        check_same_init(tmp_path / "missing.json", record)


def test_a_sharper_structured_init_puts_more_mass_on_its_offset_with_larger_qk_weights(digits):
    """The regime study's premise, measured on the model: a larger target mass gives more mass on
    each head's offset (on the pseudo-input, where it was solved, and on real images) and larger
    W_q, W_k; qk_norm is each block's query and key slice of the fused qkv weight."""
    from structinit.analysis.model import analyze_model, test_batch

    images = test_batch(digits, 32)
    found = {}
    for mass in (0.15, 0.6):
        model = small_vit()
        offsets = si.initialize(model, "impulse", seed=0, kernel=3, target_mass=mass).offsets
        found[mass] = a = analyze_model(model, images, offsets)
        assert abs(a.target_pseudo.mean().item() - mass) < 0.05 * mass       # the solve's rtol is 3 %
        q, k, _ = model.blocks[1].attn.qkv.weight.detach().view(3, 48, 48)     # independent restatement
        assert torch.allclose(a.qk_norm[1], torch.stack([q.norm(), k.norm()]))
        assert a.qk_norm.shape == (3, 2)
    assert (found[0.6].qk_norm > found[0.15].qk_norm).all()
    assert found[0.6].target_images.mean() > found[0.15].target_images.mean()
