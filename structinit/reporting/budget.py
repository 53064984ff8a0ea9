"""Is the epoch budget converged? The epoch evidence's criterion (structinit/evidence/epoch_budget.py),
read by the evidence stage and by the reports, so the sentence a report prints about its own
budget comes from the epoch_budget stage's output (results/evidence/epoch_budget/epochs.csv),
not from prose, and only while that evidence is fresh (structinit.records): made from the
cells the reports read. Otherwise the sentence says the budget's convergence was not measured.

A budget B is converged when doubling it moves no arm's mean final accuracy by more than
`tolerance` points (1 by default), each budget a complete run (warm-up and cosine scaled to it).
"""
from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import pandas as pd

from structinit.records import evidence_freshness, unmeasured_line
from structinit.io import CorruptFileError
from structinit.reporting import stats

TOLERANCE = 1.0
EVALUATED = "evaluated"  # epochs.csv's column: images in the split each accuracy was counted on
EPOCHS_MD = "results/evidence/epoch_budget/epochs.md"   # the evidence's report, named in each sentence


def budget_finals(curves: pd.DataFrame) -> pd.DataFrame:
    """The epoch evidence's epochs.csv (every evaluated epoch) -> one row per (dataset, init, budget,
    seed): the final epoch's test accuracy."""
    keys = [k for k in ("dataset", "init", "budget", "seed") if k in curves]
    return curves.loc[curves.groupby(keys).epoch.idxmax()].reset_index(drop=True)


def exact_accuracy(acc: float, evaluated=None) -> Fraction:
    """A stored accuracy (points, rounded to 3 decimals) as the exact number it rounds: k of the
    `evaluated` images right, 100 k / evaluated. Without `evaluated` (a file before the column),
    or where 3 decimals cannot tell k from k + 1 (100,000 images or more), the stored decimal."""
    if not math.isfinite(float(acc)):
        raise CorruptFileError(f"accuracy {acc}: a final accuracy must be a number; re-create the file")
    stored = Fraction(str(float(acc)))
    if evaluated is None or pd.isna(evaluated):
        return stored
    if float(evaluated) != int(float(evaluated)) or int(float(evaluated)) < 1:
        raise CorruptFileError(f"{EVALUATED} = {evaluated!r}: images counted on must be a positive whole number")
    n = int(float(evaluated))
    if n >= 100_000:                          # 3 decimals cannot tell k from k + 1 any more
        return stored
    exact = Fraction(100 * round(stored * n / 100), n)
    if abs(exact - stored) > Fraction(1, 2000):          # 3 decimals round by at most 0.0005
        raise CorruptFileError(f"accuracy {acc} is no count of {n} images to 3 decimals: the file's "
                               f"{EVALUATED!r} column is not the split it was counted on")
    return exact


def counted_on(accuracies, n: int | None) -> bool:
    """Is every accuracy a count of n images, as exact_accuracy reads it? (None of them: no.)"""
    values = list(accuracies)
    if not n or not values:
        return False
    try:
        for acc in values:
            exact_accuracy(acc, n)
    except CorruptFileError:
        return False
    return True


def exact_accuracies(finals: pd.DataFrame) -> list[Fraction]:
    """Each row's exact accuracy: in images where every row names its split (EVALUATED), else
    every row's stored decimal (a mix would judge a tie in two arithmetics at once)."""
    named = EVALUATED in finals and finals[EVALUATED].notna().all()
    return [exact_accuracy(a, e if named else None)
            for a, e in zip(finals.test_acc, finals[EVALUATED] if named else [None] * len(finals))]


def doubling_moves(finals: pd.DataFrame) -> dict[int, dict[str, float]]:
    """{B: {arm: mean at 2B - mean at B}} for every budget B whose double also ran, in points,
    computed exactly (in images, exact_accuracy) and then made a float: a move of exactly the
    tolerance is the tolerance. In float arithmetic Trunc Normal's 18 more of 5 x 360 digits test
    images right from 160 to 320 epochs, +1 point exactly, came out 1.0000000000000142: an exact
    tie the criterion then failed by a float's rounding error."""
    exact = exact_accuracies(finals)
    means = {}
    for key, rows in pd.Series(exact, index=finals.index).groupby([finals.init, finals.budget]):
        means[key[0], int(key[1])] = sum(rows, Fraction(0)) / len(rows)
    budgets = sorted(int(b) for b in finals.budget.unique())
    arms = list(dict.fromkeys(finals.init))
    return {b: {i: float(means[i, 2 * b] - means[i, b]) for i in arms} for b in budgets if 2 * b in budgets}


def seed_moves(finals: pd.DataFrame, arm: str, budget: int) -> list[float]:
    """arm's move from budget to its double, seed by seed (points, exact as doubling_moves)."""
    rows = finals[finals.init == arm]
    exact = dict(zip(zip(rows.budget.astype(int), rows.seed), exact_accuracies(rows)))
    return [float(exact[2 * budget, s] - exact[budget, s]) for s in sorted(set(rows.seed))
            if (budget, s) in exact and (2 * budget, s) in exact]


def move_text(move: float, tolerance: float = TOLERANCE) -> str:
    """A move as the reports print it: 2 decimals, more where 2 would round a move beside the
    tolerance onto it (+1.004 is not "+1.00", which would read as a pass)."""
    digits = 2
    while digits < 17 and abs(move) != tolerance and float(f"{abs(move):.{digits}f}") == tolerance:
        digits += 1
    return f"{move:+.{digits}f}"


def converged_budget(finals: pd.DataFrame, tolerance: float = TOLERANCE) -> int | None:
    """The smallest budget whose double moves no arm's mean by more than `tolerance`; None if none."""
    for b, moves in doubling_moves(finals).items():
        if max(abs(m) for m in moves.values()) <= tolerance:
            return b
    return None


def budget_sentence(finals: pd.DataFrame | None, epochs: int, label=str, tolerance: float = TOLERANCE) -> str:
    """What the evidence says about a run of `epochs` epochs, one sentence for "What ran";
    finals None: the evidence is not fresh, so it says nothing about these cells."""
    if finals is None:
        return unmeasured_line("epoch_budget", f"Epoch budget {epochs}")
    moves = doubling_moves(finals)
    chosen = converged_budget(finals, tolerance)
    n = finals.seed.nunique()
    if epochs in moves:
        worst = max(moves[epochs], key=lambda i: abs(moves[epochs][i]))
        move = moves[epochs][worst]
        if abs(move) <= tolerance:
            # a pass whose largest mover still moves one way on every seed is a trend the
            # criterion's mean-only tolerance hides: say so beside the verdict
            each = seed_moves(finals, worst, epochs)
            trend = len(each) > 1 and (all(m > 0 for m in each) or all(m < 0 for m in each))
            edge = trend or abs(move) == tolerance
            return (f"Epoch budget {epochs}: converged by the epoch evidence's criterion"
                    f"{', on its edge' if edge else ''} ({EPOCHS_MD}, "
                    f"n = {n} seeds): doubling it to {2 * epochs} moves no arm's mean by more than "
                    f"{move_text(abs(move), tolerance).lstrip('+')} points ({label(worst)}; tolerance {tolerance:g}"
                    + (", which it meets exactly)" if abs(move) == tolerance else ")")
                    + (f", and {label(worst)} still {'gains' if move > 0 else 'loses'} on every seed "
                       f"({min(each):+.2f} to {max(each):+.2f} points)" if trend else ""))
        others = [i for i, m in moves[epochs].items() if abs(m) > tolerance and i != worst]
        return (f"Epoch budget {epochs}: NOT converged by the epoch evidence's criterion ({EPOCHS_MD}, "
                f"n = {n} seeds): doubling it to {2 * epochs} moves {label(worst)}'s mean by "
                f"{move_text(move, tolerance)} points"
                + (f" (and {', '.join(f'{label(i)} {move_text(moves[epochs][i], tolerance)}' for i in others)})"
                   if others else "")
                + f", more than the tolerance of {tolerance:g}; differences involving "
                + ("these arms" if others else "this arm") + " still describe how far training got")
    if epochs in set(finals.budget):
        return (f"Epoch budget {epochs}: measured by the epoch evidence ({EPOCHS_MD}), but not its "
                f"double ({2 * epochs}), so whether it is converged is not checked"
                + (f" (the smallest converged budget measured is {chosen})" if chosen is not None else ""))
    if chosen is not None and epochs < chosen:
        return (f"Epoch budget {epochs}: short of convergence (the epoch evidence, {EPOCHS_MD}, "
                f"finds {chosen} epochs the smallest converged budget), so these numbers rank how fast "
                "each initializer starts learning")
    return f"Epoch budget {epochs}: not one the epoch evidence ({EPOCHS_MD}) measured"


def read_budget_finals(folder: Path | None, datasets, root: Path = Path(".")) -> dict[str, pd.DataFrame | None]:
    """The epoch evidence (folder: results/evidence/epoch_budget, its epochs.csv and record) ->
    {dataset: its final-epoch rows} for each of `datasets` it measured, None for each while
    the evidence is not fresh (made from other cells, or unrecorded: structinit.records;
    root: the repository its record's paths are in); {} when there is no file (a report then
    says nothing about its budget)."""
    path = Path(folder) / "epochs.csv" if folder is not None else None
    if path is None or not path.exists():
        return {}
    curves = pd.read_csv(path)
    if not {"dataset", "init", "budget", "seed", "epoch", "test_acc"} <= set(curves.columns):
        raise CorruptFileError(f"{path}: columns {list(curves.columns)}; expected the epoch evidence's "
                               "(dataset, init, budget, seed, epoch, test_acc): re-create it with "
                               "the epoch_budget stage")
    finals = budget_finals(curves)
    fresh = evidence_freshness(folder, root).fresh
    return {ds: finals[finals.dataset == ds] if fresh else None for ds in datasets if ds in set(finals.dataset)}


def doubled_contrast_sentence(finals: pd.DataFrame | None, epochs: int | None, a: str, b: str, label=str,
                              dataset: str = "") -> str:
    """The contrast a - b at double the budget, from the epoch evidence (fresh finals), paired by
    seed, "\n  "-prefixed: a budget that passes the criterion may still move a contrast (each
    arm within the tolerance, the two in opposite directions), and a reader of the primary sees
    by how much. "" where the evidence is not fresh or did not run both arms at 2 x epochs."""
    if finals is None or epochs is None:
        return ""
    at = finals[finals.budget == 2 * epochs]
    exact = dict(zip(at.index, exact_accuracies(at)))      # in images: equal differences are equal
    ga, gb = ({s: exact[k] for k, s in zip(at.index[at.init == x], at.seed[at.init == x])} for x in (a, b))
    seeds = sorted(set(ga) & set(gb))
    if len(seeds) < 2:
        return ""
    d = stats.paired_difference({s: float(ga[s]) for s in seeds}, {s: float(gb[s]) for s in seeds})
    head = (f"\n  At double the budget ({dataset + ', ' if dataset else ''}{2 * epochs} epochs; {EPOCHS_MD}, "
            f"one run per seed, not a planned test): {label(a)} − {label(b)} {d.diff:+.2f} points")
    if len({ga[s] - gb[s] for s in seeds}) == 1:     # every seed moved alike: an interval of width 0, no test
        return f"{head}, n = {d.n}, not testable (the paired differences have no spread)."
    found = ("not distinguishable from 0" if d.ci_low <= 0 <= d.ci_high else
             f"distinguishable from 0 ({label(a)} {'>' if d.diff > 0 else '<'} {label(b)})")
    return f"{head}, 95 % CI [{d.ci_low:+.2f}, {d.ci_high:+.2f}], p = {d.p:.2g}, n = {d.n}, {found}."


def budget_sentences(budgets: dict[str, pd.DataFrame], epochs: dict[str, int], label=str) -> str:
    """" <dataset>: <budget_sentence>." for every dataset the evidence measured."""
    return "".join(f" {ds}: {budget_sentence(budgets[ds], epochs[ds], label)}." for ds in budgets)
