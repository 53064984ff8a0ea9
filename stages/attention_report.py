"""attention_report: the analyze stages' outputs -> reports/attention.md and its figures.

Answers, per dataset: does the structured init's attention survive real images and training
(mass on each head's impulse offset), does attention stay local after training (mean attention
distance), and do the initializers lead to different representations (CKA).
    python -m stages.attention_report --analysis artifacts/analysis --out reports/attention.md \
        --figures reports/figures/attention
"""
import argparse
import itertools
from pathlib import Path

import numpy as np
from tabulate import tabulate

from stages.common import impulse_name, load_params, run_stage, seed_dir, write_text
from structinit import report, stats
from structinit.analysis import ModelAnalysis
from structinit.cka import cka_matrix
from structinit.figures import attention as attention_fig
from structinit.figures.cka import cka_figure
from structinit.figures.style import save_figure
from structinit.io import load_checked

STATES = ("at_init", "trained")


def load_cell(folder: Path, seed: int) -> dict:
    d = load_checked(seed_dir(folder, seed).with_suffix(".pt"),
                     f"an attention analysis: re-create it with dvc repro -f analyze_*@{folder.name}")
    return {s: ModelAnalysis.from_dict(d[s]) for s in STATES}


def _fmt(values) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}" if len(v) > 1 else f"{v.mean():.3f}"


def target_mass_table(runs, impulse_inits, seeds) -> tuple[str, dict]:
    """Mass on the impulse offset (mean over blocks and heads), per seed -> mean ± std."""
    cols = [("at_init", "pseudo"), ("at_init", "images"), ("trained", "pseudo"), ("trained", "images")]
    rows, means = [], {}
    for init in impulse_inits:
        per = {c: [float(getattr(runs[init, s][c[0]], f"target_{c[1]}").mean()) for s in seeds] for c in cols}
        means[init] = {c: float(np.mean(v)) for c, v in per.items()}
        rows.append([report.label(init)] + [_fmt(per[c]) for c in cols])
    headers = ["init", "pseudo-input, at init", "test images, at init", "pseudo-input, trained",
               "test images, trained"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True), means


def distance_arrays(runs, inits, seeds) -> dict:
    """init -> {(state, source): (seeds, L)} mean attention distance, mean over heads."""
    return {init: {(st, src): np.stack([getattr(runs[init, s][st], f"distance_{src}").mean(-1).numpy()
                                        for s in seeds])
                   for st, src in itertools.product(STATES, ("images", "pseudo"))}
            for init in inits}


def distance_table(dist, uniform) -> str:
    depth = next(iter(dist.values()))[("trained", "images")].shape[1]
    rows = [[report.label(init)] + [f"{d[('at_init', 'images')][:, b].mean():.2f} → "
                                    f"{d[('trained', 'images')][:, b].mean():.2f} "
                                    f"(± {d[('trained', 'images')][:, b].std(ddof=1) if len(d[('trained', 'images')]) > 1 else 0:.2f})"
                                    for b in range(depth)]
            for init, d in dist.items()]
    rows.append(["uniform attention"] + [f"{uniform:.2f}"] * depth)
    return tabulate(rows, headers=["init"] + [f"block {b + 1}: at init → trained (± std)" for b in range(depth)],
                    tablefmt="github", disable_numparse=True)


def cka_results(runs, inits, seeds):
    """CKA(at init, trained) per init and CKA between trained inits per block, mean over seeds."""
    reps = {(i, s, st): list(runs[i, s][st].representations) for i in inits for s in seeds for st in STATES}
    init_vs_trained = {i: np.mean([cka_matrix(reps[i, s, "at_init"], reps[i, s, "trained"]).numpy()
                                   for s in seeds], 0) for i in inits}
    depth = len(reps[inits[0], seeds[0], "trained"])
    between = np.zeros((depth, len(inits), len(inits)))
    for (a, ia), (b, ib) in itertools.product(enumerate(inits), repeat=2):
        if a <= b:
            for layer in range(depth):
                v = np.mean([float(cka_matrix([reps[ia, s, "trained"][layer]],
                                              [reps[ib, s, "trained"][layer]])[0, 0]) for s in seeds])
                between[layer, a, b] = between[layer, b, a] = v
    return init_vs_trained, between


def cka_table(init_vs_trained, between, inits) -> str:
    depth = between.shape[0]
    rows = [[report.label(i)] + [f"{init_vs_trained[i][b, b]:.2f}" for b in range(depth)]
            + [f"{np.mean([between[b, a, j] for j in range(len(inits)) if j != a]):.2f}" for b in range(depth)]
            for a, i in enumerate(inits)]
    return tabulate(rows, headers=["init"] + [f"block {b + 1}: init vs trained" for b in range(depth)]
                    + [f"block {b + 1}: vs other inits (mean)" for b in range(depth)],
                    tablefmt="github", disable_numparse=True)


def dataset_section(params, ds, analysis: Path, figures: Path, inits, impulse_inits, seeds) -> str:
    runs = {(i, s): load_cell(analysis / f"{ds}-{i}", s) for i in inits for s in seeds}
    first = runs[inits[0], seeds[0]]["at_init"]
    gh = (first.profile_images.shape[-2] + 1) // 2
    gw = (first.profile_images.shape[-1] + 1) // 2
    uniform = attention_fig.uniform_distance((gh, gw))
    one_seed = {i: runs[i, seeds[0]] for i in inits}
    for source, name in (("images", "averaged over the test images"), ("pseudo", "on the pseudo-input")):
        save_figure(attention_fig.profile_grid(one_seed, source, f"{ds}: attention by offset from the "
                                               f"query, {name} (seed {seeds[0]})"),
                    figures / f"attention_{source}_{ds}.png")
    kernels = {i: int(i.removeprefix("impulse")) for i in impulse_inits}
    save_figure(attention_fig.kernel_grids({i: one_seed[i] for i in impulse_inits}, kernels),
                figures / f"impulse_kernels_{ds}.png")
    dist = distance_arrays(runs, inits, seeds)
    save_figure(attention_fig.distance_plot(dist, uniform, first.distance_images.shape[0]),
                figures / f"mean_distance_{ds}.png")
    init_vs_trained, between = cka_results(runs, inits, seeds)
    save_figure(cka_figure(init_vs_trained, between, inits, len(seeds)), figures / f"cka_{ds}.png")

    mass_table, mass = target_mass_table(runs, impulse_inits, seeds)
    mass_text = "; ".join(
        f"{report.label(i)}: {m[('at_init', 'pseudo')]:.3f} on the pseudo-input, "
        f"{m[('at_init', 'images')]:.3f} on test images at init "
        f"({m[('at_init', 'pseudo')] / max(m[('at_init', 'images')], 1e-12):.1f}× less), "
        f"{m[('trained', 'images')]:.3f} after training" for i, m in mass.items())
    trained = {i: dist[i][("trained", "images")].mean(1).tolist() for i in inits}
    between_inits = stats.compare_all(trained, family=f"{ds}, trained, test images")
    per_init = [c for i in inits for c in stats.compare_all(
        {f"{i} at init": dist[i][("at_init", "images")].mean(1).tolist(), f"{i} trained": trained[i]},
        family=f"{ds}, {report.label(i)}")]
    state_label = lambda key: (report.label(key.rsplit(" ", 2)[0]) + " " + " ".join(key.split(" ")[1:])  # noqa: E731
                               if " " in key else report.label(key))
    return (f"## {ds}\n\n"
            f"Uniform attention on this {gh}×{gw} patch grid has a mean distance of {uniform:.2f} patches.\n\n"
            "### Mass on each head's impulse offset (structured init)\n\n"
            "Mean attention a query puts on the key at its head's assigned offset, averaged over "
            f"blocks, heads and queries; mean ± std over seeds (n = {len(seeds)}). A one-hot "
            f"target is 1; uniform attention gives 1/{gh * gw} = {1 / (gh * gw):.3f}.\n\n"
            + mass_table + "\n\n"
            f"Measured: {mass_text}. The solve fits the maps on the pseudo-input (the position "
            "encoding alone); real tokens add the patch content to it, which spreads the attention.\n\n"
            f"![attention on the pseudo-input](figures/attention/attention_pseudo_{ds}.png)\n\n"
            f"![attention on test images](figures/attention/attention_images_{ds}.png)\n\n"
            f"![impulse kernels](figures/attention/impulse_kernels_{ds}.png)\n\n"
            "### Mean attention distance (test images)\n\n"
            "Σ_j a_ij·‖p_i − p_j‖ in patches, averaged over queries and heads: per block, at init → "
            f"trained (± std of the trained value over seeds, n = {len(seeds)}).\n\n"
            + distance_table(dist, uniform) + "\n\n"
            f"![mean attention distance](figures/attention/mean_distance_{ds}.png)\n\n"
            + stats.conclusions_block(between_inits + per_init, state_label, unit="patches",
                                      title=f"Conclusions ({ds}): does attention stay local?")
            + "\n(Distance per seed = mean over blocks and heads, on the test images.)\n\n"
            "### CKA (test images)\n\n"
            "Linear CKA of each block's token-mean output: a model's block at init vs the same block "
            "trained (1 = the same representation up to rotation and scale), and the same block of "
            "two trained models with different initializers, averaged over the other initializers "
            f"(same seed, mean over {len(seeds)} seeds).\n\n"
            + cka_table(init_vs_trained, between, inits) + "\n\n"
            f"![CKA](figures/attention/cka_{ds}.png)\n\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--analysis", default="artifacts/analysis")
    ap.add_argument("--out", default="reports/attention.md")
    ap.add_argument("--figures", default="reports/figures/attention")
    a = ap.parse_args()
    params = load_params()
    grid = params["grid"]
    impulse_inits = [impulse_name(k) for k in grid["kernels"]]
    inits = list(grid["baselines"]) + impulse_inits
    missing = [str(seed_dir(Path(a.analysis) / f"{d}-{i}", s)) + ".pt"
               for d, i, s in itertools.product(grid["datasets"], inits, grid["seeds"])
               if not seed_dir(Path(a.analysis) / f"{d}-{i}", s).with_suffix(".pt").exists()]
    if missing:
        raise SystemExit(f"missing analyses for {len(missing)} run(s): {missing}")
    sections = [dataset_section(params, ds, Path(a.analysis), Path(a.figures), inits, impulse_inits,
                                grid["seeds"]) for ds in grid["datasets"]]
    text = ("# Attention and representations: what each initializer does, at init and after training\n\n"
            "What ran: " + report.what_ran(params, grid["datasets"], grid["seeds"]) + " The main grid's "
            "models (seed by seed), rebuilt at initialization and loaded trained, on the first "
            "test images (stage analyze). Attention figures show the first seed; tables and "
            "conclusions use every seed.\n\n"
            "How to read the attention figures: each small image is one head's attention by offset "
            "from the query (centre, +), averaged over queries: a structured-init head starts as a "
            "bright pixel at its impulse offset (outlined); uniform attention is flat.\n\n"
            + "".join(sections)
            + "The paper shows attention maps as figures only: it reports no attention mass, "
            "distance or CKA numbers (its reviewers asked for a representation analysis). Its main "
            "table, for reference:\n\n"
            + report.paper_main_block())
    write_text(a.out, text)
    print(text[:2000])


if __name__ == "__main__":
    run_stage(main)
