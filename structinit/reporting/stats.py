"""Statistics over seeds: intervals, and which planned differences the seeds support.

    summarize(values)                      mean, std (ddof=1), n, 95 % interval of the mean
    summarize(acc, bounded=True)           ... the interval on the logit scale: stays in [0, 100]
    paired_difference(a, b)                a and b matched by seed: mean difference, its 95 %
                                           t-interval, paired t p (the arms share all else)
    planned_contrasts(groups, primary=..., secondary=[...])
                                           the primary alone at alpha, Holm over the secondary,
                                           every other pair described without a verdict
    contrasts_block(contrasts)             the generated "Conclusions" section of a report
    min_detectable_difference(sd, n, alpha)
                                           the smallest true mean paired difference the paired
                                           t test detects with 80 % power (exact noncentral t)
    tost_paired(a, b, margin)              equivalence within +-margin: two one-sided paired t tests

Why paired: at one seed every arm starts from the same weights except the ones its
initializer sets, and sees the same batches in the same order (tests/test_pairing.py), so the
seed-to-seed spread they share cancels in a difference taken seed by seed. Why planned: a
report tests the contrasts fixed before the run (the main table: params.yaml `contrasts`;
each study: params.yaml `studies.<study>.contrasts`, Holm within each of its families); Holm
corrects only over those, so the paper's claim is not diluted by pairs nobody
asked about. Other pairs are shown as estimates with intervals, never as verdicts.
"""
from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import asdict, dataclass, replace

import numpy as np
from scipy import stats as sps

ALPHA = 0.05
ALTERNATIVES = ("two-sided", "greater")
TEST = ("paired t-test across seeds (the arms of one seed share every weight their initializers do "
        "not set and the data order); the primary contrast alone at alpha, Holm over the secondary "
        "contrasts of the family (the text before the colon); other pairs described, not tested")
INTERVAL = ("95 % interval of the mean accuracy: a t-interval of the mean logit of the seeds' "
            "accuracies (each clamped to [0.1, 99.9] %), mapped back, so it stays within [0, 100] "
            "(widened to hold the mean where the clamp would leave it out, e.g. every seed at 100 %); "
            "of a difference: the t-interval of the mean paired difference")
FRAGILE_FACTOR = 2.0
FRAGILE_RULE = (f"fragile: the adjusted p lies within a factor of {FRAGILE_FACTOR:g} of alpha "
                f"(alpha / {FRAGILE_FACTOR:g} <= p <= {FRAGILE_FACTOR:g} alpha), so a last-bit difference in "
                "training (another CPU, bf16 vs fp32) can flip the verdict; stated, never bolded, and "
                "not held against a re-run by ./run.sh verify")
_CLAMP = 0.001                     # accuracies as proportions, clamped for the logit


def is_fragile(p_adjusted: float, alpha: float = ALPHA) -> bool:
    """A verdict that sits so close to alpha that float noise in training may flip it."""
    return not math.isnan(p_adjusted) and alpha / FRAGILE_FACTOR <= p_adjusted <= alpha * FRAGILE_FACTOR


@dataclass(frozen=True)
class Summary:
    mean: float
    std: float        # sample std (ddof=1); 0 when n = 1
    n: int
    ci_low: float     # 95 % interval of the mean (nan when n = 1)
    ci_high: float


def _t_half(std: float, n: int, confidence: float) -> float:
    return float(sps.t.ppf(0.5 + confidence / 2, n - 1)) * std / math.sqrt(n)


def summarize(values, confidence: float = 0.95, bounded: bool = False) -> Summary:
    """bounded: values are accuracies in percent; the interval is a t-interval of the mean
    logit, mapped back (within [0, 100], asymmetric near the bounds). Otherwise a t-interval."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("no values to summarize")
    mean = float(x.mean())
    if n == 1:
        return Summary(mean, 0.0, 1, math.nan, math.nan)
    std = float(x.std(ddof=1))
    if not bounded:
        half = _t_half(std, n, confidence)
        return Summary(mean, std, n, mean - half, mean + half)
    p = np.clip(x / 100, _CLAMP, 1 - _CLAMP)
    logits = np.log(p / (1 - p))
    centre, half = float(logits.mean()), _t_half(float(logits.std(ddof=1)), n, confidence)
    back = lambda z: 100 / (1 + math.exp(-z))  # noqa: E731
    # The clamp keeps the logit finite at 0 and 100 %, but then the interval of [100, 100, 100]
    # would be [99.9, 99.9]: never report an interval that leaves out its own estimate.
    return Summary(mean, std, n, min(back(centre - half), mean), max(back(centre + half), mean))


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (same order as given)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


# --- paired differences ------------------------------------------------------------------------

@dataclass(frozen=True)
class PairedDifference:
    diff: float       # mean over seeds of a_s - b_s
    std: float        # sample std of the differences (0 when n = 1)
    n: int            # seeds both ran
    ci_low: float     # 95 % t-interval of the mean difference (nan when n = 1)
    ci_high: float
    p: float          # paired t-test p (nan: n < 2, or differences with no spread)


def _paired(a: dict, b: dict) -> tuple[list, np.ndarray]:
    """a, b: seed -> value -> (the seeds both have, in a's order; their differences a - b)."""
    seeds = [s for s in a if s in b]
    if not seeds:
        raise ValueError(f"no seed in common: {sorted(a)} vs {sorted(b)}")
    return seeds, np.array([a[s] - b[s] for s in seeds], dtype=float)


def paired_difference(a: dict, b: dict, alternative: str = "two-sided",
                      confidence: float = 0.95) -> PairedDifference:
    """a, b: seed -> value. Pairs the seeds both have. alternative "greater": H1 mean(a - b) > 0."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r}; choose one of {ALTERNATIVES}")
    _, d = _paired(a, b)
    n, diff = len(d), float(d.mean())
    if n < 2:
        return PairedDifference(diff, 0.0, n, math.nan, math.nan, math.nan)
    std = float(d.std(ddof=1))
    half = _t_half(std, n, confidence)
    if std == 0:
        return PairedDifference(diff, 0.0, n, diff, diff, math.nan)
    t = diff / (std / math.sqrt(n))
    p = float(2 * sps.t.sf(abs(t), n - 1) if alternative == "two-sided" else sps.t.sf(t, n - 1))
    return PairedDifference(diff, std, n, diff - half, diff + half, p)


@dataclass(frozen=True)
class Contrast:
    family: str       # what the pair belongs to, e.g. "digits" or "digits, cm64d4k3"
    a: str
    b: str
    role: str         # "primary" (alone at alpha), "secondary" (Holm), "descriptive" (no test)
    mean_a: float
    mean_b: float
    diff: float       # mean paired difference a - b
    ci_low: float
    ci_high: float
    n: int            # seeds paired
    alternative: str  # "two-sided" or "greater" (stated before the run)
    p: float          # paired t p (nan: descriptive or not testable)
    p_adjusted: float  # primary: p; secondary: Holm over the family's secondary; else nan
    verdict: str      # ">", "<", "~" (not distinguishable); "" for descriptive
    sd: float = math.nan          # SD of the paired differences (ddof=1; nan: n < 2)
    # secondary (Holm) contrasts: the interval at Bonferroni's width over the family's m tests,
    # confidence 1 - alpha/m (the 95 % one beside it is unadjusted); nan otherwise
    ci_adj_low: float = math.nan
    ci_adj_high: float = math.nan
    ci_adj_confidence: float = math.nan
    ci_adj_tests: int = 0         # m: the secondary tests of the family

    def to_dict(self) -> dict:
        return asdict(self)


def _verdict(diff: float, p_adjusted: float, alpha: float) -> str:
    return "~" if math.isnan(p_adjusted) or p_adjusted >= alpha else (">" if diff > 0 else "<")


def _contrast(family, a, b, role, ga, gb, alternative, alpha) -> Contrast:
    """One pair, paired by seed; a tested one's adjusted p is its own p (Holm is applied after)."""
    tested = role != "descriptive"
    d = paired_difference(ga, gb, alternative if tested else "two-sided")
    ma, mb = float(np.mean(list(ga.values()))), float(np.mean(list(gb.values())))
    p = d.p if tested else math.nan
    return Contrast(family, a, b, role, ma, mb, d.diff, d.ci_low, d.ci_high, d.n,
                    alternative if tested else "two-sided", p, p, _verdict(d.diff, p, alpha) if tested else "",
                    sd=d.std if d.n > 1 else math.nan)


def bonferroni_interval(c: Contrast, m: int, alpha: float) -> tuple[float, float, float]:
    """(low, high, confidence) of c's mean paired difference at confidence 1 - alpha/m: the
    simultaneous width of m tests, beside a Holm verdict (whose own level varies by step)."""
    confidence = 1 - alpha / m
    if c.n < 2 or math.isnan(c.sd):
        return math.nan, math.nan, confidence
    half = _t_half(c.sd, c.n, confidence)
    return c.diff - half, c.diff + half, confidence


def planned_contrasts(groups: dict[str, dict], *, family: str = "", primary: tuple | None = None,
                      secondary: list[tuple] = (), alternative: str = "two-sided",
                      alpha: float = ALPHA, describe_others: bool = True, tested: bool = True) -> list[Contrast]:
    """groups: arm -> {seed: value}. primary: (a, b) tested alone at alpha (`alternative`
    applies to it; secondary contrasts are two-sided); secondary: Holm-corrected together;
    every other pair of arms (in the groups' order) described: difference and interval only.
    tested=False: the planned pairs are described too, first. A planned pair naming an arm not
    in `groups` is skipped (not in this grid)."""
    planned = [(tuple(primary), "primary")] if primary else []
    planned += [(tuple(pair), "secondary") for pair in secondary]
    planned = [(pair, role if tested else "descriptive") for pair, role in planned
               if pair[0] in groups and pair[1] in groups]
    out = [_contrast(family, a, b, role, groups[a], groups[b], alternative if role == "primary" else "two-sided",
                     alpha) for (a, b), role in planned]
    testable = [i for i, c in enumerate(out) if c.role == "secondary" and not math.isnan(c.p)]
    for i, p_adj in zip(testable, holm([out[i].p for i in testable])):
        low, high, confidence = bonferroni_interval(out[i], len(testable), alpha)
        out[i] = replace(out[i], p_adjusted=p_adj, verdict=_verdict(out[i].diff, p_adj, alpha),
                         ci_adj_low=low, ci_adj_high=high, ci_adj_confidence=confidence,
                         ci_adj_tests=len(testable))
    if describe_others:
        seen = {frozenset(pair) for pair, _ in planned}
        out += [_contrast(family, a, b, "descriptive", groups[a], groups[b], "two-sided", alpha)
                for a, b in itertools.combinations(groups, 2) if frozenset((a, b)) not in seen]
    return out


# --- what a design can detect, and equivalence ------------------------------------------------

POWER = 0.8
POWER_METHOD = ("the smallest true mean paired difference the two-sided paired t test detects with "
                f"{100 * POWER:.0f} % power at n − 1 degrees of freedom, from the exact noncentral t distribution "
                "(noncentrality = difference · √n / SD of the paired differences), solved by root finding")


def paired_t_power(diff: float, sd: float, n: int, alpha: float = ALPHA,
                   alternative: str = "two-sided") -> float:
    """Exact power of the paired t test (n pairs, differences with standard deviation `sd`) to
    reject "mean difference 0" at level `alpha` when the true mean difference is `diff`: the
    statistic is noncentral t with n - 1 degrees of freedom and noncentrality diff * sqrt(n) / sd."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative={alternative!r}; choose one of {ALTERNATIVES}")
    if n < 2 or not sd > 0:
        raise ValueError(f"power needs n >= 2 pairs and sd > 0 (n={n}, sd={sd})")
    df, nc = n - 1, diff * math.sqrt(n) / sd
    if alternative == "greater":
        return nct_tail(sps.t.ppf(1 - alpha, df), df, nc, upper=True)
    crit = sps.t.ppf(1 - alpha / 2, df)
    return nct_tail(crit, df, nc, upper=True) + nct_tail(-crit, df, nc, upper=False)


def nct_tail(x: float, df: int, nc: float, upper: bool) -> float:
    """P(T > x) (upper) or P(T < x) of the noncentral t (df, nc): scipy.stats.nct, or, where
    its series returns nan (far tails at large nc), the same probability by integrating over
    the chi-square part: T = (Z + nc) / sqrt(V / df), so P(T > x) = E_V[Phi(nc - x sqrt(V / df))]."""
    p = float(sps.nct.sf(x, df, nc) if upper else sps.nct.cdf(x, df, nc))
    return p if math.isfinite(p) else _nct_tail_integral(x, df, nc, upper)


def _nct_tail_integral(x: float, df: int, nc: float, upper: bool) -> float:
    from scipy.integrate import quad

    def inner(v):
        w = math.sqrt(v / df)
        return (sps.norm.cdf(nc - x * w) if upper else sps.norm.cdf(x * w - nc)) * sps.chi2.pdf(v, df)
    return float(quad(inner, 0, math.inf, epsabs=1e-14, epsrel=1e-10, limit=200)[0])


def min_detectable_difference(sd: float, n: int, alpha: float = ALPHA, power: float = POWER,
                              alternative: str = "two-sided") -> float:
    """The smallest true mean paired difference (> 0, in sd's unit) that the paired t test at
    level `alpha` detects with probability `power`: the root of paired_t_power(d) = power
    (exact noncentral t; for large n it approaches (z_{1-alpha/2} + z_power) * sd / sqrt(n)).
    nan where no test is possible (n < 2, or no spread: sd 0 or nan)."""
    if n < 2 or not sd > 0:
        return math.nan
    if not 0 < alpha < power < 1:
        raise ValueError(f"need 0 < alpha < power < 1 (alpha={alpha}, power={power})")
    z_alpha = sps.norm.ppf(1 - (alpha / 2 if alternative == "two-sided" else alpha))
    guess = (z_alpha + sps.norm.ppf(power)) * sd / math.sqrt(n)   # the normal approximation: a lower bound
    high = guess
    while paired_t_power(high, sd, n, alpha, alternative) < power:
        high *= 2
    from scipy.optimize import brentq
    return float(brentq(lambda d: paired_t_power(d, sd, n, alpha, alternative) - power, 0.0, high,
                        xtol=1e-10 * sd, rtol=1e-12))


@dataclass(frozen=True)
class Detectable:
    """What one planned contrast's design detects: its n and the alpha it is tested at, and the
    smallest difference (80 % power) from two estimates of the SD of its paired differences."""
    family: str
    a: str
    b: str
    n: int            # pairs the contrast has
    alpha: float      # the level it is tested at (Holm: its family's first step, alpha / m)
    sd: float         # SD of this contrast's own paired differences (nan: n < 2)
    detectable: float  # from sd
    sd_reference: float  # SD of the reference's paired differences (e.g. the main grid's)
    n_reference: int  # pairs the reference SD is computed from
    reference: str    # what the reference is, e.g. "digits: impulse3 vs trunc_normal, main grid"
    detectable_reference: float  # from sd_reference, at this contrast's n and alpha


def detectable_differences(families: dict[str, dict], planned: list[tuple[str, str]], alpha: float = ALPHA,
                           reference=None) -> list[Detectable]:
    """families: family -> {arm: {seed: value}} (one Holm family each); planned: the pairs
    tested in every family (those whose arms a family lacks are skipped). For each planned pair
    of each family: its n, the level alpha / m it is tested at by Holm's first (strictest) step
    (m = the family's planned pairs that ran), the SD of its paired differences, and the
    smallest difference detectable with 80 % power from that SD and from a reference SD:
    reference(family, a, b) -> (sd, n, what it is), e.g. the main grid's for the same pair."""
    out = []
    for family, groups in families.items():
        pairs = [tuple(p) for p in planned if p[0] in groups and p[1] in groups]
        for a, b in pairs:
            level = alpha / len(pairs)
            d = paired_difference(groups[a], groups[b])
            sd = d.std if d.n > 1 else math.nan
            sd_ref, n_ref, what = reference(family, a, b) if reference else (math.nan, 0, "")
            out.append(Detectable(family, a, b, d.n, level, sd, min_detectable_difference(sd, d.n, level),
                                  sd_ref, n_ref, what, min_detectable_difference(sd_ref, d.n, level)))
    return out


@dataclass(frozen=True)
class Equivalence:
    """Two one-sided paired t tests (TOST): is the mean difference a - b within +-margin?"""
    family: str
    a: str
    b: str
    margin: float     # the equivalence margin, stated before the run (params.yaml)
    mean_a: float
    mean_b: float
    diff: float       # mean paired difference a - b
    ci_low: float     # the 1 - 2 alpha t-interval of the mean difference (90 % at alpha 0.05):
    ci_high: float    # equivalence <=> it lies inside (-margin, +margin)
    n: int
    p_lower: float    # H0: diff <= -margin (one-sided: larger t rejects)
    p_upper: float    # H0: diff >= +margin
    p: float          # max of the two (nan: not testable)
    p_adjusted: float  # = p (TOST is one test at alpha; named so for conclusions_record)
    alpha: float
    verdict: str      # "equivalent" (p < alpha) or "not shown"

    def to_dict(self) -> dict:
        return asdict(self)


def tost_paired(a: dict, b: dict, margin: float, alpha: float = ALPHA, family: str = "",
                names: tuple[str, str] = ("a", "b")) -> Equivalence:
    """a, b: seed -> value, paired by seed. Equivalence of a and b within +-margin by two
    one-sided paired t tests at level alpha each (Schuirmann's TOST): H0 diff <= -margin is
    rejected when t = (mean + margin) / se is large, H0 diff >= +margin when (mean - margin) / se
    is small; equivalent when both are, i.e. max(p) < alpha, i.e. the 1 - 2 alpha interval lies
    inside (-margin, +margin)."""
    if not margin > 0:
        raise ValueError(f"margin={margin}: an equivalence margin must be > 0")
    seeds, d = _paired(a, b)
    n, diff = len(d), float(d.mean())
    ma, mb = float(np.mean([a[s] for s in seeds])), float(np.mean([b[s] for s in seeds]))
    sd = float(d.std(ddof=1)) if n > 1 else 0.0
    if n < 2 or sd == 0:
        return Equivalence(family, *names, margin, ma, mb, diff, math.nan, math.nan, n, math.nan, math.nan,
                           math.nan, math.nan, alpha, "not shown")
    se, df = sd / math.sqrt(n), n - 1
    p_lower = float(sps.t.sf((diff + margin) / se, df))
    p_upper = float(sps.t.cdf((diff - margin) / se, df))
    half = _t_half(sd, n, 1 - 2 * alpha)         # the 1 - 2 alpha interval's half-width
    p = max(p_lower, p_upper)
    return Equivalence(family, *names, margin, ma, mb, diff, diff - half, diff + half, n, p_lower, p_upper,
                       p, p, alpha, "equivalent" if p < alpha else "not shown")


def equivalence_line(e: Equivalence, label=str, unit: str = "points") -> str:
    """"- family: A − B: +d points, 90 % CI [l, h], n = 3 paired: **equivalent within ±1** (TOST p = ...)"."""
    level = f"{100 * (1 - 2 * e.alpha):.0f} %"
    head = f"- {e.family}: {label(e.a)} − {label(e.b)}: {e.diff:+.2f} {unit}"
    if math.isnan(e.p):
        return (head + f", n = {e.n} paired: not testable (a paired test needs two seeds and some spread "
                "in the differences)")
    head += f", {level} CI [{e.ci_low:+.2f}, {e.ci_high:+.2f}], n = {e.n} paired"
    tests = (f"TOST p = {e.p:.2g}: H0 difference ≤ −{e.margin:g} p = {e.p_lower:.2g}, "
             f"H0 difference ≥ +{e.margin:g} p = {e.p_upper:.2g}, each one-sided at α = {e.alpha:g}")
    if e.verdict == "equivalent":
        claim = f"{label(e.a)} ≈ {label(e.b)}, equivalent within ±{e.margin:g} {unit}"
        return f"{head}: {_emphasis(claim, e.p, e.alpha)} ({tests}){_fragile_note(e.p, e.alpha)}"
    return (f"{head}: equivalence within ±{e.margin:g} {unit} not shown ({tests}; the {level} interval "
            f"reaches past ±{e.margin:g}){_fragile_note(e.p, e.alpha)}")


def equivalence_block(tests: list[Equivalence], label=str, unit: str = "points", claim: str = "") -> str:
    """The report's equivalence section; records each test (recording_conclusions)."""
    if not tests:
        return ""
    for e in tests:
        _record([e], e.alpha)
    margins = sorted({e.margin for e in tests})
    return ("## Equivalence" + (f": {claim}" if claim else "") + "\n\n"
            "Generated. Test: two one-sided paired t tests (TOST) against the equivalence margin "
            f"±{', ±'.join(f'{m:g}' for m in margins)} {unit} stated in params.yaml before the run, each "
            "one-sided test at α; \"equivalent\" only when both reject (TOST p = the larger p < α), i.e. "
            "the 1 − 2α interval of the mean paired difference lies inside the margin. A difference "
            "that is not distinguishable from 0 is not thereby equivalent: that takes this test.\n\n"
            + "\n".join(equivalence_line(e, label, unit) for e in tests) + "\n")


# --- the generated text ------------------------------------------------------------------------

def _interval(c) -> str:
    """The 95 % interval; beside a Holm verdict it is labelled unadjusted and followed by the
    Bonferroni-width interval over the family's tests: simultaneous, and conservative next to
    Holm's stepwise verdicts (Holm can reject while it still covers 0)."""
    if math.isnan(c.ci_low):
        return ""
    own = f", 95 % CI [{c.ci_low:+.2f}, {c.ci_high:+.2f}]"
    if getattr(c, "role", "") != "secondary" or not getattr(c, "ci_adj_tests", 0):
        return own
    adjusted = "" if math.isnan(c.ci_adj_low) else (
        f"; {100 * c.ci_adj_confidence:.4g} % CI [{c.ci_adj_low:+.2f}, {c.ci_adj_high:+.2f}] "
        f"(Bonferroni width over the family's {c.ci_adj_tests} tests)")
    return own + " unadjusted" + adjusted


def _emphasis(claim: str, p_adjusted: float, alpha: float) -> str:
    return claim if is_fragile(p_adjusted, alpha) else f"**{claim}**"


def _fragile_note(p_adjusted: float, alpha: float) -> str:
    return (f" — fragile (p within a factor of {FRAGILE_FACTOR:g} of α = {alpha:g})"
            if is_fragile(p_adjusted, alpha) else "")


def contrast_line(c: Contrast, label=str, alpha: float = ALPHA, unit: str = "points") -> str:
    """"- family: A − B: +d points, 95 % CI [l, h], n = 5 paired: **A > B** (p = ...)"."""
    head = f"- {c.family}: {label(c.a)} − {label(c.b)}: {c.diff:+.2f} {unit}{_interval(c)}, n = {c.n} paired"
    if c.role == "descriptive":
        return head
    p_name = "p" if c.role == "primary" else "p Holm"
    side = "" if c.alternative == "two-sided" else f", one-sided ({label(c.a)} > {label(c.b)} stated beforehand)"
    if math.isnan(c.p):
        return head + ": not testable (a paired test needs two seeds and some spread in the differences)"
    if c.verdict == "~":
        return (head + f": not distinguishable from 0 ({p_name} = {c.p_adjusted:.2g}{side})"
                + _fragile_note(c.p_adjusted, alpha))
    hi, lo = (c.a, c.b) if c.verdict == ">" else (c.b, c.a)
    return (head + f": {_emphasis(f'{label(hi)} > {label(lo)}', c.p_adjusted, alpha)} "
            f"({p_name} = {c.p_adjusted:.3g}{side}){_fragile_note(c.p_adjusted, alpha)}")


def contrasts_block(contrasts: list[Contrast], label=str, alpha: float = ALPHA, unit: str = "points",
                    title: str = "Conclusions", primary_note=None) -> str:
    """The report's conclusions: the primary contrast, the secondary ones, then the other pairs
    as estimates. Records the tested ones (recording_conclusions). primary_note(c) -> a line
    after each primary contrast's (e.g. the difference its design detects)."""
    sections = []
    has_primary = any(c.role == "primary" for c in contrasts)
    for role, head in (("primary", f"**Primary contrast** (tested alone at α = {alpha:g}):"),
                       ("secondary", ("**Secondary contrasts** (planned; " if has_primary else
                                      "**Planned contrasts** (") + "Holm-corrected together within each family):"),
                       ("descriptive", "Other pairs, described (mean paired difference and its 95 % "
                                       "interval; not tested, no verdict):")):
        lines = [contrast_line(c, label, alpha, unit) + (f"\n{primary_note(c)}" if primary_note and role == "primary"
                                                          else "") for c in contrasts if c.role == role]
        if lines:
            sections.append(head + "\n\n" + "\n".join(lines))
    _record([c for c in contrasts if c.role != "descriptive"], alpha)
    _describe([c for c in contrasts if c.role == "descriptive"])
    return (f"## {title}\n\n"
            f"Generated from the runs above. Test: {TEST}. A difference is stated (\"A > B\") only "
            f"when its adjusted p < {alpha}; {FRAGILE_RULE.split(':')[0]} verdicts are flagged and "
            "not bolded.\n\n" + "\n\n".join(sections) + "\n")


# --- conclusions as data: every report writes the verdicts it states (./run.sh verify) --------

@dataclass
class Recorded:
    tested: list      # (contrast or gap change, alpha)
    described: list   # contrasts shown without a test


_recording: list[Recorded] = []


@contextlib.contextmanager
def recording_conclusions():
    """Collects every contrast whose sentences are generated inside the block (by
    contrasts_block / gap_change_lines), for conclusions_record."""
    recorded = Recorded([], [])
    _recording.append(recorded)
    try:
        yield recorded
    finally:
        _recording.pop()


def record_tested(contrasts: list[Contrast], alpha: float = ALPHA) -> None:
    """Record planned contrasts that a report prints in its own words (contrasts_block records its own)."""
    _record(contrasts, alpha)


def _record(items, alpha: float) -> None:
    for recorded in _recording:
        recorded.tested += [(item, alpha) for item in items]


def _describe(items) -> None:
    for recorded in _recording:
        recorded.described += items


def record_described(contrasts: list[Contrast]) -> None:
    """Record contrasts that a report prints in its own words as described: estimates, no verdict."""
    _describe(contrasts)


def conclusion_id(c) -> str:
    """A stable name for one tested statement, the same in every run of the same grid."""
    if isinstance(c, GapChange):
        return f"{c.family}: gap {c.a} - {c.b}, {c.other} vs {c.base}"
    if isinstance(c, Equivalence):
        return f"{c.family}: {c.a} vs {c.b}, equivalence within +-{c.margin:g}"
    return f"{c.family}: {c.a} vs {c.b}"


def conclusions_record(report: str, recorded: Recorded) -> dict:
    """What a report concludes, machine-readable: one entry per tested statement with its
    role, verdict (">", "<", "~"), adjusted p and whether it is fragile; then the pairs it
    only describes (estimate and interval)."""
    return {"report": report, "test": TEST, "interval": INTERVAL, "fragile_rule": FRAGILE_RULE,
            "conclusions": [{"id": conclusion_id(c), **c.to_dict(), "alpha": alpha,
                             "fragile": is_fragile(c.p_adjusted, alpha)} for c, alpha in recorded.tested],
            "described": [{"id": conclusion_id(c), **c.to_dict()} for c in recorded.described]}


# --- does a difference change between conditions? (the data-size study) -----------------------

@dataclass(frozen=True)
class GapChange:
    family: str       # e.g. "digits"
    a: str            # the variant, e.g. "impulse3"
    b: str            # the reference it is compared with, e.g. "trunc_normal"
    base: str         # the condition the gap is measured from, e.g. the full training set
    other: str        # the condition it is compared at, e.g. 10 % of it
    gap_base: float   # mean over seeds of a - b at base
    gap_other: float  # mean over seeds of a - b at other
    ci_low: float     # 95 % t-interval of the mean change (gap_other - gap_base, paired by seed)
    ci_high: float
    n: int            # seeds with all four runs
    p: float          # paired t p of the change (nan: not testable)
    p_adjusted: float  # Holm over the family
    verdict: str      # ">" (the gap is larger at other), "<" (smaller), "~" (not distinguishable)
    sd: float = math.nan  # SD of the per-seed changes (what the test's power rests on; nan: n < 2)

    def to_dict(self) -> dict:
        return asdict(self)


def compare_gap_changes(groups: dict[tuple[str, str], dict], reference: str | None = None, base: str = "",
                        family: str = "", alpha: float = ALPHA, pairs: list[tuple[str, str]] | None = None
                        ) -> list[GapChange]:
    """groups[(variant, condition)] -> {seed: value}. For every planned pair (a, b) (`pairs`;
    default: every variant but `reference` against it) and every condition but `base`: does
    a - b differ between that condition and `base`? Per seed, (a - b at other) - (a - b at
    base): one paired t-test on those, the same seed's four runs sharing their initial weights'
    spread; Holm over all of them (one family). A pair naming a variant not in `groups` is skipped."""
    variants = list(dict.fromkeys(v for v, _ in groups))
    if pairs is None:
        if reference is None:
            raise ValueError("compare_gap_changes needs the planned pairs or a reference")
        pairs = [(v, reference) for v in variants if v != reference]
    pairs = [tuple(p) for p in pairs if p[0] in variants and p[1] in variants]
    conditions = [c for c in dict.fromkeys(c for _, c in groups) if c != base]
    tests = [(a, b, c) for a, b in pairs for c in conditions]

    def gaps(a, b, cond):
        x, y = groups[a, cond], groups[b, cond]
        return {s: x[s] - y[s] for s in x if s in y}
    diffs = [paired_difference(gaps(a, b, c), gaps(a, b, base)) for a, b, c in tests]
    testable = [i for i, d in enumerate(diffs) if not math.isnan(d.p)]
    adjusted = dict(zip(testable, holm([diffs[i].p for i in testable])))
    out = []
    for i, (a, b, c) in enumerate(tests):
        gap = {k: float(np.mean(list(gaps(a, b, k).values()))) for k in (base, c)}
        p_adj = adjusted.get(i, math.nan)
        d = diffs[i]
        verdict = _verdict(d.diff, p_adj, alpha)
        out.append(GapChange(family, a, b, base, c, gap[base], gap[c], d.ci_low, d.ci_high,
                             d.n, d.p, p_adj, verdict, d.std if d.n > 1 else math.nan))
    return out


def gap_change_lines(changes: list[GapChange], label=str, condition=str, unit: str = "points",
                     alpha: float = ALPHA) -> list[str]:
    """One markdown bullet per (family, variant): its gap to the reference at the base
    condition and at each other one, whether it changed (only what the test supports), and a
    closing sentence that claims a change only where one is significant."""
    lines = []
    tests = {}                 # family -> m, the Holm family's tests: the Bonferroni width beside each
    for c in changes:
        tests[c.family] = tests.get(c.family, 0) + (not math.isnan(c.p))
    for (family, a, b), group in itertools.groupby(changes, key=lambda c: (c.family, c.a, c.b)):
        group = list(group)
        first = group[0]
        parts = []
        for c in group:
            change = c.gap_other - c.gap_base
            ci = "" if math.isnan(c.ci_low) else f", 95 % CI [{c.ci_low:+.2f}, {c.ci_high:+.2f}] unadjusted"
            if ci and c.n > 1 and not math.isnan(c.sd) and tests[family]:
                centre, confidence = (c.ci_low + c.ci_high) / 2, 1 - alpha / tests[family]
                half = _t_half(c.sd, c.n, confidence)
                ci += (f"; {100 * confidence:.4g} % CI [{centre - half:+.2f}, {centre + half:+.2f}] "
                       f"(Bonferroni width over the family's {tests[family]} tests)")
            if c.verdict == "~":
                how = ("not testable" if math.isnan(c.p) else
                       f"change not distinguishable from 0 ({change:+.2f}{ci}, p = {c.p_adjusted:.2g} Holm)"
                       f"{_fragile_note(c.p_adjusted, alpha)}")
            else:
                how = (f"{_emphasis('larger' if c.verdict == '>' else 'smaller', c.p_adjusted, alpha)} by "
                       f"{abs(change):.2f} {unit}{ci} (p = {c.p_adjusted:.3g} Holm)"
                       f"{_fragile_note(c.p_adjusted, alpha)}")
            parts.append(f"{c.gap_other:+.2f} at {condition(c.other)}: {how}")
        larger = [condition(c.other) for c in group if c.verdict == ">" and not is_fragile(c.p_adjusted, alpha)]
        smaller = [condition(c.other) for c in group if c.verdict == "<" and not is_fragile(c.p_adjusted, alpha)]
        if not larger and not smaller:
            verdict = (f"No change of the gap between {condition(first.base)} and the other sizes is "
                       f"supported at n = {min(c.n for c in group)} (fragile verdicts aside).")
        else:
            verdict = " ".join(
                f"The gap is {word} at {', '.join(where)} than at {condition(first.base)}."
                for word, where in (("larger", larger), ("smaller", smaller)) if where)
        lines.append(f"- {family}, {label(a)} − {label(b)}: {first.gap_base:+.2f} {unit} at "
                     f"{condition(first.base)}; " + "; ".join(parts) + f". {verdict}")
    _record(changes, alpha)
    return lines
