import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from timm.layers import build_sincos2d_pos_embed

from structinit.evidence import softness_law
from structinit.data.specs import get_spec
from structinit.init import softness, solve_impulse_qk
from structinit.init.impulse import solve_impulse_qk_seeds
from structinit.init.solvers import solve_qk_adam, solve_qk_closed_form

REPO = Path(__file__).resolve().parents[1]
LAW = REPO / "results/evidence/softness_law/softness_law.csv"   # the softness_law stage's data


def _official_loop(pe, offsets, grid, heads, generator, epochs, norm=100):
    """The official `impulse_init` (osiriszjq/structured_init), restated: targets built
    row by row, Q then K drawn U(-a, a), renormalised when i % norm == 0 before the step,
    returned after the last Adam step."""
    side = grid
    n_tok = side * side
    weight = torch.zeros(heads, n_tok, n_tok)
    for h, (m, n) in enumerate(offsets):
        for i in range(side):
            for j in range(side):
                if 0 <= i + m < side and 0 <= j + n < side:
                    weight[h, i * side + j, (i + m) * side + (j + n)] = 1
    dim = pe.shape[1]
    rank = dim // heads
    scale = rank ** -0.5
    x = F.layer_norm(pe, [dim])
    wq = (math.sqrt(1 / rank / heads) * (2 * torch.rand(heads, dim, rank, generator=generator) - 1)).requires_grad_()
    wk = (math.sqrt(1 / rank / heads) * (2 * torch.rand(heads, rank, dim, generator=generator) - 1)).requires_grad_()
    nq = wq.detach().norm(dim=1).mean()
    opt = torch.optim.Adam([wq, wk], lr=0.0001)
    for i in range(epochs):
        if i % norm == 0:
            with torch.no_grad():
                wq.div_(wq.detach().norm(dim=1, keepdim=True) / nq)
                wk.div_(wk.detach().norm(dim=1, keepdim=True) / nq)
        opt.zero_grad()
        loss = F.mse_loss(torch.softmax(x @ wq @ wk @ x.T * scale, -1), weight)
        loss.backward()
        opt.step()
    return wq.detach(), wk.detach(), weight, x, scale


def test_adam_solver_is_the_official_loop():
    """Same seed, same maps as the official loop (no renormalisation after the last step)."""
    grid, dim, heads, steps = 4, 16, 2, 350
    offsets = [(1, 0), (-1, 1)]
    pe = build_sincos2d_pos_embed([grid, grid], dim=dim)
    q0, k0, target, x, scale = _official_loop(pe, offsets, grid, heads, torch.Generator().manual_seed(3), steps)
    q, k, info = solve_qk_adam(x, target, head_dim=dim // heads, scale=scale,
                               generator=torch.Generator().manual_seed(3), steps=steps)
    maps = lambda q, k: torch.softmax(x @ q @ k @ x.T * scale, -1)  # noqa: E731
    assert torch.allclose(maps(q, k), maps(q0, k0), atol=1e-6)
    assert info["steps_run"] == steps and not info["stopped_early"]
    # the returned factors are 50 free steps past the cap: a final rescale would change them
    cap = q.norm(dim=1).mean()
    assert not torch.allclose(q.norm(dim=1), torch.full_like(q.norm(dim=1), cap.item()), atol=1e-4)


def test_pipeline_solve_is_the_official_loop_end_to_end():
    """solve_impulse_qk(solver="adam") with the pipeline's own targets, pseudo-input (P: the
    layer-normalized sin-cos encoding) and draws from the seed equals the official loop fed
    the same offsets: the official code draws the offsets, then Q, then K."""
    grid, dim, heads, kernel, seed, steps = 5, 24, 3, 3, 7, 250
    gen = torch.Generator().manual_seed(seed)
    kappas = torch.randint(0, kernel * kernel, (heads,), generator=gen)
    offsets = [(int(k) // kernel - kernel // 2, int(k) % kernel - kernel // 2) for k in kappas]
    pe = build_sincos2d_pos_embed([grid, grid], dim=dim)
    q0, k0, target, x, scale = _official_loop(pe, offsets, grid, heads, gen, steps)
    sol = solve_impulse_qk((grid, grid), dim, heads, 1, kernel=kernel, solver="adam", seed=seed, steps=steps)
    assert sol.offsets[0] == offsets
    maps = lambda q, k: torch.softmax(x @ q @ k @ x.T * scale, -1)  # noqa: E731
    assert torch.allclose(maps(sol.q[0], sol.k[0]), maps(q0, k0), atol=1e-6)


def _same_solution(a, b) -> bool:
    return (torch.equal(a.q, b.q) and torch.equal(a.k, b.k) and a.fit_mse == b.fit_mse
            and a.target_mass == b.target_mass and a.offsets == b.offsets and a.options == b.options
            and a.solver_info["layer0"]["loss_history"] == b.solver_info["layer0"]["loss_history"])


@pytest.mark.parametrize("kernel,pseudo_input,depth", [(3, "P", 1), (5, "P", 2), (3, "U", 1)])
def test_the_seeds_solve_gives_each_seeds_own_bits(kernel, pseudo_input, depth):
    """reference_solve's way: every seed in one stacked loop (P: one pseudo-input for all), or
    seed by seed where the seeds' pseudo-inputs differ (U); either way each seed's solve_impulse_qk,
    to the bit, with the intra-op threads restored after."""
    threads = torch.get_num_threads()
    seeds = [0, 3, 5]
    opts = dict(kernel=kernel, solver="adam", steps=200, pseudo_input=pseudo_input)
    together = solve_impulse_qk_seeds((8, 8), 24, 3, depth, seeds=seeds, **opts)
    assert torch.get_num_threads() == threads
    assert ("stacked_seeds" in together[0].solver_info["layer0"]) == (pseudo_input == "P")
    for seed, sol in zip(seeds, together):
        assert _same_solution(sol, solve_impulse_qk((8, 8), 24, 3, depth, seed=seed, **opts))


def test_the_official_loop_gives_the_same_bits_at_any_thread_count():
    """The seeds' solve runs with one thread: what a stage ran with more threads is the same."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = solve_impulse_qk((8, 8), 48, 3, 1, kernel=3, solver="adam", seed=1, steps=300)
        torch.set_num_threads(2)
        two = solve_impulse_qk((8, 8), 48, 3, 1, kernel=3, solver="adam", seed=1, steps=300)
    finally:
        torch.set_num_threads(threads)
    assert _same_solution(one, two)


def test_official_solver_softness_on_the_digits_shape():
    """The official 10,000 steps on the embedded default's shape give ~0.11 (issue 10's
    measurement with the official loop); the closed form matches it within 0.03."""
    adam = solve_impulse_qk((8, 8), 48, 3, 1, kernel=3, solver="adam", seed=0)
    fast = solve_impulse_qk((8, 8), 48, 3, 1, kernel=3, seed=0)
    assert adam.solver_info["layer0"]["steps_run"] == 10_000
    assert adam.target_mass == pytest.approx(0.110, abs=0.005)
    assert adam.offsets == fast.offsets
    assert abs(fast.target_mass - adam.target_mass) <= 0.03
    assert fast.fit_mse <= adam.fit_mse * 1.05


def test_early_stop_is_opt_in_and_ends_at_a_cycle_end():
    sol = solve_impulse_qk((8, 8), 48, 3, 1, kernel=3, solver="adam", seed=0, early_stop=True)
    info = sol.solver_info["layer0"]
    assert info["early_stop"] and info["stopped_early"] and info["steps_run"] < 10_000
    assert info["steps_run"] % 100 == 0 and info["loss_history"][-1][0] == info["steps_run"]


def test_softness_law_is_the_fit_of_its_data():
    """COEFFICIENTS are what the softness_law stage fits on the FIT shapes' official masses (its
    output, results/evidence/softness_law/softness_law.csv)."""
    masses = softness_law.read_csv(LAW)
    coef = softness_law.fit([(s, masses[s]) for s in softness_law.FIT])
    assert coef == pytest.approx(softness.COEFFICIENTS, abs=2e-4)
    assert not set(softness_law.FIT) & set(softness_law.HELD_OUT)


def test_closed_form_matches_the_official_softness_on_held_out_shapes():
    """Shapes the law was not fitted on (every params.yaml shape, ViT-B/16 where measured):
    the closed form, same seed and offsets, lands within 0.03 of the official solver."""
    masses = softness_law.read_csv(LAW)
    checked = 0
    for s in softness_law.HELD_OUT:
        if s not in masses or s[1] > 400:          # ViT-B/16 has its own (timed) test
            continue
        g, c, h, k, seed = s
        fast = solve_impulse_qk((g, g), c, h, 1, kernel=k, seed=seed)
        assert abs(fast.target_mass - masses[s]) <= 0.03, (s, fast.target_mass, masses[s])
        checked += 1
    assert checked == len(softness_law.HELD_OUT) - 1          # all measured, B/16 aside


def test_every_params_shape_is_held_out():
    import yaml
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    held = {(g, c, h) for g, c, h, *_ in softness_law.HELD_OUT}
    for ds, rec in p["recipes"].items():
        m = rec["model"]
        sides = {ds: get_spec(ds).image_size // m["patch_size"]}
        # vit_* entries of model_shapes are for the 32x32 recipes, the others for digits
        shapes = [m] + [{**m, **o} for name, o in p["model_shapes"].items()
                        if name.startswith("vit_") == (ds != "digits")]
        for shape in shapes:
            assert (sides[ds], shape["embed_dim"], shape["num_heads"]) in held, (ds, shape)


def test_softness_is_a_parameter():
    soft = solve_impulse_qk((8, 8), 48, 3, 1, seed=0, target_mass=0.1)
    sharp = solve_impulse_qk((8, 8), 48, 3, 1, seed=0, target_mass=0.5)
    assert soft.target_mass == pytest.approx(0.1, abs=0.005)
    assert sharp.target_mass == pytest.approx(0.5, abs=0.005)
    assert sharp.solver_info["layer0"]["target_mass_source"] == "explicit"
    with pytest.raises(ValueError, match="target_mass=1.5"):
        solve_qk_closed_form(torch.randn(16, 8), torch.eye(16)[None], head_dim=4, scale=0.5,
                             generator=torch.Generator(), target_mass=1.5)


def test_closed_form_at_the_official_softness_on_vit_b16():
    """Its speed is a benchmark's business: a timing assert fails on a
    loaded machine and proves nothing on an idle one."""
    official = softness_law.read_csv(LAW)[(14, 768, 12, 3, 0)]
    sol = solve_impulse_qk((14, 14), 768, 12, 12, kernel=3, seed=0)
    assert abs(sol.target_mass - official) <= 0.03


@pytest.mark.slow
def test_closed_form_matches_official_solver_vit_t2():
    adam = solve_impulse_qk((16, 16), 192, 3, 1, kernel=3, solver="adam", seed=0)
    fast = solve_impulse_qk((16, 16), 192, 3, 1, kernel=3, seed=0)
    assert adam.target_mass == pytest.approx(0.276, abs=0.005)
    assert abs(adam.target_mass - fast.target_mass) <= 0.03
