"""The regime study's report (beyond the paper): does the structured init help when its prior is
as sharp as in the paper's regime?

    regime_runs(params, dataset, main, studies, analysis) -> DataFrame   one row per (arm, seed)
    regime_report(params, dataset, main, studies, analysis) -> markdown

On the digits shape (64 tokens, C 48, 3 heads) the softness law gives the structured init a
target mass of 0.107; ViT-T/2 on CIFAR (256 tokens) gets 0.30. The study trains Imp.-3 solved
for sharper masses (studies.regime.arms) beside the main grid's Imp.-3 and Trunc Normal
(studies.regime.reused), paired by seed: grid.seeds' cells of the reused arms are the main
grid's, every other (arm, seed) the study's own, each seed list a cell of its own so that each
cell stacks as many models as the main grid's. Beside each arm's accuracy: its mass on each
head's offset at init and trained (on the pseudo-input, where it was solved, and on test
images) and its W_q, W_k norms (a sharper map needs larger Q/K weights).
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from structinit.io import MissingFileError, load_checked
from structinit.pipeline.cells import impulse_kernel, main_cell, parse_contrast, run_name, seed_dir
from structinit.reporting import stats
from structinit.reporting.main_report import detectable_line, run_row, speed_epoch
from structinit.reporting.presentation import init_label
from structinit.reporting.runs import ran_with

STUDY = "studies.regime"


def _cells(params: dict, dataset: str, main: Path, studies: Path, analysis: Path):
    """[(arm, seed, run folder's cell, analysis folder)] in arm order, then seed order: where
    each (arm, seed) of the study was trained and analyzed."""
    r = params["studies"]["regime"]
    shared, own = list(r["shared_seeds"]), list(r["own_seeds"])
    out = []
    for arm in r["reused"]:
        cell = main_cell(dataset, arm)
        out += [(arm, s, main / cell, analysis / cell) for s in shared]
        out += [(arm, s, studies / f"{cell}-own", analysis / "studies/regime" / f"{cell}-own") for s in own]
    for arm in (a["name"] for a in r["arms"]):
        for which, seeds in (("shared", shared), ("own", own)):
            cell = f"{dataset}-{arm}-{which}"
            out += [(arm, s, studies / cell, analysis / "studies/regime" / cell) for s in seeds]
    return out


def _mass(part: dict, profile: str, offsets) -> float:
    """Mean over blocks and heads of the attention mass on each head's offset (m, n), read from
    an analysis' offset profile (L, H, 2gh-1, 2gw-1): what target_mass is for a model's own
    offsets, and for a model without them (Trunc Normal) the same measure on another's."""
    prof = part[profile]
    gh, gw = (prof.shape[-2] + 1) // 2, (prof.shape[-1] + 1) // 2
    return float(sum(prof[l, h, m + gh - 1, n + gw - 1].item() for l, layer in enumerate(offsets)
                     for h, (m, n) in enumerate(layer)) / sum(len(layer) for layer in offsets))


def regime_runs(params: dict, dataset: str, main: Path, studies: Path, analysis: Path) -> pd.DataFrame:
    """One row per (arm, seed): final test accuracy (%), test accuracy at the speed epoch (%),
    the mass on the heads' offsets at init and trained (on the pseudo-input, on the analysis'
    test images; an arm without offsets is measured on the first arm's with offsets, same seed),
    the mean over blocks of ||W_q||, ||W_k|| at init and trained; `run`: its folder; `images`:
    how many test images the analysis averaged over."""
    r = params["studies"]["regime"]
    speed = r["contrasts"].get("speed")
    at = speed_epoch(params["recipes"][dataset]["train"], speed["fraction"]) if speed else None
    rows, found = [], {}
    for arm, seed, cell, where in _cells(params, dataset, main, studies, analysis):
        run = seed_dir(cell, seed)
        if not (run / "metrics.json").exists():
            raise MissingFileError(f"{run_name(cell.name, seed)}: no trained run at {run} (the regime study's "
                                   f"{arm}, seed {seed}); run the study: its frozen stage, regime (docs/studies.md)")
        row = run_row(cell, seed, at, f"{STUDY}.contrasts.speed")
        found[arm, seed] = load_checked(seed_dir(where, seed).with_suffix(".pt"), f"the attention analysis of "
                                      f"{run_name(cell.name, seed)} (an analyze stage's output)")
        rows.append({"arm": arm, "seed": seed, "run": str(run), "images": int(found[arm, seed]["images"]), **row})
    arms = list(dict.fromkeys(a for a, _ in found))
    for row in rows:
        mine = found[row["arm"], row["seed"]]
        ref = next((a for a in arms if found[a, row["seed"]]["at_init"]["offsets"] is not None), None)
        offsets = mine["at_init"]["offsets"] or (found[ref, row["seed"]]["at_init"]["offsets"] if ref else None)
        row["offsets_of"] = row["arm"] if mine["at_init"]["offsets"] else (ref or "")
        for when in ("at_init", "trained"):
            part = mine[when]
            for where, profile in (("pseudo", "profile_pseudo"), ("images", "profile_images")):
                row[f"{where}_{when}"] = _mass(part, profile, offsets) if offsets else math.nan
            qk = part.get("qk_norm")
            row[f"wq_{when}"], row[f"wk_{when}"] = ((math.nan, math.nan) if qk is None else
                                                    tuple(float(v) for v in qk.float().mean(0)))
    return pd.DataFrame(rows)


def arm_label(params: dict, arm: str) -> str:
    """"Imp.-3 at mass 0.2955" for a study arm; the main grid's names otherwise."""
    own = next((a for a in params["studies"]["regime"]["arms"] if a["name"] == arm), None)
    if own is None:
        return init_label(arm)
    o = own["options"]
    base = init_label(f"impulse{o['kernel']}") if own["init"] == "impulse" else init_label(own["init"])
    return f"{base} at mass {o['target_mass']:g}" if "target_mass" in o else f"{base} ({arm})"


def _solved_for(params: dict, dataset: str, arm: str) -> str:
    """The target mass an arm's init was solved for: its option, or the softness law's for an
    impulse arm at its defaults; "-" for an arm without offsets."""
    own = next((a for a in params["studies"]["regime"]["arms"] if a["name"] == arm), None)
    if own is not None and "target_mass" in own["options"]:
        return f"{own['options']['target_mass']:g}"
    if impulse_kernel(arm) is None and own is None:
        return "-"
    from structinit.config import patch_grid_for
    from structinit.data.specs import get_spec
    from structinit.init.softness import official_target_mass

    model = params["recipes"][dataset]["model"]
    gh, gw = patch_grid_for(get_spec(dataset).image_size, model["patch_size"])
    return f"{official_target_mass(gh * gw, model['embed_dim'], model['num_heads']):.3f} (softness law)"


def _cell(values: pd.Series, digits: int = 2) -> str:
    if values.isna().all():
        return "-"
    s = stats.summarize(values.tolist())
    return f"{s.mean:.{digits}f} ± {s.std:.{digits}f}"


def regime_report(params: dict, dataset: str, main: Path, studies: Path, analysis: Path,
                  figure: Path | None = None) -> str:
    """The report's markdown; figure: where to draw accuracy against the prior's sharpness."""
    r = params["studies"]["regime"]
    plan = r["contrasts"]
    alpha = plan.get("alpha", stats.ALPHA)
    runs = regime_runs(params, dataset, main, studies, analysis)
    arms = list(dict.fromkeys(runs.arm))
    label = lambda a: arm_label(params, a)  # noqa: E731
    train = params["recipes"][dataset]["train"]
    speed = plan.get("speed")
    at = speed_epoch(train, speed["fraction"]) if speed else None

    rows = []
    for arm in arms:
        g = runs[runs.arm == arm]
        rows.append(f"| {label(arm)} | {_solved_for(params, dataset, arm)} | "
                    f"{_cell(g.pseudo_at_init, 3)} | {_cell(g.images_at_init, 3)} | "
                    f"{_cell(g.pseudo_trained, 3)} | {_cell(g.images_trained, 3)} | "
                    f"{_cell(g.wq_at_init)} / {_cell(g.wk_at_init)} | {_cell(g.wq_trained)} / {_cell(g.wk_trained)} | "
                    + (f"{_cell(g.speed_acc)} | " if at else "") + f"{_cell(g.acc)} | {len(g)} |")
    head = ("| arm | target mass solved for | offset mass at init: pseudo-input | on test images | "
            "trained: pseudo-input | on test images | ‖W_q‖ / ‖W_k‖ at init | trained | "
            + (f"test acc at epoch {at} | " if at else "") + "final test acc | n |")
    table = head + "\n" + "|---" * (head.count("|") - 1) + "|"

    groups = {a: dict(zip(runs[runs.arm == a].seed, runs[runs.arm == a].acc)) for a in arms}
    contrasts = stats.planned_contrasts(groups, family=dataset, primary=parse_contrast(plan["primary"]),
                                        secondary=[parse_contrast(t) for t in plan.get("secondary") or []],
                                        alpha=alpha)
    block = stats.contrasts_block(contrasts, label, alpha=alpha, title="Conclusions: final test accuracy",
                                  primary_note=lambda c: detectable_line(c, alpha))
    speed_block = ""
    if at is not None:
        sgroups = {a: dict(zip(runs[runs.arm == a].seed, runs[runs.arm == a].speed_acc)) for a in arms}
        sc = stats.planned_contrasts(sgroups, family=f"{dataset}, epoch {at}", primary=parse_contrast(speed["primary"]),
                                     alpha=alpha, describe_others=False)
        speed_block = stats.contrasts_block(sc, label, alpha=alpha,
                                            title=f"Conclusions: test accuracy at epoch {at} of {train['epochs']}",
                                            primary_note=lambda c: detectable_line(c, alpha))
    shared, own = r["shared_seeds"], r["own_seeds"]
    primary = next(c for c in contrasts if c.role == "primary")
    sharp = " ".join(f"{label(a)}: {runs[runs.arm == a].images_at_init.mean():.3f}." for a in arms
                     if not runs[runs.arm == a].images_at_init.isna().all())
    summary = ("## In one line\n\n" + stats.contrast_line(primary, label, alpha).removeprefix("- ")
               + f"\n\nMass on the offsets at init, on test images (mean over seeds, blocks and heads): {sharp}\n\n")
    borrowed = sorted({(label(a), label(o)) for a, o in zip(runs.arm, runs.offsets_of) if o and o != a})
    borrowed_note = "".join(f" {a} has no offsets of its own: its mass is on {o}'s offsets of the same seed."
                            for a, o in borrowed)
    images = sorted(set(runs.images))
    from structinit.init.softness import official_target_mass

    drawn = ""
    if figure is not None:
        from structinit.reporting.figures.regime import regime_figure
        from structinit.reporting.figures.style import save_figure

        save_figure(regime_figure(runs, label, dataset, train["epochs"], at), figure)
        drawn = f"Figure: `{figure}` (accuracy against each arm's mass on the offsets at init).\n\n"
    paper = official_target_mass(256, 192, 3)          # ViT-T/2 on CIFAR: 16 x 16 patches of 2, C 192, 3 heads
    law_arm = next((a for a in r["reused"] if impulse_kernel(a) is not None), None)
    law = f"{_solved_for(params, dataset, law_arm).split(' ')[0]}" if law_arm else "a smaller share"
    return (f"# Regime study on {dataset}: the structured init at sharper target masses\n\n"
            f"Beyond the paper. On this shape the softness law solves the structured init for "
            f"{law} of each head's attention on its offset; "
            f"the paper's ViT-T/2 on CIFAR (256 tokens, width 192, 3 heads) gets {paper:.4f}. Does Imp.-3 gain on "
            "Trunc Normal when its prior is that sharp? Arms paired by seed; the primary contrast, the secondary "
            f"ones and the speed endpoint as planned in params.yaml ({STUDY}.contrasts; "
            "the regime stage's report, results/evidence/regime/regime.md, names the commit that fixed the "
            "primary).\n\n"
            + summary
            + f"## What ran\n\n{dataset}, the main grid's recipe ({train['epochs']} epochs), seeds {shared + own} "
            f"(n = {len(shared) + len(own)}): the reused arms' seeds {shared} are the main grid's cells, every other "
            f"run the study's own, {len(shared)} and {len(own)} seeds stacked per cell. "
            + ran_with(runs.run.tolist()) + ".\n\n"
            "## By arm\n\nMean ± std over seeds; masses: the mean attention on each head's offset (what the "
            "structured init was solved for), at init and trained, on the pseudo-input and averaged over the first "
            f"{' or '.join(map(str, images))} test images.{borrowed_note} ‖W_q‖, ‖W_k‖: Frobenius norms, mean over "
            "blocks; accuracy in %.\n\n"
            + table + "\n" + "\n".join(rows) + "\n\n" + drawn + block + "\n" + speed_block)
