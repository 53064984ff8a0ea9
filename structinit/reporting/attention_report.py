"""The attention report (reports/attention.md and its figures), from the analyze stages' outputs.

Answers, per dataset: does the structured init's attention survive real images and training
(mass on each head's impulse offset), does attention stay local after training (mean attention
distance), and do the initializers lead to different representations (CKA).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from structinit.analysis.model import ModelAnalysis
from structinit.errors import StructinitError
from structinit.io import MissingFileError, load_checked
from structinit.pipeline import cells
from structinit.pipeline.cells import impulse_kernel, main_cell, main_stage, seed_dir
from structinit.reporting import attention_tables as summary
from structinit.reporting.budget import budget_sentences, read_budget_finals
from structinit.reporting import stats
from structinit.reporting import tables as report
from structinit.reporting.figures import attention as attention_fig
from structinit.reporting.figures import cka as cka_fig
from structinit.reporting.figures.style import save_figure
from structinit.reporting.presentation import init_label
from structinit.reporting.runs import ran_with_by_dataset


def load_run(analysis: Path, ds: str, init: str, seed: int) -> dict:
    """One seed's analysis of one main-grid cell: state -> ModelAnalysis."""
    d = load_checked(seed_dir(analysis / main_cell(ds, init), seed).with_suffix(".pt"),
                     f"an attention analysis: re-create it with dvc repro -f {main_stage('analyze', ds, init)}")
    return {s: ModelAnalysis.from_dict(d[s]) for s in summary.STATES}


def load_gpu_analysis(path: Path, ds: str, inits: list[str], seeds: list[int]) -> dict:
    """A GPU dataset's compact analysis (stages/analyze_gpu.py), checked to be of the main grid
    as params.yaml has it: {"runs", "cka", "images"} for dataset_section."""
    d = load_checked(path, f"{ds}'s attention analysis: made on a GPU machine by "
                           "python -m tools.fashion_mnist --grid (docs/fashion-mnist.md)")
    if d["inits"] != list(inits) or d["seeds"] != list(seeds):
        raise StructinitError(
            f"{path} analyses initializers {d['inits']} and seeds {d['seeds']}; the main grid (params.yaml) has "
            f"{list(inits)} and {list(seeds)}. A GPU dataset's cells are at the settings they were trained at: "
            f"run the experiment without it, dvc exp run -S 'grid.gpu_datasets=[]' (with your other -S), or "
            f"its grid again on a GPU, python -m tools.fashion_mnist --grid (docs/fashion-mnist.md)")
    runs, init_vs_trained, between = summary.expand(d)
    return {"runs": runs, "cka": (init_vs_trained, between), "images": d["images"]}


def dataset_section(ds, runs: dict, figures: Path, *, inits, impulse_inits, seeds, images: int,
                    cka: tuple[dict, dict] | None = None) -> str:
    """One dataset's section. runs: (init, seed) -> {state: ModelAnalysis}; cka: the CKA
    matrices (init vs trained, between inits) where they were computed already (a GPU
    dataset's compact analysis, whose runs hold no representations)."""
    first = runs[inits[0], seeds[0]]["at_init"]
    gh = (first.profile_images.shape[-2] + 1) // 2
    gw = (first.profile_images.shape[-1] + 1) // 2
    uniform = attention_fig.uniform_distance((gh, gw))
    one_seed = {i: runs[i, seeds[0]] for i in inits}
    vmax = attention_fig.profile_vmax(one_seed)
    for source, name in (("images", "averaged over the test images"), ("pseudo", "on the pseudo-input")):
        save_figure(attention_fig.profile_grid(one_seed, source, f"{ds}: attention by offset from the "
                                               f"query, {name} (seed {seeds[0]})", vmax),
                    figures / f"attention_{source}_{ds}.png")
    kernels = {i: impulse_kernel(i) for i in impulse_inits}
    save_figure(attention_fig.kernel_grids({i: one_seed[i] for i in impulse_inits}, kernels),
                figures / f"impulse_kernels_{ds}.png")
    dist = summary.distances(runs, inits, seeds)
    save_figure(attention_fig.distance_plot(dist, uniform, first.distance_images.shape[0]),
                figures / f"mean_distance_{ds}.png")
    init_vs_trained, between = cka or (summary.cka_init_vs_trained(runs, inits, seeds),
                                       summary.cka_between_inits(runs, inits, seeds))
    save_figure(cka_fig.init_vs_trained_figure(init_vs_trained, len(seeds), ds),
                figures / f"cka_init_vs_trained_{ds}.png")
    save_figure(cka_fig.between_inits_figure(between, inits, len(seeds), ds),
                figures / f"cka_between_inits_{ds}.png")

    mass = summary.target_mass(runs, impulse_inits, seeds)
    mean = lambda v: float(np.mean(v))  # noqa: E731
    mass_text = "; ".join(
        f"{init_label(i)}: {mean(m['at_init', 'pseudo']):.3f} on the pseudo-input, "
        f"{mean(m['at_init', 'images']):.3f} on test images at init "
        f"({mean(m['at_init', 'pseudo']) / max(mean(m['at_init', 'images']), 1e-12):.1f}× less), "
        f"{mean(m['trained', 'images']):.3f} after training" for i, m in mass.items())
    per_seed = lambda i, state: dict(zip(seeds, dist[i][(state, "images")].mean(1).tolist()))  # noqa: E731
    # planned: each initializer's trained model against itself at init (paired by model: the
    # same seed's network before and after), Holm over the initializers; between initializers,
    # trained: described (paired by seed), not tested
    init_vs_trained_tests = stats.planned_contrasts(
        {**{f"{i} trained": per_seed(i, "trained") for i in inits},
         **{f"{i} at init": per_seed(i, "at_init") for i in inits}},
        family=f"{ds}, trained vs at init", secondary=[(f"{i} trained", f"{i} at init") for i in inits],
        describe_others=False)
    between_inits = stats.planned_contrasts({i: per_seed(i, "trained") for i in inits},
                                      family=f"{ds}, trained, between initializers")
    stuck = summary.barely_trained(init_vs_trained)
    caveat = ("" if not stuck else
              "Caveat, generated: " + ", ".join(init_label(i) for i in stuck) + " kept every block's "
              "representation through training (CKA with itself at init ≥ 0.95): "
              + ("its" if len(stuck) == 1 else "their") + " trained rows describe the initialization, "
              "not what training makes of it (see the main table's accuracy).\n\n")
    state_label = lambda key: (init_label(key.split(" ")[0]) + " " + " ".join(key.split(" ")[1:])  # noqa: E731
                               if " " in key else init_label(key))
    cka_figures = (f"![CKA, init vs trained](figures/attention/cka_init_vs_trained_{ds}.png)\n\n"
                   f"![CKA between initializers](figures/attention/cka_between_inits_{ds}.png)\n\n")
    return (f"## {ds}\n\n"
            f"{images} test images (the first of the test set). Uniform attention on this {gh}×{gw} "
            f"patch grid has a mean distance of {uniform:.2f} patches.\n\n"
            + caveat
            + "### Mass on each head's impulse offset (structured init)\n\n"
            "Mean attention a query puts on the key at its head's assigned offset, averaged over "
            f"blocks, heads and queries; mean ± std over seeds (n = {len(seeds)}). A one-hot "
            f"target is 1; uniform attention gives 1/{gh * gw} = {1 / (gh * gw):.3f}.\n\n"
            + summary.target_mass_table(mass) + "\n\n"
            f"Measured: {mass_text}. The solve fits the maps on the pseudo-input (the position "
            "encoding alone); real tokens add the patch content to it, which spreads the attention.\n\n"
            "The two figures below share one colour scale: each small image is a head's mean attention "
            "by offset (m, n) from the query (centre, +), |m|, |n| up to half the grid; the head's "
            "impulse offset is outlined.\n\n"
            f"![attention on the pseudo-input](figures/attention/attention_pseudo_{ds}.png)\n\n"
            f"![attention on test images](figures/attention/attention_images_{ds}.png)\n\n"
            f"![impulse kernels](figures/attention/impulse_kernels_{ds}.png)\n\n"
            "### Mean attention distance (test images)\n\n"
            "Σ_j a_ij·‖p_i − p_j‖ in patches, averaged over queries and heads: per block, at init → "
            f"trained (± std of the trained value over seeds, n = {len(seeds)}). Lower = more local.\n\n"
            + summary.distance_table(dist, uniform) + "\n\n"
            f"![mean attention distance](figures/attention/mean_distance_{ds}.png)\n\n"
            + stats.contrasts_block(init_vs_trained_tests + between_inits, state_label, unit="patches",
                                    title=f"Conclusions ({ds}): does attention stay local?")
            + "\n\"A > B\" here means A's attention reaches *farther* (less local) than B's. Distance "
            "per seed = mean over blocks and heads, on the test images. Planned: each initializer "
            "trained vs at init, paired by model (Holm over the initializers).\n\n"
            "### CKA (test images)\n\n"
            "Linear CKA of each block's output averaged over tokens (one vector per image): a "
            "model's block at init vs the same block trained (1 = the same representation up to "
            "rotation and scale), and the same block of trained models with other initializers "
            f"(same seed, mean over {len(seeds)} seeds).\n\n"
            + summary.cka_table(init_vs_trained, between) + "\n\n" + cka_figures)


def attention_report(params: dict, analysis: Path, results: Path, figures: Path,
                     epoch_budgets: Path | None = None, gpu_analysis: Path | None = None) -> str:
    """The report's markdown; writes its figures under `figures`. analysis: the analyze stages'
    folder; results: the trained cells' (their logged dtype and CPU, for "What ran");
    epoch_budgets: the epoch evidence's folder (results/evidence/epoch_budget), whether
    the trained models' budget is converged; gpu_analysis: the folder of the GPU datasets'
    compact analyses (<dataset>.pt, stage analyze_gpu), a section each where one is there."""
    analysis, results, figures = Path(analysis), Path(results), Path(figures)
    grid = params["grid"]
    inits = cells.main_inits(params)
    impulse_inits = [i for i in inits if impulse_kernel(i)]
    gpu = cells.gpu_datasets(params)        # trained by a GPU in frozen stages, analysed there (analyze_gpu)
    gpu_files = {ds: Path(gpu_analysis) / f"{ds}.pt" for ds in gpu if gpu_analysis is not None}
    gpu_done = [ds for ds in gpu if ds in gpu_files and gpu_files[ds].exists()]
    gpu_runs = {ds: load_gpu_analysis(gpu_files[ds], ds, inits, grid["seeds"]) for ds in gpu_done}
    analysed = [(d, i, s) for d, i, s in cells.main_runs(params) if d not in gpu]
    missing = [str(seed_dir(analysis / main_cell(d, i), s)) + ".pt"
               for d, i, s in analysed
               if not seed_dir(analysis / main_cell(d, i), s).with_suffix(".pt").exists()]
    if missing:
        raise MissingFileError(f"missing analyses for {len(missing)} run(s): {missing}")
    first_run = lambda ds: seed_dir(analysis / main_cell(ds, inits[0]), grid["seeds"][0])  # noqa: E731
    images = {ds: load_checked(first_run(ds).with_suffix(".pt"),
                               "an attention analysis")["images"] for ds in grid["datasets"]}
    sections = [dataset_section(ds, {(i, s): load_run(analysis, ds, i, s) for i in inits for s in grid["seeds"]},
                                figures, inits=inits, impulse_inits=impulse_inits, seeds=grid["seeds"],
                                images=images[ds]) for ds in grid["datasets"]]
    sections += [dataset_section(ds, gpu_runs[ds]["runs"], figures, inits=inits, impulse_inits=impulse_inits,
                                 seeds=grid["seeds"], images=gpu_runs[ds]["images"], cka=gpu_runs[ds]["cka"])
                 for ds in gpu_done]
    reported = [*grid["datasets"], *gpu_done]
    text = ("# Attention and representations: what each initializer does, at init and after training\n\n"
            "What ran: " + report.what_ran(params, reported, grid["seeds"], ran_with_by_dataset(
                {ds: [seed_dir(results / main_cell(d, i), s) for d, i, s in cells.main_runs(params) if d == ds]
                 for ds in reported}))
            + budget_sentences(read_budget_finals(epoch_budgets, grid["datasets"]),
                               {ds: params["recipes"][ds]["train"]["epochs"] for ds in reported},
                               init_label)
            + "".join(f" {ds} (grid.gpu_datasets) is not analysed: its analysis (stage analyze_gpu, run on the "
                      "GPU machine after its cells) is not here (docs/fashion-mnist.md)."
                      for ds in gpu if ds not in gpu_done)
            + " The main grid's "
            "models (seed by seed), rebuilt at initialization and loaded trained, on the first "
            "test images (stage analyze" + (", and analyze_gpu on the GPU machine for "
                                            + ", ".join(gpu_done) if gpu_done else "")
            + "). Attention figures show the first seed; tables and "
            "conclusions use every seed.\n\n"
            "How to read the attention figures: each small image is one head's attention by offset "
            "from the query (centre, +), averaged over queries: a structured-init head starts as a "
            "bright pixel at its impulse offset (outlined); uniform attention is flat.\n\n"
            + "".join(sections)
            + "The paper shows attention maps as figures only: it reports no attention mass, "
            "distance or CKA numbers (its reviewers asked for a representation analysis). Its main "
            "table, for reference:\n\n"
            + report.paper_main_block())
    return text
