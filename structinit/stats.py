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

import itertools
import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
TEST = ("Welch's t-test (two-sided, unequal variances) across seeds, Holm-corrected over the pairs "
        "of each family (the text before the colon)")


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


def conclusion_lines(comparisons: list[Comparison], label=str, alpha: float = ALPHA) -> list[str]:
    """Markdown bullets: significant differences first (largest first), then the rest."""
    def n_text(c):
        return f"n = {c.n_a}" if c.n_a == c.n_b else f"n = {c.n_a} vs {c.n_b}"

    lines = []
    sig = sorted((c for c in comparisons if c.verdict != "~"), key=lambda c: -abs(c.mean_a - c.mean_b))
    for c in sig:
        hi, lo = (c.a, c.b) if c.verdict == ">" else (c.b, c.a)
        lines.append(f"- {c.family}: **{label(hi)} > {label(lo)}** by {abs(c.mean_a - c.mean_b):.2f} points "
                     f"(p = {c.p_holm:.3g} Holm, {n_text(c)})")
    for c in comparisons:
        if c.verdict != "~":
            continue
        if math.isnan(c.p):
            lines.append(f"- {c.family}: {label(c.a)} vs {label(c.b)}: not testable at {n_text(c)} "
                         "(a test needs two seeds per side and some spread)")
        else:
            lines.append(f"- {c.family}: {label(c.a)} vs {label(c.b)}: not distinguishable at {n_text(c)} "
                         f"(difference {c.mean_a - c.mean_b:+.2f}, p = {c.p_holm:.2g} Holm)")
    return lines


def conclusions_block(comparisons: list[Comparison], label=str, alpha: float = ALPHA) -> str:
    return ("## Conclusions\n\n"
            f"Generated from the cells above. Test: {TEST}; \"A > B\" only when the corrected "
            f"p < {alpha}. Anything else is stated as not distinguishable.\n\n"
            + "\n".join(conclusion_lines(comparisons, label, alpha)) + "\n")
