"""Statistics over seeds: intervals, and which differences the seeds support.

    summarize(values)                    mean, std (ddof=1), n, 95 % t-interval
    compare_all(groups, family=...)      every pair: Welch's t-test, Holm-corrected p
    conclusion_lines(comparisons)        one sentence per pair, only what the test supports

The pairs of one family (a table's pairs on one dataset, or within one study size or
shape) are corrected together (Holm), so within a family the chance of any false "A > B"
stays at alpha; each family is named in its sentences. With n = 1 no test is possible and
every pair reads "not testable".
"""
from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
TEST = ("Welch's t-test (two-sided, unequal variances) across seeds, Holm-corrected over the pairs "
        "of each family (the text before the colon)")
FRAGILE_FACTOR = 2.0
FRAGILE_RULE = (f"fragile: the corrected p lies within a factor of {FRAGILE_FACTOR:g} of alpha "
                f"(alpha / {FRAGILE_FACTOR:g} <= p <= {FRAGILE_FACTOR:g} alpha), so a last-bit difference in "
                "training (another CPU, bf16 vs fp32) can flip the verdict; stated, never bolded, and "
                "not held against a re-run by ./run.sh verify")


def is_fragile(p_adjusted: float, alpha: float = ALPHA) -> bool:
    """A verdict that sits so close to alpha that float noise in training may flip it."""
    return not math.isnan(p_adjusted) and alpha / FRAGILE_FACTOR <= p_adjusted <= alpha * FRAGILE_FACTOR


@dataclass(frozen=True)
class Summary:
    mean: float
    std: float        # sample std (ddof=1); 0 when n = 1
    n: int
    ci_low: float     # 95 % t-interval of the mean (nan when n = 1)
    ci_high: float


def summarize(values, confidence: float = 0.95) -> Summary:
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("no values to summarize")
    mean = float(x.mean())
    if n == 1:
        return Summary(mean, 0.0, 1, math.nan, math.nan)
    std = float(x.std(ddof=1))
    half = float(sps.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)
    return Summary(mean, std, n, mean - half, mean + half)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class Comparison:
    family: str       # what the pair belongs to, e.g. "digits" or "digits, cm64d4k3"
    a: str
    b: str
    mean_a: float
    mean_b: float
    n_a: int
    n_b: int
    p: float          # Welch's two-sided p (nan: not testable)
    p_holm: float
    verdict: str      # ">" (a significantly higher), "<", or "~" (not distinguishable)

    def to_dict(self) -> dict:
        return asdict(self)


def welch_p(a, b) -> float:
    """Two-sided Welch p; nan when a group has one value or both have zero variance."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if len(a) < 2 or len(b) < 2 or (a.std() == 0 and b.std() == 0):
        return math.nan
    return float(sps.ttest_ind(a, b, equal_var=False).pvalue)


def compare_all(groups: dict[str, list[float]], family: str = "", alpha: float = ALPHA) -> list[Comparison]:
    """Every pair of groups (in the given order), Holm-corrected within this family."""
    pairs = list(itertools.combinations(groups, 2))
    raw = [welch_p(groups[a], groups[b]) for a, b in pairs]
    testable = [i for i, p in enumerate(raw) if not math.isnan(p)]
    adjusted = dict(zip(testable, holm([raw[i] for i in testable])))
    out = []
    for i, (a, b) in enumerate(pairs):
        ma, mb = float(np.mean(groups[a])), float(np.mean(groups[b]))
        p_holm = adjusted.get(i, math.nan)
        verdict = "~" if math.isnan(p_holm) or p_holm >= alpha else (">" if ma > mb else "<")
        out.append(Comparison(family, a, b, ma, mb, len(groups[a]), len(groups[b]),
                              raw[i], p_holm, verdict))
    return out


def conclusion_lines(comparisons: list[Comparison], label=str, alpha: float = ALPHA,
                     unit: str = "points") -> list[str]:
    """Markdown bullets: significant differences first (largest first), then the rest."""
    def n_text(c):
        return f"n = {c.n_a}" if c.n_a == c.n_b else f"n = {c.n_a} vs {c.n_b}"

    lines = []
    sig = sorted((c for c in comparisons if c.verdict != "~"), key=lambda c: -abs(c.mean_a - c.mean_b))
    for c in sig:
        hi, lo = (c.a, c.b) if c.verdict == ">" else (c.b, c.a)
        claim = f"{label(hi)} > {label(lo)}"
        lines.append(f"- {c.family}: {_emphasis(claim, c.p_holm, alpha)} by {abs(c.mean_a - c.mean_b):.2f} {unit} "
                     f"(p = {c.p_holm:.3g} Holm, {n_text(c)}){_fragile_note(c.p_holm, alpha)}")
    for c in comparisons:
        if c.verdict != "~":
            continue
        if math.isnan(c.p):
            lines.append(f"- {c.family}: {label(c.a)} vs {label(c.b)}: not testable at {n_text(c)} "
                         "(a test needs two seeds per side and some spread)")
        else:
            lines.append(f"- {c.family}: {label(c.a)} vs {label(c.b)}: not distinguishable at {n_text(c)} "
                         f"(difference {c.mean_a - c.mean_b:+.2f}, p = {c.p_holm:.2g} Holm)"
                         f"{_fragile_note(c.p_holm, alpha)}")
    _record(comparisons, alpha)
    return lines


def _emphasis(claim: str, p_adjusted: float, alpha: float) -> str:
    return claim if is_fragile(p_adjusted, alpha) else f"**{claim}**"


def _fragile_note(p_adjusted: float, alpha: float) -> str:
    return (f" — fragile (p within a factor of {FRAGILE_FACTOR:g} of α = {alpha:g})"
            if is_fragile(p_adjusted, alpha) else "")


# --- conclusions as data: every report writes the verdicts it states (./run.sh verify) --------

_recording: list[list] = []


@contextlib.contextmanager
def recording_conclusions():
    """Collects every comparison whose sentences are generated inside the block (by
    conclusion_lines / gap_change_lines), for conclusions_record."""
    entries: list = []
    _recording.append(entries)
    try:
        yield entries
    finally:
        _recording.pop()


def _record(items, alpha: float) -> None:
    for entries in _recording:
        entries += [(item, alpha) for item in items]


def conclusion_id(c) -> str:
    """A stable name for one tested statement, the same in every run of the same grid."""
    if isinstance(c, GapChange):
        return f"{c.family}: gap {c.a} - {c.b}, {c.other} vs {c.base}"
    return f"{c.family}: {c.a} vs {c.b}"


def conclusions_record(report: str, entries: list) -> dict:
    """What a report concludes, machine-readable: one entry per tested statement with its
    verdict (">", "<", "~"), corrected p and whether it is fragile."""
    return {"report": report, "test": TEST, "fragile_rule": FRAGILE_RULE,
            "conclusions": [{"id": conclusion_id(c), **c.to_dict(), "alpha": alpha,
                             "fragile": is_fragile(c.p_holm, alpha)} for c, alpha in entries]}


def conclusions_block(comparisons: list[Comparison], label=str, alpha: float = ALPHA,
                      unit: str = "points", title: str = "Conclusions") -> str:
    return (f"## {title}\n\n"
            f"Generated from the cells above. Test: {TEST}; \"A > B\" only when the corrected "
            f"p < {alpha}. Anything else is stated as not distinguishable.\n\n"
            + "\n".join(conclusion_lines(comparisons, label, alpha, unit)) + "\n")


# --- does a difference change between conditions? (the data-size study) -----------------------

@dataclass(frozen=True)
class GapChange:
    family: str       # e.g. "digits"
    a: str            # the variant, e.g. "impulse3"
    b: str            # the reference it is compared with, e.g. "trunc_normal"
    base: str         # the condition the gap is measured from, e.g. the full training set
    other: str        # the condition it is compared at, e.g. 10 % of it
    gap_base: float   # mean(a) - mean(b) at base
    gap_other: float  # mean(a) - mean(b) at other
    n: int            # the smallest group
    p: float          # two-sided p of gap_other - gap_base (nan: not testable)
    p_holm: float
    verdict: str      # ">" (the gap is larger at other), "<" (smaller), "~" (not distinguishable)

    def to_dict(self) -> dict:
        return asdict(self)


def difference_of_differences_p(a_other, b_other, a_base, b_base) -> float:
    """Two-sided p of (mean a_other - mean b_other) - (mean a_base - mean b_base) = 0, four
    independent groups: a t-statistic with the Welch-Satterthwaite degrees of freedom (what
    Welch's test is for two groups). nan when a group has one value or there is no spread."""
    groups = [np.asarray(g, float) for g in (a_other, b_other, a_base, b_base)]
    if any(len(g) < 2 for g in groups):
        return math.nan
    terms = [g.var(ddof=1) / len(g) for g in groups]
    se2 = sum(terms)
    if se2 == 0:
        return math.nan
    dof = se2 ** 2 / sum(t ** 2 / (len(g) - 1) for t, g in zip(terms, groups))
    diff = (groups[0].mean() - groups[1].mean()) - (groups[2].mean() - groups[3].mean())
    return float(2 * sps.t.sf(abs(diff) / math.sqrt(se2), dof))


def compare_gap_changes(groups: dict[tuple[str, str], list[float]], reference: str, base: str,
                        family: str = "", alpha: float = ALPHA) -> list[GapChange]:
    """groups[(variant, condition)] -> values. For every variant but `reference` and every
    condition but `base`: does variant - reference differ between that condition and `base`?
    Holm-corrected over all of them (one family)."""
    variants = [v for v in dict.fromkeys(v for v, _ in groups) if v != reference]
    conditions = [c for c in dict.fromkeys(c for _, c in groups) if c != base]
    pairs = [(v, c) for v in variants for c in conditions]
    raw = [difference_of_differences_p(groups[v, c], groups[reference, c], groups[v, base],
                                       groups[reference, base]) for v, c in pairs]
    testable = [i for i, p in enumerate(raw) if not math.isnan(p)]
    adjusted = dict(zip(testable, holm([raw[i] for i in testable])))
    out = []
    for i, (v, c) in enumerate(pairs):
        gap = {k: float(np.mean(groups[v, k]) - np.mean(groups[reference, k])) for k in (base, c)}
        p_holm = adjusted.get(i, math.nan)
        verdict = "~" if math.isnan(p_holm) or p_holm >= alpha else (">" if gap[c] > gap[base] else "<")
        n = min(len(groups[k]) for k in ((v, c), (reference, c), (v, base), (reference, base)))
        out.append(GapChange(family, v, reference, base, c, gap[base], gap[c], n, raw[i], p_holm, verdict))
    return out


def gap_change_lines(changes: list[GapChange], label=str, condition=str, unit: str = "points") -> list[str]:
    """One markdown bullet per (family, variant): its gap to the reference at the base
    condition and at each other one, whether it changed (only what the test supports), and a
    closing sentence that claims a change only where one is significant."""
    lines = []
    for (family, a, b), group in itertools.groupby(changes, key=lambda c: (c.family, c.a, c.b)):
        group = list(group)
        first = group[0]
        parts = []
        for c in group:
            change = c.gap_other - c.gap_base
            if c.verdict == "~":
                how = ("not testable" if math.isnan(c.p) else
                       f"change not distinguishable from 0 ({change:+.2f}, p = {c.p_holm:.2g} Holm)")
            else:
                how = (f"{_emphasis('larger' if c.verdict == '>' else 'smaller', c.p_holm, ALPHA)} by "
                       f"{abs(change):.2f} {unit} (p = {c.p_holm:.3g} Holm){_fragile_note(c.p_holm, ALPHA)}")
            parts.append(f"{c.gap_other:+.2f} at {condition(c.other)}: {how}")
        larger = [condition(c.other) for c in group if c.verdict == ">"]
        smaller = [condition(c.other) for c in group if c.verdict == "<"]
        if not larger and not smaller:
            verdict = (f"No change of the gap between {condition(first.base)} and the other sizes is "
                       f"supported at n = {min(c.n for c in group)}.")
        else:
            verdict = " ".join(
                f"The gap is {word} at {', '.join(where)} than at {condition(first.base)}."
                for word, where in (("larger", larger), ("smaller", smaller)) if where)
        lines.append(f"- {family}, {label(a)} − {label(b)}: {first.gap_base:+.2f} {unit} at "
                     f"{condition(first.base)}; " + "; ".join(parts) + f". {verdict}")
    _record(changes, ALPHA)
    return lines
