"""Replication check: the main table's planned conclusions tested again on a disjoint set of
seeds, made by the frozen stage replication (stages/replication.py: results/evidence/replication/).

The stage trains the main table on new seeds (the real `dvc repro aggregate`, in a scratch
copy of the repository: structinit/pipeline/scratch.py) and compares reports/conclusions/main_table.json of
both runs pair by pair:
  confirmed      the same significant direction on the new seeds
  not replicated significant before, not distinguishable now
  reversed       significant in the opposite direction
  consistent     not distinguishable before or now
  new            not distinguishable before, significant now
Beside each verdict: each half's estimate and 95 % interval, and the two halves pooled (n =
both seed sets, paired by seed), labelled post hoc: pooling was decided after both were seen.
Each half's CPU, dtype and package versions (what its runs logged) head the table. The
replication's per-seed outputs (metrics, params, init record and test curve of every run) are
kept beside the report (keep_outputs), so that the pooled figures can be recomputed.
"""
import json
import shutil
from pathlib import Path

import yaml
from tabulate import tabulate

KEEP_FILES = ("metrics.json", "params.yaml", "init.json", "plots/metrics/test/acc.tsv")


def verdict(before: str, after: str) -> str:
    if before == "~":
        return "consistent" if after == "~" else "new"
    if after == before:
        return "confirmed"
    return "not replicated" if after == "~" else "reversed"


def keep_outputs(results: Path, dest: Path) -> None:
    """Copy every run's small outputs (KEEP_FILES) of a results/train tree to dest, replacing it."""
    shutil.rmtree(dest, ignore_errors=True)
    for metrics in sorted(results.glob("*/seed*/metrics.json")):
        run = metrics.parent
        for name in KEEP_FILES:
            if (run / name).exists():
                target = dest / run.relative_to(results) / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(run / name, target)


def _runs(results: Path, seeds: list) -> list[Path]:
    """The finished runs of `seeds` in a results/train tree (<cell>/seed<s>/ with metrics.json)."""
    return [m.parent for m in sorted(results.glob("*/seed*/metrics.json")) if int(m.parent.name[4:]) in seeds]


def _accuracies(results: Path, seeds: list) -> dict:
    """(dataset, init) -> {seed: final test accuracy in %} for the runs of `seeds` in a
    results/train tree (cells named <dataset>-<init>)."""
    out: dict = {}
    for run in _runs(results, seeds):
        dataset, init = run.parent.name.split("-", 1)
        out.setdefault((dataset, init), {})[int(run.name[4:])] = \
            100 * json.loads((run / "metrics.json").read_text())["final_test_acc"]
    return out


def halves(first: Path, second: Path, seeds: list, new: list) -> dict:
    """What the report adds to the verdicts: the per-seed accuracies of both halves (for the
    pooled, post-hoc estimate) and what each half ran on ("" where a half has no runs)."""
    from structinit.reporting.runs import ran_with

    return {"values": (_accuracies(first, seeds), _accuracies(second, new)),
            "ran": (ran_with(_runs(first, seeds)), ran_with(_runs(second, new)))}


def computed_on(results: Path, seeds: list) -> str:
    """What a half's runs computed in and on, short: e.g. "bf16 on AMD EPYC" (several, joined
    with "; ", where its runs differ); ran_with's long sentence is the report's."""
    seen = []
    for run in _runs(results, seeds):
        logged = yaml.safe_load((run / "params.yaml").read_text())
        where = logged.get("cpu") if logged.get("device") == "cpu" else logged.get("device")
        one = f"{logged.get('compute_dtype', 'an unrecorded dtype')} on {where or 'an unrecorded device'}"
        seen += [one] if one not in seen else []
    return "; ".join(seen)


def _half(c: dict) -> str:
    ci = "" if c.get("ci_low") is None or c["ci_low"] != c["ci_low"] else f" [{c['ci_low']:+.2f}, {c['ci_high']:+.2f}]"
    return f"{c['diff']:+.2f}{ci}"


def _pooled_difference(values: tuple, family: str, a: str, b: str):
    """Both halves' seeds together, paired by seed (a PairedDifference), or None with < 2 pairs."""
    from structinit.reporting.stats import paired_difference

    first, second = values
    xa = {**first.get((family, a), {}), **second.get((family, a), {})}
    xb = {**first.get((family, b), {}), **second.get((family, b), {})}
    return paired_difference(xa, xb) if len(set(xa) & set(xb)) >= 2 else None


def _pooled(values: tuple, family: str, a: str, b: str) -> str:
    """Both halves' seeds together, paired by seed: the estimate, 95 % interval, p and n."""
    d = _pooled_difference(values, family, a, b)
    if d is None:
        return "—"
    return f"{d.diff:+.2f} [{d.ci_low:+.2f}, {d.ci_high:+.2f}], p={d.p:.2g}, n={d.n}"


def primary_record(original: dict, again: dict, seeds: list, new: list, values: tuple | None = None,
                   computed_on: str = "", report: str = "results/evidence/replication/replication.md") -> dict:
    """The primary contrast of each dataset, both halves and pooled, as data: what the main
    table's headline quotes (structinit.reporting.main_report.replication_sentence), beside
    the markdown report. computed_on: what the replication's runs computed in and on."""
    after = {(c["family"], c["a"], c["b"]): c for c in again["conclusions"]}

    def half(c, on):
        return {"seeds": on, **{k: c[k] for k in ("diff", "ci_low", "ci_high", "p", "n", "verdict")}}
    primary = []
    for c in original["conclusions"]:
        d = after.get((c["family"], c["a"], c["b"]))
        if c.get("role") != "primary" or d is None:
            continue
        pooled = _pooled_difference(values, c["family"], c["a"], c["b"]) if values else None
        primary.append({"dataset": c["family"], "a": c["a"], "b": c["b"], "stated": half(c, seeds),
                        "replication": half(d, new), "verdict": verdict(c["verdict"], d["verdict"]),
                        "pooled_post_hoc": None if pooled is None else {
                            "n": pooled.n, "diff": pooled.diff, "ci_low": pooled.ci_low, "ci_high": pooled.ci_high,
                            "p": pooled.p}})
    return {"report": report, "computed_on": computed_on, "primary": primary}


def _stated(c: dict) -> str:
    p = c.get("p_adjusted", c.get("p_holm"))
    diff = c["diff"] if "diff" in c else c["mean_a"] - c["mean_b"]
    return f"{c['verdict']} ({diff:+.2f}, p={p:.2g}{', fragile' if c.get('fragile') else ''})"


def replication_report(original: dict, again: dict, seeds: list, new: list, values: tuple | None = None,
                       ran: tuple = ("", "")) -> str:
    """Each planned conclusion of the committed main table against the same test on new seeds,
    with each half's estimate and interval; values ((dataset, init) -> {seed: acc} of each
    half) adds the pooled, post-hoc estimate; ran: each half's "Computed in ..." sentence."""
    after = {(c["family"], c["a"], c["b"]): c for c in again["conclusions"]}
    rows, stated, confirmed = [], 0, 0
    for c in original["conclusions"]:
        d = after.get((c["family"], c["a"], c["b"]))
        pooled = _pooled(values, c["family"], c["a"], c["b"]) if values else "—"
        if d is None:
            rows.append([c["family"], c.get("role", ""), f"{c['a']} vs {c['b']}", _stated(c), _half(c),
                         "not run", "—", pooled, "—"])
            continue
        v = verdict(c["verdict"], d["verdict"])
        stated += c["verdict"] != "~"
        confirmed += v == "confirmed"
        rows.append([c["family"], c.get("role", ""), f"{c['a']} vs {c['b']}", _stated(c), _half(c), _stated(d),
                     _half(d), pooled, v])
    where = "".join(f"\n- seeds {s}: {r or 'no runs found'}" for s, r in zip((seeds, new), ran) if any(ran))
    return (f"# Replication of the main table's planned conclusions (stage replication)\n\n"
            f"Seeds {seeds} (reports/) vs {new} (replication, disjoint). Test: {original['test']}.\n"
            + (f"\nWhat each half ran on:{where}\n" if where else "") +
            "\nEach half: its verdict, the mean paired difference (points) and its 95 % interval (unadjusted). "
            "Pooled: both halves' seeds together, paired by seed — post hoc (pooling was decided after both "
            "halves were seen), an estimate, not a test of the stated conclusion.\n\n"
            + tabulate(rows, headers=["dataset", "role", "contrast", "stated", "stated: diff [95 % CI]",
                                      "replication", "replication: diff [95 % CI]", "pooled (post hoc)",
                                      "verdict"], tablefmt="github")
            + f"\n\nconfirmed: {confirmed} of {stated} stated differences\n")


