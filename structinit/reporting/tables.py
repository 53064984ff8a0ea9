"""Comparison tables from per-run results (pandas + tabulate). Pure: frames in, text out.

A frame of runs has one row per trained run, one seed of a cell: (dataset, init, seed, acc, ...)
with init one of the baselines or "impulse<k>" (names: cells.py). Accuracy is the *final-epoch*
test accuracy (no model selection on the test set), in percent, as mean +- std over seeds (std
with ddof=1), with n and a 95 % interval; which differences the seeds support is decided in
stats.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict

import pandas as pd
from tabulate import tabulate

from structinit.pipeline.cells import impulse_init
from structinit.reporting.stats import ALPHA, POWER_METHOD, Contrast, Detectable, planned_contrasts, summarize
from structinit.reporting.presentation import init_label

from structinit.reporting import paper


def quoted_number(table: dict, row, col, derived=frozenset()) -> str:
    """One of the paper's numbers as a table cell: "—" where none is quoted, "66.81 (derived)"
    where it is computed from other quotes rather than quoted itself (paper.HEADS_WIDTH_DERIVED)."""
    value = (table or {}).get(row, {}).get(col)
    if value is None:
        return "—"
    return f"{value:.2f}" + (" (derived)" if (row, col) in derived else "")


def paper_block(title: str, table: dict, columns: dict, note: str = "", row_label=None,
                derived=frozenset()) -> str:
    """The paper's published numbers as a markdown block, headed as the paper's, for a report
    to show beside (or, on datasets the paper did not use, below) what ran.
    table: row -> column -> top-1 %; columns: column key -> header; derived: (row, column)
    cells computed from other quotes, marked as such."""
    row_label = row_label or init_label
    rows = [[row_label(r)] + [quoted_number(table, r, c, derived) for c in columns] for r in table]
    body = tabulate(rows, headers=["paper"] + list(columns.values()), tablefmt="github",
                    disable_numparse=True)
    return f"## The paper's numbers: {title}\n\n" + (f"{note}\n\n" if note else "") + body + "\n"


def paper_main_block(inits=None, note: str = "") -> str:
    """The paper's main table (all four datasets) for the given initializers (default all);
    `note`: a report's own words about it, after the standard ones."""
    inits = [i for i in (inits or paper.MAIN) if i in paper.MAIN]
    return paper_block("main table (top-1 %)", {i: paper.MAIN[i] for i in inits}, paper.DATASETS,
                       "Published single runs, no error bars: ViT-T/2, 200 epochs on the 32×32 sets; "
                       "ViT-T/16, 300 epochs on ImageNet-1K. Labelled as the paper's, not re-run here."
                       + (f" {note}" if note else ""))


def seed_stats(runs: pd.DataFrame, value: str = "acc", keys=("dataset", "init")) -> pd.DataFrame:
    """keys -> mean, std (ddof=1), n and 95 % interval of `value` over seeds (accuracies: on the
    logit scale, within [0, 100]: stats.INTERVAL)."""
    rows = {key: asdict(summarize(g[value], bounded=value == "acc"))
            for key, g in runs.groupby(list(keys), sort=False)}
    return pd.DataFrame.from_dict(rows, orient="index").rename_axis(list(keys))


def _fmt(s) -> str:
    return f"{s['mean']:.2f} ± {s['std']:.2f}" if s["n"] > 1 else f"{s['mean']:.2f}"


def _ci(s) -> str:
    return f"[{s['ci_low']:.2f}, {s['ci_high']:.2f}]" if s["n"] > 1 else "—"


def main_table(runs: pd.DataFrame, datasets: list[str], inits: list[str], ours: str) -> str:
    """Rows = initializers; per dataset: mean ± std (delta vs Trunc Normal), 95 % CI, n, paper."""
    stats = seed_stats(runs)
    rows = []
    for init in inits:
        row = [init_label(init) + (" (ours)" if init == ours else "")]
        for ds in datasets:
            s = stats.loc[(ds, init)]
            base = stats.loc[(ds, "trunc_normal"), "mean"] if (ds, "trunc_normal") in stats.index else None
            entry = _fmt(s)
            if base is not None and init != "trunc_normal":
                entry += f" ({s['mean'] - base:+.2f})"
            row += [entry, _ci(s), int(s["n"])]
            if ds in paper.DATASETS:                  # side by side; elsewhere paper_main_block
                quoted = paper.MAIN.get(init, {}).get(ds)
                row.append(f"{quoted:.2f}" if quoted is not None else "—")
        rows.append(row)
    headers = ["Method"] + [h for ds in datasets
                            for h in (f"{ds}: ours", "95% CI", "n")
                            + ((f"{ds}: paper",) if ds in paper.DATASETS else ())]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def kernel_table(runs: pd.DataFrame, preopt: pd.DataFrame, datasets: list[str],
                 kernels: list[int], ours_kernel: int) -> str:
    """Per kernel: accuracy, and the init's softness beside the official solver's (same seeds)."""
    stats = seed_stats(runs)
    rows = []
    for ds in datasets:
        base = stats.loc[(ds, "trunc_normal"), "mean"] if (ds, "trunc_normal") in stats.index else None
        for k in kernels:
            s = stats.loc[(ds, impulse_init(k))]
            p = preopt[(preopt.dataset == ds) & (preopt.kernel == k)]
            rows.append([ds, k, "yes" if k == ours_kernel else "", _fmt(s), _ci(s), int(s["n"]),
                         f"{s['mean'] - base:+.2f}" if base is not None else "—",
                         f"{p.target_mass.mean():.3f}", f"{p.official_target_mass.mean():.3f}",
                         f"{p.fit_mse.mean():.5f}"])
    return tabulate(rows, headers=["dataset", "kernel", "ours", "test acc %", "95% CI", "n",
                                   "Δ vs Trunc Normal", "init target mass", "official solver's mass",
                                   "init fit (MSE)"],
                    tablefmt="github", disable_numparse=True)


def preopt_table(preopt: pd.DataFrame) -> str:
    rows = [[r.dataset, r.kernel, r.seed, r.solver, f"{r.fit_mse:.5f}", f"{r.target_mass:.3f}",
             f"{r.official_target_mass:.3f}", f"{r.target_mass - r.official_target_mass:+.3f}",
             f"{r.official_fit_mse:.5f}", r.solves] for r in preopt.itertuples()]
    return tabulate(rows, headers=["dataset", "kernel", "seed", "solver", "fit (MSE)", "target mass",
                                   "official solver's mass", "difference", "official fit (MSE)",
                                   "solves"], tablefmt="github", disable_numparse=True)


def interval(low: float, high: float) -> dict:
    """A 95 % interval as summary.json's two scalar keys (None where it is undefined: nan, n = 1)."""
    return {"ci95_low": None if math.isnan(low) else round(low, 3),
            "ci95_high": None if math.isnan(high) else round(high, 3)}


def summary(runs: pd.DataFrame, datasets: list[str], inits: list[str], ours: str,
            primary: dict | None = None) -> dict:
    """Headline numbers for `dvc metrics show/diff`: per dataset, each init's mean, std, n
    and 95 % interval; `ours` (the structured init at init.kernel) with its difference of means
    to Trunc Normal; and `primary`, the planned primary contrast (paired by seed: mean
    difference, its interval, p, n) under the same keys whatever arms it names. Intervals are
    two scalars (ci95_low, ci95_high), not a list: `dvc metrics diff` computes a change only
    for numbers, so the uncertainty is seen moving too."""
    stats = seed_stats(runs)
    out: dict = {}
    for ds in datasets:
        d = {}
        for init in inits:
            s = stats.loc[(ds, init)]
            d[init] = {"acc": round(s["mean"], 3), "std": round(s["std"], 3), "n": int(s["n"]),
                       **interval(s["ci_low"], s["ci_high"])}
        d["ours"] = {"init": ours, **d[ours]}
        if "trunc_normal" in d:
            d["ours"]["delta_vs_trunc_normal"] = round(d[ours]["acc"] - d["trunc_normal"]["acc"], 3)
        c = (primary or {}).get(ds)
        if c is not None:
            d["primary"] = {"contrast": f"{c.a} - {c.b}", "diff": round(c.diff, 3),
                            **interval(c.ci_low, c.ci_high),
                            "p": None if math.isnan(c.p) else float(f"{c.p:.4g}"), "n": c.n,
                            "alternative": c.alternative, "verdict": c.verdict}
        out[ds] = d
    return out


# --- "What ran": how a run departs from the paper ------------------------------------------

def recipe_departures(rec: dict, dataset: str | None = None) -> list[str]:
    """How a dataset's recipe departs from the paper's on that dataset (paper.recipe_of: the
    small-data recipe and ViT-T/2; on ImageNet-1K the official ImageNet command and ViT-T/16)."""
    paper_train, paper_model = paper.recipe_of(dataset)
    out = [f"{k} {v} (paper {paper_train[k]})" for k, v in rec["train"].items()
           if k in paper_train and v != paper_train[k]]
    model = {k: v for k, v in rec["model"].items() if paper_model.get(k, v) != v}
    if model:
        out.append("model " + ", ".join(f"{k} {v} (paper {paper_model[k]})" for k, v in model.items()))
    return out


def init_description(solve: dict) -> str:
    """The structured init that ran (params.yaml's `solve`), and its softness relative to the
    official solver's."""
    solver = solve["solver"]
    # "offsets random": the order in which heads got their offsets (solve.offset_order)
    text = f"solver {solver}, pseudo-input {solve['pseudo_input']}, offsets {solve['offset_order']}"
    if solver == "closed_form":
        mass = (solve.get("closed_form") or {}).get("target_mass")
        text += (", softness = the official solver's for the shape (softness law)" if mass is None else
                 f", softness target_mass={mass} (explicit override: departs from the official solver)")
    elif (solve.get("adam") or {}).get("early_stop"):
        text += ", early stopping on (the official loop runs all steps)"
    return text


def what_ran(params: dict, datasets, seeds, extra: str = "", vit: bool = True) -> str:
    """One paragraph for a report's "What ran": seeds, data, each recipe's departures, init."""
    parts = [f"seeds {list(seeds)} (n = {len(seeds)}); training images per dataset: "
             f"{params['data']['train_size'] or 'all'}"]
    for ds in datasets:
        rec = params["recipes"][ds]
        dep = recipe_departures(rec if vit else {"train": rec["train"], "model": {}}, ds)
        parts.append(f"{ds}: the paper's recipe" + (", departing in: " + "; ".join(dep) if dep else ", unchanged"))
    if vit:                                                  # ConvMixer studies have no ViT init
        parts.append("structured init: " + init_description(params["solve"]))
    return ". ".join(parts) + (f". {extra}" if extra else "") + "."


# --- the paper's other studies (method page, sections 6-7) ------------------------------

def study_table(runs: pd.DataFrame, row_key: str, col_key: str, *, rows: list, cols: list,
                quoted: dict | None = None, paper_dataset: str | None = None,
                row_label=str, col_label=str, quoted_note: str = "", derived=frozenset()) -> str:
    """Per dataset, one line per (`row_key`, `col_key`) value: mean ± std, 95 % CI, n, and, when
    `paper_dataset` ran, a "paper" column with the paper's number (`quoted`: row -> col -> %)
    on it (else the report shows the paper's numbers in a block of their own: paper_block).
    quoted_note: what the column's numbers are, in its header (e.g. paper.SECONDARY)."""
    stats = seed_stats(runs, keys=("dataset", row_key, col_key))
    side_by_side = paper_dataset in set(runs.dataset)
    out = []
    for ds in runs.dataset.unique():
        ran = set(runs.loc[runs.dataset == ds, col_key])     # a dataset's own columns (data_size: its sizes)
        for r in rows:
            for c in (c for c in cols if c in ran):
                s = stats.loc[(ds, r, c)]
                out.append([ds, row_label(r), col_label(c), _fmt(s), _ci(s), int(s["n"])])
                if side_by_side:
                    out[-1].append(quoted_number(quoted, r, c, derived) if ds == paper_dataset else "—")
    headers = ["dataset", row_key, col_key, "test acc %", "95% CI", "n"]
    paper_header = f"paper ({paper.DATASETS.get(paper_dataset, paper_dataset)}" + (
        f"; {quoted_note})" if quoted_note else ")")
    return tabulate(out, headers=headers + ([paper_header] if side_by_side else []),
                    tablefmt="github", disable_numparse=True)


def study_groups(runs: pd.DataFrame, group_key: str, within: str | None = None,
                 value: str = "acc") -> dict[str, tuple[str, dict]]:
    """The study's families: per dataset (and `within` value), {family name: (dataset,
    {`group_key` value: {seed: value}})}; a family's name is "digits" or "digits, cm64d4k3"."""
    out = {}
    keys = ["dataset"] + ([within] if within else [])
    for key, sub in runs.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        groups = {g: dict(zip(rows.seed.tolist(), rows[value].tolist()))
                  for g, rows in ((g, sub[sub[group_key] == g]) for g in dict.fromkeys(sub[group_key]))}
        out[", ".join(str(k) for k in key)] = (key[0], groups)
    return out


def study_contrasts(runs: pd.DataFrame, group_key: str, planned: list[tuple[str, str]],
                    within: str | None = None, value: str = "acc", alpha: float = ALPHA) -> list[Contrast]:
    """Per dataset (and `within` value, one family each): the `group_key` values paired by seed;
    the planned pairs (a, b) (params.yaml studies.<study>.contrasts), Holm-corrected within the
    family; every other pair is described without a test (stats.planned_contrasts). A planned
    pair with an arm the family does not have is skipped (the report lists it as not run)."""
    return [c for family, (_, groups) in study_groups(runs, group_key, within, value).items()
            for c in planned_contrasts(groups, family=family, secondary=planned, alpha=alpha)]


def detectable_block(rows: list[Detectable], label=str, unit: str = "points", reference_note: str = "") -> str:
    """The report's "smallest difference this design detects" section (stats.Detectable rows)."""
    if not rows:
        return ""

    def num(x, fmt=".2f"):
        return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)
    table = tabulate([[r.family, f"{label(r.a)} − {label(r.b)}", r.n, f"{r.alpha:.3g}", num(r.sd), num(r.detectable),
                       r.reference, r.n_reference or "—", num(r.sd_reference), num(r.detectable_reference)]
                      for r in rows],
                     headers=["family", "contrast", "n", "α (Holm's first step)", "SD of paired differences",
                              f"detectable ({unit})", "main grid: pair", "main grid: n",
                              "main grid: SD of paired differences", f"detectable from it ({unit})"],
                     tablefmt="github", disable_numparse=True)
    alphas = sorted({r.alpha for r in rows})
    return ("## Smallest difference this design detects\n\n"
            f"Generated, for each planned contrast: {POWER_METHOD}. Each is computed at the α its contrast "
            "is tested at, taken as α / m, the first (strictest) step of Holm over its family's m planned "
            "contrasts (a contrast reached at a later step is tested at a larger α, so its detectable "
            "difference is a little smaller: these are the conservative values"
            + f"; here α / m = {', '.join(f'{a:.3g}' for a in alphas)}), and at "
            "the contrast's own n, from two estimates of the SD of the paired differences: the study's own "
            "(over its n seeds: with 3 seeds a rough one) and the main grid's (over every seed of "
            "grid.seeds, from results/train: the same pair where the main grid trains both arms, else the "
            "main table's primary contrast" + (f"; {reference_note}" if reference_note else "") + "). A true "
            "difference smaller than these is missed more often than one time in five: \"not "
            "distinguishable\" above is then no evidence of no difference.\n\n" + table + "\n")


# --- the data-size study ------------------------------------------------------------------

def size_label(images: int, fraction: float) -> str:
    """"144 (10 %)": training images and their share of the main grid's training set."""
    return f"{images:,} ({100 * fraction:.3g} %)"


def schedule_table(runs: pd.DataFrame) -> str:
    """How long each training-set size trained: one line per (dataset, size). runs: one row
    per run with dataset, size, train_images, batch_size, epochs, warmup_epochs, eval_every,
    steps_per_epoch, steps (what the runs logged and ran)."""
    cols = ["batch_size", "steps_per_epoch", "epochs", "warmup_epochs", "eval_every", "steps"]
    ran = runs.groupby(["dataset", "size"], sort=False)[cols].agg(lambda v: sorted(set(v)))
    rows = [[ds, size] + [", ".join(f"{x:g}" for x in r[c]) for c in cols]   # several: runs disagree
            for (ds, size), r in ran.iterrows()]
    return tabulate(rows, headers=["dataset", "training images", "batch", "steps / epoch", "epochs",
                                   "warm-up epochs", "test every (epochs)", "optimizer steps"],
                    tablefmt="github", disable_numparse=True)


def paper_gaps(inits, reference: str = "trunc_normal") -> str:
    """The paper's difference to `reference` per dataset, with each dataset's training images."""
    parts = []
    for init in inits:
        if init == reference or init not in paper.MAIN:
            continue
        gaps = ", ".join(f"{paper.DATASETS[d]} ({paper.TRAIN_IMAGES_OF[d]:,} images) "
                         f"{paper.MAIN[init][d] - paper.MAIN[reference][d]:+.2f}" for d in paper.DATASETS)
        parts.append(f"{init_label(init)} − {init_label(reference)}: {gaps}")
    return "; ".join(parts)
