"""The main grid's reports: main_table.md, kernel_table.md, preopt_table.md, their
conclusions, summary.json (the headline for `dvc metrics diff`) and cells.csv, from every cell
of the current grid.

The expected cells are rebuilt from params.yaml, so a grid that shrinks leaves no stale
rows, and a missing cell fails, naming it (no silent holes in a table).
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from structinit.errors import ConfigError
from structinit.records import evidence_freshness, unmeasured_line
from structinit.io import MissingFileError
from structinit.pipeline import cells
from structinit.pipeline.cells import main_cell, run_name, seed_dir, solve_cell
from structinit.reporting import paper, stats
from structinit.reporting.budget import budget_sentence, budget_sentences, doubled_contrast_sentence, read_budget_finals
from structinit.reporting.figures.main import write_main_figures
from structinit.reporting import tables as report
from structinit.reporting.presentation import init_label
from structinit.reporting.runs import ran_with_by_dataset, read_cell


@dataclass(frozen=True)
class Plan:
    """params.yaml's `contrasts`, with "ours" resolved to impulse<init.kernel>."""
    primary: tuple[str, str]
    secondary: list[tuple[str, str]]
    alternative: str
    alpha: float
    registered: tuple[str, str] | None = None   # the primary as registered (contrasts.registered)

    def exploratory_note(self, label=str) -> str:
        """A paragraph when this run's primary is not the registered one ("" otherwise)."""
        if self.registered is None or self.registered == self.primary:
            return ""
        now, then = (" − ".join(label(x) for x in pair) for pair in (self.primary, self.registered))
        return (f"**Exploratory.** This run's primary contrast, {now}, is not the one registered before "
                f"the committed run ({then}: params.yaml contrasts.registered), e.g. after -S init.kernel: "
                "a primary picked after seeing a table is a new hypothesis, and its p is not a test of it.\n\n")

    def not_run(self, arms) -> str:
        """A line naming the planned contrasts this grid could not test (an arm not trained)."""
        missing = [f"{a} vs {b}" for a, b in [self.primary] + self.secondary if a not in arms or b not in arms]
        return (f"\nPlanned but not run (an arm is not in this grid): {', '.join(missing)}.\n" if missing else "")


def planned(params: dict) -> Plan:
    c = params["contrasts"]
    return Plan(cells.planned_contrast(params, c["primary"]),
                [cells.planned_contrast(params, t) for t in c["secondary"]], c["direction"], c["alpha"],
                cells.parse_contrast(c["registered"]) if c.get("registered") else None)


def by_seed(runs: pd.DataFrame, dataset: str, init: str, value: str = "acc") -> dict:
    """{seed: value} of one arm on one dataset: what the paired tests match."""
    rows = runs[(runs.dataset == dataset) & (runs.init == init)]
    return dict(zip(rows.seed.tolist(), rows[value].tolist()))


def main_contrasts(runs: pd.DataFrame, dataset: str, inits: list[str], plan: Plan) -> list[stats.Contrast]:
    """The planned contrasts on one dataset, paired by seed, and every other pair described."""
    return stats.planned_contrasts({i: by_seed(runs, dataset, i) for i in inits}, family=dataset,
                                   primary=plan.primary, secondary=plan.secondary,
                                   alternative=plan.alternative, alpha=plan.alpha)


def speed_epoch(train: dict, fraction: float) -> int:
    """The epoch the speed endpoint reads: the first evaluated epoch (a multiple of eval_every,
    or the last) at or after `fraction` of the recipe's epochs (160 epochs, every 5, 1/8: 20)."""
    epochs, every = train["epochs"], train.get("eval_every", 1) or 1
    target = max(1, math.ceil(fraction * epochs - 1e-9))
    return min([e for e in range(every, epochs + 1, every) if e >= target] + [epochs])


def run_row(cell: Path, seed: int, speed_epoch: int | None, planned_at: str = "contrasts.speed") -> dict:
    """One run's row of cells.csv: its final/best accuracy and epochs, and, where params.yaml
    plans a speed endpoint (at `planned_at`), its test accuracy (%) at that epoch."""
    row, curve = read_cell(cell, seed)
    if speed_epoch is not None:
        at = curve[curve.epoch == speed_epoch]
        if at.empty:
            raise MissingFileError(f"{run_name(cell.name, seed)} has no test accuracy at epoch {speed_epoch} "
                                   f"({planned_at}); it was tested at epochs {curve.epoch.tolist()[:6]}...")
        row["speed_acc"] = 100 * float(at["acc"].iloc[0])
    return row


def speed_section(runs: pd.DataFrame, datasets: list[str], inits: list[str], speed: dict, ours: str,
                  at: dict, epochs: dict, alpha: float, label=str, exploratory: str = "",
                  retest=lambda c: "") -> str:
    """The planned speed endpoint: each arm's test accuracy at the epoch `at[dataset]`
    (speed_epoch: contrasts.speed.fraction of the budget) and its primary pair, paired by seed.
    The endpoint was fixed after these seeds' curves were committed, so here it only describes:
    the pair is recorded as planned (the replication stage tests it on new seeds) but printed
    without a verdict, followed by retest(c), its test on new seeds."""
    pair = cells.parse_contrast(speed["primary"], ours)
    if exploratory:
        exploratory = exploratory.replace("This run's primary contrast", "As the main primary, the speed "
                                          "endpoint's pair follows init.kernel: this run's primary contrast")
    rows, contrasts = [], []
    for ds in datasets:
        groups = {i: by_seed(runs, ds, i, "speed_acc") for i in inits}
        for i, g in groups.items():
            s = stats.summarize(list(g.values()))
            rows.append(f"| {ds} | {at[ds]} | {label(i)} | {s.mean:.2f} ± {s.std:.2f} |")
        contrasts += stats.planned_contrasts(groups, family=f"{ds}, epoch {at[ds]}", primary=pair, alpha=alpha,
                                             describe_others=False)
    if not contrasts:
        return ""
    stats.record_tested(contrasts, alpha)
    lines = [stats.contrast_line(replace(c, role="descriptive"), label) + " (described: no verdict on the seeds "
             "that fixed the endpoint)" + (retest(c) or
                                           "\n  Not yet tested on new seeds (stage replication).")
             for c in contrasts]
    budget = ", ".join(f"{ds}: epoch {at[ds]} of {epochs[ds]}" for ds in datasets)
    return (f"## Speed endpoint: test accuracy at {speed['fraction']:g} of the budget\n\n"
            f"Planned in params.yaml (contrasts.speed: the first tested epoch at or after that fraction; {budget}): "
            "how far each initializer has got early on, where the paper's later version claims the structured "
            "init converges faster. A second endpoint beside the primary, tested alone at α, not adjusted for "
            "it. It was fixed from earlier evidence (test accuracy at 40 epochs on another CPU, "
            "benchmarks/epochs_intel.csv), but after these seeds' curves "
            "had been committed, though not read there: on these seeds it describes; it tests only on new ones. "
            "Mean ± std over seeds, accuracy in %.\n\n"
            "| dataset | epoch | initializer | test acc |\n|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
            + exploratory + "### Speed endpoint: its pair\n\n" + "\n".join(lines) + "\n")


def replication_sentence(record: dict | None, c: stats.Contrast, seeds: list, label=str,
                         verdict_here: bool = True) -> str:
    """One sentence on the replication of primary contrast c (record: the replication stage's
    replication.json, structinit/evidence/replication.py), "\n  "-prefixed; "" where the record replicated
    other results: another contrast, other seeds, or other numbers for the same seeds (another
    CPU's bytes, another trainer, an experiment's params), since it says nothing about these."""
    for r in (record or {}).get("primary", []):
        stated, again = r["stated"], r["replication"]
        if ((r["dataset"], r["a"], r["b"]) != (c.family, c.a, c.b) or list(stated["seeds"]) != list(seeds)
                or not math.isclose(stated["diff"], c.diff, rel_tol=0, abs_tol=1e-9)):
            continue
        found = ("not distinguishable from 0" if again["verdict"] == "~"
                 else f"distinguishable from 0 ({label(c.a)} {again['verdict']} {label(c.b)})")
        has_ci = all(isinstance(again.get(k), (int, float)) and not math.isnan(again[k]) for k in ("ci_low", "ci_high"))
        ci = f", 95 % CI [{again['ci_low']:+.2f}, {again['ci_high']:+.2f}]" if has_ci else ""
        pooled = r.get("pooled_post_hoc")
        report = record.get("report", "results/evidence/replication/replication.md")
        return (f"\n  {'Re-tested' if verdict_here else 'Tested'} on seeds {_seed_range(again['seeds'])} ({report}; "
                f"{record.get('computed_on') or 'unrecorded dtype and CPU'}): {label(c.a)} − {label(c.b)} "
                f"{again['diff']:+.2f} points{ci}, p = {again['p']:.2g}, {found}"
                + (f"; against this table's verdict: {r['verdict']}" if verdict_here else "")
                + ("" if not pooled else
                   f". Both halves pooled, post hoc (n = {pooled['n']}, decided after both were seen): "
                   f"{pooled['diff']:+.2f} [{pooled['ci_low']:+.2f}, {pooled['ci_high']:+.2f}]") + ".")
    return ""


def _seed_range(seeds: list) -> str:
    s = sorted(seeds)
    return f"{s[0]}–{s[-1]}" if s == list(range(s[0], s[-1] + 1)) and len(s) > 2 else ", ".join(map(str, s))


def detectable_line(c: stats.Contrast, alpha: float, unit: str = "points") -> str:
    """Beside the primary: the smallest true difference its design detects (80 % power, the
    exact noncentral t at n - 1 df, the contrast's own alpha and sidedness, from its own SD of
    paired differences), so that "not distinguishable" reads with the effect it could have seen."""
    d = stats.min_detectable_difference(c.sd, c.n, alpha, alternative=c.alternative)
    if math.isnan(d):
        return f"  Detectable with this design: not computable (n = {c.n}, SD of paired differences {c.sd:.2f})."
    return (f"  Detectable with this design: {d:.2f} {unit} ({100 * stats.POWER:.0f} % power, paired t at "
            f"α = {alpha:g} {'two-sided' if c.alternative == 'two-sided' else 'one-sided'}, exact noncentral t "
            f"at {c.n - 1} df, SD of the {c.n} paired differences {c.sd:.2f}); a smaller true difference "
            f"is likely to read as not distinguishable. The SD is itself an estimate from {c.n - 1} df: "
            "the true one, and with it this difference, may well be half or twice as large.")


def confound_section(contrasts: dict, datasets: list[str], ours: str, alpha: float) -> str:
    """What the confound arm (beyond the paper) shows: Mimetic sets Q/K *and* V/proj, the
    structured init only Q/K, so "Imp.-k vs Mimetic" mixes the two. Mimetic Q/K only has
    Mimetic's Q/K (the same draw) and Trunc Normal's V/proj."""
    lines = []
    for ds in datasets:
        by = {(c.a, c.b): c for c in contrasts[ds]}
        for pair, what in ((("mimetic_qk", "mimetic"), "what Mimetic's V/proj adds (the Q/K are the same draw)"),
                           (("mimetic_qk", ours), "the two attention initializations at the same V/proj "
                                                 "(Trunc Normal's)")):
            c = by.get(pair) or by.get(pair[::-1])
            if c is not None:
                lines.append(stats.contrast_line(c, init_label, alpha)[2:] + f" — {what}")
    if not lines:
        return ""
    return ("\n## The confound arm (beyond the paper)\n\n"
            "Mimetic initializes W_q·W_k *and* W_v·W_proj; the structured init touches only Q/K, so "
            "\"Imp.-k vs Mimetic\" mixes attention structure with V/proj scale. \"Mimetic Q/K only\" "
            "has Mimetic's Q/K (the same draw at each seed) and Trunc Normal's V/proj:\n\n"
            + "\n".join(f"- {line}" for line in lines) + "\n\n")


@dataclass
class MainReports:
    texts: dict          # file name -> markdown
    conclusions: dict    # file name -> its conclusions record (stats.conclusions_record)
    summary: dict        # summary.json
    runs: pd.DataFrame   # cells.csv: one row per trained run


def main_reports(params: dict, results: Path, preopt: Path, reference: Path, figures: Path,
                 epoch_budgets: Path | None = None, replication: Path | None = None) -> MainReports:
    """results: the trained cells; preopt / reference: the Q/K solves' and the official
    solver's records (stages preoptimize and reference_solve); figures: where the main figure
    goes (<dataset>.png); epoch_budgets: the epoch_budget stage's folder (results/evidence/
    epoch_budget), its epochs.csv drawn beside it where it has the dataset and is fresh;
    replication: the replication stage's folder (results/evidence/replication), its
    replication.json quoted in the headline where it replicated this very primary contrast
    (replication_sentence) and is fresh (structinit.records), else one line saying it was not
    measured on these cells. Both evidence folders' records name paths relative to the working
    directory (the repository root, where stages run)."""
    results, preopt, reference, figures = Path(results), Path(preopt), Path(reference), Path(figures)
    grid, kernel = params["grid"], params["init"]["kernel"]
    if kernel not in grid["kernels"]:
        raise ConfigError(f"init.kernel={kernel} is not in grid.kernels={grid['kernels']}: the headline "
                          f"('ours') must be a trained cell. Run e.g. dvc exp run -S init.kernel={kernel} "
                          f"-S 'grid.kernels={sorted(set(grid['kernels']) | {kernel})}'")
    inits, ours = cells.main_inits(params), cells.ours(params)
    expected = cells.main_runs(params)
    missing = [run_name(main_cell(d, i), s) for d, i, s in expected
        if not (seed_dir(results / main_cell(d, i), s) / "metrics.json").exists()]
    if missing:
        raise MissingFileError(f"missing results for {len(missing)} run(s) (cell-seed): {missing}")
    speed = params["contrasts"].get("speed")
    datasets = cells.table_datasets(params)        # the CPU's and the GPU's columns
    speed_at = {d: speed_epoch(params["recipes"][d]["train"], speed["fraction"]) for d in datasets} \
        if speed else {}
    runs = pd.DataFrame([{"dataset": d, "init": i, "seed": s,
                          **run_row(results / main_cell(d, i), s, speed_at.get(d))} for d, i, s in expected])
    # a GPU dataset solves its Q/K in its training stage and keeps no solve records
    solves = list(itertools.product(grid["datasets"], grid["kernels"], grid["seeds"]))

    def record(folder, d, k, s):
        return json.loads(seed_dir(folder / solve_cell(d, k), s).with_suffix(".json").read_text())
    preopt_runs = pd.DataFrame([record(preopt, *solve) for solve in solves])
    reference_runs = [record(reference, *solve) for solve in solves]
    preopt_runs["official_target_mass"] = [r["target_mass"] for r in reference_runs]
    preopt_runs["official_fit_mse"] = [r["fit_mse"] for r in reference_runs]

    budgets = read_budget_finals(epoch_budgets, grid["datasets"])
    epochs = {ds: params["recipes"][ds]["train"]["epochs"] for ds in datasets}
    figure_paths = write_main_figures(runs, datasets, inits, figures, budgets, epochs)
    figures_md = "".join(f"![{path.stem}: each seed's accuracy per initializer]"
                         f"(figures/{figures.name}/{path.name})\n\n" for path in figure_paths)
    texts = {}
    run = report.what_ran(params, datasets, grid["seeds"], ran_with_by_dataset(
        {ds: [seed_dir(results / main_cell(d, i), s) for d, i, s in expected if d == ds]
         for ds in cells.main_datasets(params)}))
    run += budget_sentences(budgets, epochs, init_label)
    plan = planned(params)
    replicated, unreplicated = None, ""
    if replication and (replication / "replication.json").exists():
        if evidence_freshness(replication).fresh:
            replicated = json.loads((replication / "replication.json").read_text())
        else:
            unreplicated = "\n  " + unmeasured_line("replication") + "."
    contrasts = {ds: main_contrasts(runs, ds, inits, plan) for ds in datasets}
    with stats.recording_conclusions() as main_conclusions:
        def primary_note(c):            # what its design detects; the contrast at double the budget
            return detectable_line(c, plan.alpha) + doubled_contrast_sentence(
                budgets.get(c.family), epochs.get(c.family), c.a, c.b, init_label, c.family)
        main_block = stats.contrasts_block([c for ds in datasets for c in contrasts[ds]], init_label,
                                           alpha=plan.alpha, primary_note=primary_note) + plan.not_run(inits)
        speed_block = speed_section(runs, datasets, inits, speed, ours, speed_at, epochs,
                                    plan.alpha, init_label, plan.exploratory_note(init_label),
                                    retest=lambda c: replication_sentence(replicated, c, grid["seeds"], init_label,
                                                                          verdict_here=False)
                                    or unreplicated) if speed else ""
    impulse_rows = [i for i in inits if cells.impulse_kernel(i)]
    kernel_cmp = [c for ds in datasets for c in stats.planned_contrasts(
        {i: by_seed(runs, ds, i) for i in impulse_rows}, family=ds)]
    with stats.recording_conclusions() as kernel_conclusions:
        kernel_block = stats.contrasts_block(kernel_cmp, init_label, title="Differences between kernels") + (
            "\nThe planned test of Imp.-3 vs Imp.-5, where params.yaml names it, is in main_table.md.\n")
    confound = confound_section(contrasts, datasets, ours, plan.alpha)
    table = report.main_table(runs, datasets, inits, ours)
    texts["main_table.md"] = (
        "# Main table: test accuracy (%) by initializer\n\n"
        "Final-epoch top-1, mean ± std over seeds; in brackets the difference of the means to "
        "Trunc Normal; n = seeds. " + stats.INTERVAL[0].upper() + stats.INTERVAL[1:] + ". \"paper\" is "
        "the paper's single-run number (ViT-T/2, 200 epochs) where it has one.\n\n"
        f"What ran: {run}\n\n"
        + figures_md
        + table + "\n\n"
        + plan.exploratory_note(init_label) + main_block + "\n" + confound
        + (speed_block + "\n" if speed_block else "")
        + report.paper_main_block())
    primary_lines = [stats.contrast_line(c, init_label, plan.alpha) + "\n" + detectable_line(c, plan.alpha)
                     + (replication_sentence(replicated, c, grid["seeds"], init_label) or unreplicated)
                     + doubled_contrast_sentence(budgets.get(c.family), epochs.get(c.family), c.a, c.b, init_label,
                                                 c.family)
                     for ds in datasets for c in contrasts[ds] if c.role == "primary"]
    texts["headline.md"] = (            # what the top-level README quotes (tests/test_readme_numbers.py)
        table + "\n\n"
        "Final-epoch test accuracy (%), mean ± std over seeds (in brackets: difference to Trunc Normal), "
        f"n = {len(grid['seeds'])} seeds. " + stats.INTERVAL[0].upper() + stats.INTERVAL[1:] + ". "
        "Primary contrast, paired by seed:\n\n" + plan.exploratory_note(init_label) + "\n".join(primary_lines) + "\n"
        + "".join(f"\n{ds}: {budget_sentence(budgets[ds], epochs[ds], init_label)}.\n" for ds in budgets))
    texts["kernel_table.md"] = (
        "# Structured init by kernel size\n\n"
        f"What ran: {run}\n\n"
        "init target mass: mean attention on the target key of the init that ran; official "
        "solver's mass: the paper's own solver (10,000 Adam steps) on the same shape, offsets "
        "and seeds (stage reference_solve).\n\n"
        + report.kernel_table(runs, preopt_runs, grid["datasets"], grid["kernels"], kernel) + "\n\n"
        + kernel_block + "\n"
        + report.paper_main_block([i for i in paper.MAIN if cells.impulse_kernel(i)]))
    texts["preopt_table.md"] = (
        "# Pre-optimization (Q/K solve) per configuration\n\n"
        "fit = MSE between the solved maps and the impulse targets on the pseudo-input; "
        "target mass = mean attention on the target key (rows with a target). "
        "official = the paper's own solver (10,000 Adam steps, stage reference_solve) on the "
        "same shape, offsets and seed; the structured init is meant to match its softness. "
        "The paper publishes no solver figures: the official solver, run here, is the "
        "reference.\n\n"
        f"Structured init: {report.init_description(params['solve'])}.\n\n"
        + report.preopt_table(preopt_runs) + "\n")
    return MainReports(texts, {"main_table.md": stats.conclusions_record("main_table.md", main_conclusions),
                        "kernel_table.md": stats.conclusions_record("kernel_table.md", kernel_conclusions)},
                report.summary(runs, datasets, inits, ours,
                               {ds: next((c for c in contrasts[ds] if c.role == "primary"), None)
                                for ds in datasets}), runs)
