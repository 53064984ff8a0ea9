"""How many epochs the paper's recipe needs on the embedded default (digits): the evidence
behind `recipes.digits.train.epochs`, made by the frozen stage epoch_budget (stages/epoch_budget.py:
results/evidence/epoch_budget/; how to run it: docs/pipeline.md).

Trains the digits recipe of params.yaml (the paper's optimizer, eps, clipping, label
smoothing, weight decay) at each epoch budget as a complete run: warm-up 5 % of the budget
(the paper's 10 of 200), cosine to min_lr at the end of *that* budget, warm-up replacing the
cosine's start (`warmup_prefix: false`, the paper's timm default). Each arm's seeds (the main
grid's, `grid.seeds`) train stacked in one call through the library's trainer (train_models),
as the pipeline's cells do, so a budget here is what the pipeline would train at that budget
on this CPU; an arm at one seed is the same initial model at every budget.

The pipeline's own budget is read from its cells (results/train: cells_curves) instead of
trained again; cells_check is the check that this is the same: it trains the pipeline's budget
here for one arm and compares each evaluated epoch with the cells (pipeline_check, same_runs).

Criterion: a budget B is converged when doubling it moves no arm's mean final
accuracy by more than `tolerance` points (1 by default; structinit/reporting/budget.py).
epochs.csv holds the test accuracy at every evaluated epoch, per arm, budget and seed, each
row naming the CPU, dtype and stacking it ran with and the images it was counted on
(`evaluated`: the criterion judges a move exactly, in images); epochs.md the tables and the
verdict.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pandas as pd
import yaml
from tabulate import tabulate

from structinit import TrainConfig, initialize, train_models
from structinit.pipeline.build import build_model
from structinit.pipeline.cells import main_cell, parse_init
from structinit.data.specs import TEST_IMAGES
from structinit.reporting.budget import (EVALUATED, budget_finals, converged_budget, counted_on,
                                         doubling_moves, move_text)
from structinit.reporting.curves import read_run
from structinit.reporting import stats
from structinit.reporting.presentation import init_label
from structinit.training.checkpoint import code_fingerprint
from structinit.training.stacked import compute_dtype
from structinit.training.trainer import default_device

ARMS = ["kaiming_uniform", "trunc_normal", "mimetic", "mimetic_qk", "impulse3", "impulse5"]
STACKINGS = ("cell", "all")
PIPELINE = "pipeline"          # source of rows read from the pipeline's cells (--from-cells)


def budget_config(train: dict, epochs: int, warmup_prefix: bool) -> dict:
    """The digits recipe at `epochs`: warm-up 5 % of it (at least 1), as the paper's 10 of 200."""
    return dict(train, epochs=epochs, warmup_epochs=max(1, round(0.05 * epochs)),
                warmup_prefix=warmup_prefix, eval_every=10)


def run_budget(data, rec: dict, arms: list[str], seeds: list[int], epochs: int, warmup_prefix: bool,
               cpu: str = "", stacking: str = "cell", dataset: str = "digits", eval_every: int = 10,
               device=None, checkpoint_dir: Path | None = None, checkpoint_every_s: float = 0.0) -> pd.DataFrame:
    """Every (arm, seed) at one budget: one row per evaluated epoch, each naming the machine it
    ran on (`cpu`, since budgets added later may run on another CPU), the dtype it computed in
    and how it was stacked. stacking "cell": each arm's seeds trained stacked together, one run
    per arm, as the pipeline's cells are (its stacked models run the same batched kernels);
    "all": every arm and seed in one run (how budgets 40-160 were first run: 18 models).
    `test_acc` is accuracy on data's test split (a validation split where the budget is chosen
    on one: tools/fashion_mnist.py).
    checkpoint_dir: each stacked run keeps its checkpoint in a folder of its own here
    (<budget>-<arm>, or <budget>-all), as a pipeline cell does, so a run cut short resumes from
    its last written epoch and a finished one is read back, not trained again (the same bytes:
    the trainer's resume); it resumes only the same recipe, seeds, inits and code. The caller
    removes the folder once its results are written."""
    if stacking not in STACKINGS:
        raise ValueError(f"stacking={stacking!r}; choose one of {STACKINGS}")
    train = dict(budget_config(rec["train"], epochs, warmup_prefix), eval_every=eval_every)
    groups = ([[(arm, seed) for seed in seeds] for arm in arms] if stacking == "cell"
              else [[(arm, seed) for arm in arms for seed in seeds]])
    rows = []
    for pairs in groups:
        models = []
        for arm, seed in pairs:
            models.append(build_model(rec["model"], data.spec))
            method, kernel = parse_init(arm)
            initialize(models[-1], method, seed=seed, **({"kernel": kernel} if kernel else {}))
        cfgs = [TrainConfig(**train, seed=seed) for _, seed in pairs]
        dtype = compute_dtype(cfgs[0], device or default_device(), models[0])
        where = {}
        if checkpoint_dir is not None:      # the init and the code: what the recipe's config does not say
            name = f"{epochs}-{pairs[0][0] if stacking == 'cell' else 'all'}"
            code = code_fingerprint()       # once the models are built: their initializers' files are loaded
            where = {"checkpoint_path": Path(checkpoint_dir) / name / "checkpoint.pt",
                     "fingerprints": [{"dataset": dataset, "init": arm, "code": code} for arm, _ in pairs],
                     "checkpoint_every_s": checkpoint_every_s}
        hists = train_models(models, data, cfgs, progress=False, device=device, **where)
        rows += [{"dataset": dataset, "init": arm, "budget": epochs, "seed": seed, "epoch": h["epoch"],
                  "test_acc": round(100 * h["test_acc"], 3), "test_loss": h["test_loss"], "cpu": cpu, "dtype": dtype,
                  "stacking": stacking, "source": "benchmark", EVALUATED: len(data.test_labels)}
                 for (arm, seed), hist in zip(pairs, hists) for h in hist if "test_acc" in h]
    return pd.DataFrame(rows)


def primary_by_budget(final: pd.DataFrame, a: str, b: str) -> list[list]:
    """The primary contrast a - b at each budget, paired by seed (mean, 95 % interval), and its
    move from the budget before: whether the budget changes the answer, not only each arm."""
    rows, before = [], None
    for budget in sorted(final.budget.unique()):
        at = final[final.budget == budget]
        ga, gb = (dict(zip(at[at.init == x].seed, at[at.init == x].test_acc)) for x in (a, b))
        if not ga or not gb:
            continue
        d = stats.paired_difference(ga, gb)
        rows.append([f"{budget}", f"{d.diff:+.2f} [{d.ci_low:+.2f}, {d.ci_high:+.2f}]",
                     "" if before is None else f"{d.diff - before:+.2f}"])
        before = d.diff
    return rows


def beyond_tolerance(final: pd.DataFrame, tolerance: float) -> str:
    """Each move at or beyond the tolerance, paired by seed (an arm at one seed starts from the
    same model at every budget): mean and 95 % interval, so a reader sees whether the move is
    larger than the seeds' noise, a move of exactly the tolerance (which passes) included. The
    criterion itself judges the mean alone, as fixed."""
    lines = []
    for b, moves in doubling_moves(final).items():
        for arm, m in moves.items():
            if abs(m) < tolerance:
                continue
            at = {x: dict(zip(g.seed, g.test_acc)) for x, g in final[final.init == arm].groupby("budget")}
            d = stats.paired_difference(at[2 * b], at[b])
            lines.append(f"- {init_label(arm)}, {b} → {2 * b}: {move_text(m, tolerance)} points "
                         f"[{d.ci_low:+.2f}, {d.ci_high:+.2f}], n = {d.n} seeds, p = {d.p:.2g}")
    return ("\nThe moves at or beyond the tolerance, paired by seed (mean, 95 % interval, paired t; the criterion "
            "judges the mean alone):\n\n" + "\n".join(lines) + "\n") if lines else ""


def at_edge(final: pd.DataFrame, budget: int, tolerance: float) -> str:
    """"; Trunc Normal's +1.00 is the tolerance itself": said where a budget passes on the edge."""
    moves = doubling_moves(final)[budget]
    edge = [i for i, m in moves.items() if abs(m) == tolerance]
    return ("; " + ", ".join(f"{init_label(i)}'s {move_text(moves[i], tolerance)}" for i in edge)
            + f" {'is' if len(edge) == 1 else 'are'} the tolerance itself") if edge else ""


def doubling_table(final: pd.DataFrame, tolerance: float) -> list[list]:
    """One row per budget B whose double also ran: each arm's move, the largest, within?"""
    rows = []
    for b, moves in doubling_moves(final).items():
        worst = max(moves, key=lambda i: abs(moves[i]))
        each = ", ".join(f"{init_label(i)} {move_text(m, tolerance)}" for i, m in moves.items())
        rows.append([f"{b} → {2 * b}", each,
                     f"{init_label(worst)} {move_text(moves[worst], tolerance)}",
                     "yes" if abs(moves[worst]) <= tolerance else "no"])
    return rows


def machines(curves: pd.DataFrame, cpu: str) -> str:
    """Where and how each budget ran: `cpu` when the file does not say (or every budget ran
    alike), else "budgets 40, 80: <cpu A>, stacking all; 320: <cpu B>, bf16, stacking cell"
    (another CPU runs other kernels, and another stacking other batched shapes, so their bytes
    differ; a doubling across them compares across that too). A budget read from the
    pipeline's cells (--from-cells) says so."""
    if "cpu" not in curves or curves.cpu.isna().all():
        return cpu
    c = curves.assign(**{k: curves[k].fillna("") if k in curves else "" for k in ("dtype", "stacking", "source")})
    c["where"] = [", ".join(x for x in (str(w), str(d), f"stacking {st}" if st else "",
                                        "the pipeline's own runs (results/train)" if so == PIPELINE else "") if x)
                  for w, d, st, so in zip(c.cpu, c.dtype, c.stacking, c.source)]
    by = c.groupby("where", sort=False).budget.unique()
    if len(by) == 1:
        return str(by.index[0])
    return "; ".join(f"budget{'s' if len(b) > 1 else ''} {', '.join(str(int(x)) for x in sorted(b))}: {w}"
                     for w, b in by.items())


def cells_curves(cells: Path, arms: list[str], seeds: list[int]) -> pd.DataFrame:
    """The pipeline's own main-grid runs (`dvc repro`'s results/train/<cell>/seed<s>) as rows of
    this file: their budget, each epoch they evaluated, the CPU, threads and dtype each run
    logged beside its params, stacking "cell" (one cell's seeds stacked, as run_budget stacks
    them), source "pipeline". FileNotFoundError naming the missing runs."""
    missing = [f"{main_cell('digits', a)}/seed{s}" for a in arms for s in seeds
               if not (cells / main_cell("digits", a) / f"seed{s}" / "metrics.json").exists()]
    if missing:
        raise FileNotFoundError(f"--from-cells: {cells} lacks {missing}: run `./run.sh repro` first, or "
                                "pick --inits and --seeds among the main grid's")
    rows = []
    for arm in arms:
        for seed in seeds:
            folder = cells / main_cell("digits", arm) / f"seed{seed}"
            logged = yaml.safe_load((folder / "params.yaml").read_text())
            curve = read_run(folder).dropna(subset=["test_acc"])
            rows += [{"dataset": "digits", "init": arm, "budget": int(logged["epochs"]), "seed": seed,
                      "epoch": int(e), "test_acc": round(float(acc), 3), "test_loss": float(loss),
                      "cpu": f"{logged.get('cpu', '?')}, {logged.get('cpu_threads', '?')} threads",
                      "dtype": logged.get("compute_dtype", ""), "stacking": "cell", "source": PIPELINE}
                     for e, acc, loss in zip(curve.epoch, curve.test_acc, curve.test_loss)]
    return with_evaluated(pd.DataFrame(rows))


def with_source(curves: pd.DataFrame) -> pd.DataFrame:
    """A file written before rows named their source: every row in it was trained here. One
    written before rows named the images they were counted on (EVALUATED): run_budget evaluates
    on the dataset's whole test split, so a dataset's rows are counted on it where every one of
    its accuracies is a count of it (else they stay unnamed, judged as the decimals stored)."""
    return with_evaluated(curves.assign(source=curves.source.fillna("benchmark") if "source" in curves
                                        else "benchmark"))


def with_evaluated(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows that do not name the images they were counted on (EVALUATED), from a cell or an older
    file: both evaluate on the dataset's whole test split, so a dataset's rows name it where every
    one of its accuracies is a count of it (else they stay unnamed, judged as the decimals stored)."""
    if EVALUATED not in frame:
        frame = frame.assign(**{EVALUATED: pd.NA})
    for dataset, rows in frame[frame[EVALUATED].isna()].groupby("dataset") if "dataset" in frame else ():
        if counted_on(rows.test_acc, TEST_IMAGES.get(dataset)):
            frame.loc[rows.index, EVALUATED] = TEST_IMAGES[dataset]
    return frame


def with_cells(curves: pd.DataFrame, cells: Path, arms: list[str], seeds: list[int]) -> pd.DataFrame:
    """`curves` with the pipeline's budget replaced by its cells' runs (--from-cells)."""
    pipe = cells_curves(cells, arms, seeds)
    if curves.empty:
        return pipe
    return pd.concat([curves[~curves.budget.isin(set(pipe.budget))], pipe], ignore_index=True)


def same_runs(here: pd.DataFrame, cells: pd.DataFrame, where: str) -> str:
    """Runs trained here at the cells' budget against the cells' runs of the same arm and seed,
    at every epoch both evaluated: identical when the test accuracy and, where both kept it, the
    test loss (a full float: equal to the bit, or not) agree at each. One sentence."""
    both = here.merge(cells, on=["init", "seed", "epoch"], suffixes=("", "_cells"))
    runs = here.groupby(["init", "seed"]).ngroups
    if both.empty:
        return f"The {int(here.budget.iloc[0])}-epoch runs above share no evaluated epoch with the pipeline's cells."
    loss = ("test_loss" in here and "test_loss" in cells and both.test_loss.notna().all()
            and both.test_loss_cells.notna().all())
    gap = both.assign(acc=(both.test_acc - both.test_acc_cells).abs(),
                      loss=(both.test_loss - both.test_loss_cells).abs() if loss else 0.0)
    per_run = gap.groupby(["init", "seed"])[["acc", "loss"]].max()
    same = int(((per_run.acc == 0) & (per_run.loss == 0)).sum())
    epochs = sorted(both.epoch.unique())
    arms = ", ".join(f"{init_label(i)} seeds {sorted(int(x) for x in g.seed.unique())}"
                     for i, g in here.groupby("init", sort=False))
    return (f"The {int(here.budget.iloc[0])}-epoch runs above ({arms}) against the pipeline's own cells ({where}), "
            f"at the {len(epochs)} epochs both evaluated ({', '.join(str(e) for e in epochs[:3])}, ..., {epochs[-1]}): "
            f"{same} of {runs} runs identical in test accuracy" + (" and test loss (to the bit)" if loss else "")
            + f"; the largest difference {per_run.acc.max():.3f} points"
            + (f", {per_run.loss.max():.3g} in loss." if loss else "."))


def pipeline_check(curves: pd.DataFrame, cells: Path, tolerance: float) -> str:
    """The benchmark against the pipeline's own cells (`dvc repro`'s results/train/<cell>/seed<s>,
    this file's arms and seeds), where both ran:
    - the cells' budget B trained here: the same runs? Every epoch both evaluated, compared
      (the same trainer, stacking and CPU give the same bytes, so the same accuracies);
    - 2B here, and B not taken from the cells: the doubling measured on the pipeline's machine,
      whatever CPU ran the benchmark's B.
    "" when the cells, or both comparisons, are missing."""
    final = budget_finals(curves)
    seeds = sorted(int(s) for s in final.seed.unique())
    arms = list(dict.fromkeys(final.init))
    ran = {}
    for arm in arms:
        for seed in seeds:
            folder = cells / main_cell("digits", arm) / f"seed{seed}"
            if not (folder / "metrics.json").exists():
                return ""
            ran[arm, seed] = (yaml.safe_load((folder / "params.yaml").read_text()),
                              100 * json.loads((folder / "metrics.json").read_text())["final_test_acc"])
    budget = {p["epochs"] for p, _ in ran.values()}
    if len(budget) != 1:
        return ""
    b = budget.pop()
    where = "; ".join(sorted({f"{p.get('cpu', '?')}, {p.get('cpu_threads', '?')} threads, "
                              f"{p.get('compute_dtype', '?')}" for p, _ in ran.values()}))
    source = curves.source.fillna("") if "source" in curves else pd.Series("", index=curves.index)
    text = ""
    here = curves[(curves.budget == b) & (source != PIPELINE)]
    if not here.empty:
        text += "\n" + same_runs(here, cells_curves(cells, arms, seeds), f"{cells}; {where}") + "\n"
    if 2 * b in set(final.budget) and not ((curves.budget == b) & (source == PIPELINE)).any():
        cells_final = with_evaluated(pd.DataFrame([{"dataset": "digits", "init": arm, "budget": b, "seed": s,
                                                    "epoch": b, "test_acc": ran[arm, s][1]}
                                                   for arm in arms for s in seeds]))
        moves = doubling_moves(pd.concat([cells_final, final[final.budget == 2 * b]], ignore_index=True))[b]
        worst = max(moves, key=lambda i: abs(moves[i]))
        text += (f"\nThe pipeline's own cells at {b} epochs (`dvc repro`, {cells}, seeds {seeds}; {where}) "
                 f"against the {2 * b}-epoch runs above: "
                 + ", ".join(f"{init_label(i)} {move_text(m, tolerance)}" for i, m in moves.items())
                 + f"; largest {init_label(worst)} {move_text(moves[worst], tolerance)}: "
                 + ("within" if abs(moves[worst]) <= tolerance else "NOT within") + f" {tolerance:g} point.\n")
    return text


def report(curves: pd.DataFrame, tolerance: float, seeds: list[int], warmup_prefix: bool, cpu: str,
           pipeline: str = "", primary: tuple[str, str] | None = None) -> str:
    final = budget_finals(curves)
    budgets = sorted(final.budget.unique())
    arms = list(dict.fromkeys(curves.init))         # the order they ran in

    def fmt(v):
        return f"{statistics.mean(v):.2f} ± {statistics.stdev(v):.2f}" if len(v) > 1 else f"{v[0]:.2f}"
    table = tabulate([[init_label(i)] + [fmt(final[(final.init == i) & (final.budget == b)].test_acc.tolist())
                                         for b in budgets] for i in arms],
                     headers=["init"] + [f"{b} epochs" for b in budgets], tablefmt="github")
    rows, chosen = doubling_table(final, tolerance), converged_budget(final, tolerance)
    moves = tabulate(rows, headers=["budget", "mean move per arm (points)", "largest", f"within {tolerance:g}?"],
                     tablefmt="github")
    longest = curves[curves.budget == budgets[-1]]
    epochs = sorted(longest.epoch.unique())
    stride = max(1, len(epochs) // 16)          # at most ~16 columns, the last epoch always shown
    epochs = [e for k, e in enumerate(epochs) if k % stride == stride - 1 or e == epochs[-1]]
    during = tabulate([[init_label(i)] + [f"{longest[(longest.init == i) & (longest.epoch == e)].test_acc.mean():.1f}"
                                          for e in epochs] for i in arms],
                      headers=["init"] + [str(e) for e in epochs], tablefmt="github")
    contrast = ""
    if primary and (rows_p := primary_by_budget(final, *primary)):
        contrast = (f"\nThe primary contrast, {init_label(primary[0])} − {init_label(primary[1])}, paired by seed "
                    "(mean, 95 % interval; its move from the budget before):\n\n"
                    + tabulate(rows_p, headers=["budget", "difference (points)", "move"], tablefmt="github",
                             disable_numparse=True) + "\n")
    verdict = (f"**Converged budget: {chosen} epochs** (the smallest budget whose double moves no arm's "
               f"mean by more than {tolerance:g} point{at_edge(final, chosen, tolerance)})." if chosen is not None else
               f"**No budget here is converged** by the criterion (no doubling within {tolerance:g} point)."
               if rows else "No budget here has its double, so the criterion judges none.")
    return (f"#### Epoch budget on digits (stage epoch_budget)\n\n"
            f"Final-epoch test accuracy (%), mean ± std over seeds {seeds} (n = {len(seeds)}); each budget a "
            f"complete run (warm-up 5 % of it, cosine to its end, warmup_prefix {warmup_prefix}); "
            f"{machines(curves, cpu)}.\n\n{table}\n\n" + (f"Doubling the budget:\n\n{moves}\n" if rows else "")
            + f"{beyond_tolerance(final, tolerance)}\n{verdict}\n"
            f"{contrast}{pipeline}\n"
            f"Test accuracy during the {budgets[-1]}-epoch runs (mean over seeds):\n\n{during}\n")
