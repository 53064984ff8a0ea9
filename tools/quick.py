"""A quick look: the real pipeline on a reduced budget, in a temporary copy, in minutes.

    ./run.sh quick                          # the same as: python -m tools.quick
    python -m tools.quick --dry-run         # what it would run, and the time it expects; trains nothing
    python -m tools.quick --epochs 40 --seeds 0 1 2 --arms trunc_normal impulse3 -S data.train_size=0.5

In a temporary copy of the code and params.yaml without outputs (structinit/pipeline/scratch.py; deleted unless
--keep; this repository's results stay as they are), sets a reduced budget (30 of the recipe's 160 epochs, its
warm-up share kept; seeds 0 and 1; the main grid's arms; the test set every epoch; studies off; the speed endpoint
at half the budget), checks it as `check_params` would and runs `dvc repro aggregate curves`: the stages of
`./run.sh repro`, on less. Prints what to expect, each stage, each arm's curve and final accuracy and both
contrasts with paired intervals: a quick look, not the result (2 seeds, a fifth of the budget: wide intervals).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
import time
from pathlib import Path

import pandas as pd
import yaml
from tabulate import tabulate

from structinit.pipeline import cells, scratch
from structinit.pipeline.load import load_params
from structinit.pipeline.params import ParamsError, validate_params
from structinit.reporting.presentation import init_label

REPO = scratch.REPO
DATASET = "digits"
EPOCHS = 30                       # of the recipe's 160: the curves leave the plateau before it ends
SEEDS = [0, 1]
SPEED_FRACTION = 0.5              # not the pipeline's 1/8: of 30 epochs that is epoch 4, still at chance
TARGETS = ("aggregate", "curves")
CHANCE = 12.5                     # % test accuracy; with 10 classes, 8-12 % is chance
BARS = "▁▂▃▄▅▆▇█"


def quick_params(params: dict, epochs: int = EPOCHS, seeds: list[int] = SEEDS, arms: list[str] | None = None,
                 overrides: list[str] = ()) -> dict:
    """params.yaml at the quick budget, then `overrides` ("key.path=value", YAML values, as dvc exp run -S)."""
    p = copy.deepcopy(dict(params))
    grid, studies = p["grid"], p["studies"]
    main = cells.main_inits(p)
    arms = list(arms or main)
    unknown = [a for a in arms if a not in main and cells.impulse_kernel(a) is None and a not in grid["baselines"]]
    if unknown:
        raise ValueError(f"--arms {unknown}: not an arm of the main grid {main}")
    kernels = [cells.impulse_kernel(a) for a in arms if cells.impulse_kernel(a) is not None]
    if not kernels:
        raise ValueError(f"--arms {arms}: name at least one structured-init arm (e.g. impulse3): it is what the "
                         "quick look compares")
    grid.update(datasets=[DATASET], streamed_datasets=[], gpu_datasets=[], variants=[], seeds=list(seeds),
                kernels=kernels, baselines=[a for a in arms if cells.impulse_kernel(a) is None])
    if p["init"]["kernel"] not in kernels:
        p["init"]["kernel"] = kernels[0]
    train = p["recipes"][DATASET]["train"]
    share = train["warmup_epochs"] / train["epochs"]
    train.update(epochs=epochs, warmup_epochs=round(share * epochs, 3), eval_every=1)
    if p["contrasts"].get("speed"):
        p["contrasts"]["speed"]["fraction"] = SPEED_FRACTION
    inits = grid["baselines"] + [cells.impulse_init(k) for k in kernels]
    for name in cells.STUDIES:                        # off, and consistent with the smaller grid
        study = studies[name]
        study["datasets"] = []
        study["seeds"] = [s for s in study["seeds"] if s in seeds] or list(seeds[:1])
        if "inits" in study:
            study["inits"] = [i for i in study["inits"] if i in inits] or inits[:1]
    if studies["pseudo_input"]["kernel"] not in kernels:
        studies["pseudo_input"]["kernel"] = kernels[0]
    studies["regime"]["datasets"] = []
    if "gpu" in studies["data_size"]:                 # a GPU dataset's frozen cells are not this grid's
        studies["data_size"]["gpu"]["datasets"] = []
    for item in overrides:
        key, _, raw = item.partition("=")
        if not _:
            raise ValueError(f"-S {item!r}: expected KEY=VALUE, e.g. data.train_size=300")
        *path, last = key.split(".")
        node = p
        for part in path:
            node = node[part]
        node[last] = yaml.safe_load(raw)
    return p


def stage_names(p: dict) -> list[str]:
    """The stages `dvc repro aggregate curves` runs in a fresh copy, in order."""
    d = DATASET
    kernels = p["grid"]["kernels"]
    return (["check_params", f"download@{d}"] + [cells.solve_stage(d, k) for k in kernels]
            + [f"reference_solve@{cells.solve_cell(d, k)}" for k in kernels]
            + [cells.main_stage("train", d, i, p) for i in cells.main_inits(p)] + list(TARGETS))


def expectation(curves_csv: Path, params: dict) -> str:
    """When the committed run's arms left chance (reports/curves.csv), so a short run at chance reads as working."""
    if not curves_csv.exists():
        return ""
    t = pd.read_csv(curves_csv).dropna(subset=["test_acc"])
    t = t[t.dataset == DATASET]
    if t.empty:
        return ""
    mean = t.groupby(["init", "epoch"]).test_acc.mean().unstack("init")
    first = int(mean.index.min())
    near = [i for i in mean.columns if mean.loc[first, i] <= CHANCE]
    flat = [i for i in mean.columns if i not in near]
    headline = f"impulse{params['init']['kernel']}"
    train = params["recipes"][DATASET]["train"]
    lines = [f"What to expect. In the committed {train['epochs']}-epoch run (reports/curves.csv; warm-up "
             f"{train['warmup_epochs']} epochs), test accuracy at epoch {first} was near chance (10 classes: "
             f"8-12 %) for " + (f"every arm but {', '.join(map(init_label, flat))}" if flat else "every arm")
             + f" ({', '.join(f'{init_label(i)} {mean.loc[first, i]:.1f}' for i in near)} %)."]
    for init in (headline, "trunc_normal"):
        up = mean.index[mean[init] > CHANCE] if init in mean.columns else []
        if len(up) and up.min() > first:                    # at chance at first, above it later
            until = int(mean.index[mean.index < up.min()].max())
            later = mean.index[mean.index > until]
            step = int(later[min(1, len(later) - 1)])
            lines.append(f"{init_label(init)} stayed there until epoch {until} ({mean.loc[until, init]:.1f} %; "
                         f"{mean.loc[step, init]:.1f} % at epoch {step}).")
    lines.append("With Adam's eps of 1e-3 the arms whose weights start small leave that plateau late, while "
                 "the warm-up ramps the learning rate up from 0: a run of a few epochs that shows "
                 f"{init_label(headline)} at 0.08-0.12 is working as the curves predict.")
    return " ".join(lines)


def estimate_seconds(p: dict, default: dict, fresh_repro_md: str) -> float | None:
    """The quick run's seconds on the committed run's CPU: its model-epochs at the committed run's training rate
    (benchmarks/fresh_repro.md), +10 % for testing every epoch, ~8 s start-up per stage, ~5 s per reference
    solve (10,000 Adam steps)."""
    rows = re.findall(r"^\|\s*train_(?:baseline|impulse)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|", fresh_repro_md, re.M)
    if not rows:
        return None
    per_run = default["recipes"][DATASET]["train"]["epochs"] * len(default["grid"]["seeds"])
    rate = sum(float(s) for _, s in rows) / sum(int(r) for r, _ in rows) / per_run      # s per model-epoch
    seeds = len(p["grid"]["seeds"])
    model_epochs = len(cells.main_inits(p)) * seeds * p["recipes"][DATASET]["train"]["epochs"]
    return model_epochs * rate * 1.1 + 8 * len(stage_names(p)) + 5 * seeds * len(p["grid"]["kernels"])


def run_pipeline(repo: Path, verbose: bool, log: Path) -> int:
    """`dvc repro aggregate curves` in the copy, printing each stage as it starts."""
    env = scratch.pipeline_env(repo, "quick")
    scratch.commit(repo, "quick look", env)
    start = time.monotonic()

    def said(line: str) -> None:
        if verbose:
            print(line, end="", flush=True)
        elif m := re.search(r"Running stage '([^']+)'", line):
            elapsed = int(time.monotonic() - start)
            print(f"  [{elapsed // 60:2d}:{elapsed % 60:02d}] {m[1]}", flush=True)
    code = scratch.run_dvc(repo, "repro", *TARGETS, env=env, on_line=said, log=log)
    elapsed = int(time.monotonic() - start)
    print(f"  [{elapsed // 60:2d}:{elapsed % 60:02d}] done" if code == 0 else
          f"  dvc repro failed (exit {code}) after {elapsed} s", flush=True)
    return code


def sparkline(values: list[float]) -> str:
    """0-100 % as one bar per value."""
    return "".join(BARS[min(len(BARS) - 1, int(v / 100 * len(BARS)))] if not math.isnan(v) else " " for v in values)


def learned(repo: Path, p: dict) -> str:
    """The run's curves, final accuracies and contrasts, from the copy's reports."""
    inits = cells.main_inits(p)
    t = pd.read_csv(repo / "reports/curves.csv").dropna(subset=["test_acc"])
    mean = t.groupby(["init", "epoch"]).test_acc.mean().unstack("init").reindex(columns=inits)
    epochs = p["recipes"][DATASET]["train"]["epochs"]
    width = max(len(init_label(i)) for i in inits)
    out = [f"Test accuracy per epoch (%, mean over seeds {', '.join(map(str, p['grid']['seeds']))}; each bar one "
           f"epoch, from 0 to 100 %):", ""]
    out += [f"  {init_label(i):<{width}}  {sparkline(list(mean[i]))}  {mean[i].iloc[0]:5.1f} -> "
            f"{mean[i].iloc[-1]:5.1f}" for i in inits]
    step = max(1, math.ceil(len(mean) / 15))          # at most about 15 rows, the last epoch always
    shown = mean.iloc[sorted({*range(step - 1, len(mean), step), len(mean) - 1})]
    out += ["", tabulate([[int(e), *[f"{v:.1f}" for v in row]] for e, row in shown.iterrows()],
                         headers=["epoch", *map(init_label, inits)], tablefmt="github", disable_numparse=True)]
    summary = json.loads((repo / "reports/summary.json").read_text())[DATASET]
    final = t[t.epoch == t.epoch.max()]
    rows = []
    for i in inits:
        per_seed = final[final.init == i].sort_values("seed").test_acc
        arm = summary[i]
        rows.append([init_label(i), f"{arm['acc']:.2f}", f"[{arm['ci95_low']:.1f}, {arm['ci95_high']:.1f}]",
                     ", ".join(f"{v:.1f}" for v in per_seed)])
    out += ["", f"Final test accuracy (%) at epoch {epochs}:", "",
            tabulate(rows, headers=["arm", "mean", "95 % CI", "per seed"], tablefmt="github", disable_numparse=True),
            ""]
    for c in json.loads((repo / "reports/conclusions/main_table.json").read_text())["conclusions"]:
        if c["role"] != "primary":
            continue
        a, b = init_label(c["a"]), init_label(c["b"])
        what = (f"Speed endpoint (contrasts.speed), test accuracy at epoch {c['family'].rsplit(' ', 1)[1]} of {epochs}"
                if ", epoch" in c["family"] else f"Primary contrast, final test accuracy at epoch {epochs}")
        if math.isnan(c["p"]):
            verdict = "not testable (the paired differences have no spread)"
        else:
            verdict = {">": f"{a} ahead", "<": f"{a} behind", "~": "not distinguishable from 0"}[c["verdict"]]
            verdict += f" (p = {c['p']:.2g})"
        out.append(f"{what}: {a} - {b} = {c['diff']:+.2f} points, 95 % CI [{c['ci_low']:+.2f}, {c['ci_high']:+.2f}], "
                   f"n = {c['n']} paired: {verdict}")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=EPOCHS, help=f"the budget (default {EPOCHS})")
    ap.add_argument("--seeds", type=int, nargs="+", default=SEEDS, help="default: 0 1")
    ap.add_argument("--arms", nargs="+", help="initializers (default: the main grid's), e.g. trunc_normal impulse3")
    ap.add_argument("-S", "--set", action="append", default=[], metavar="KEY=VALUE",
                    help="any other params.yaml key in the copy, e.g. -S data.train_size=300")
    ap.add_argument("--dry-run", action="store_true", help="print the config, stages and expected time; run nothing")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copy (its path is printed)")
    ap.add_argument("--verbose", action="store_true", help="print DVC's and the stages' whole output")
    a = ap.parse_args(argv)
    default = dict(load_params(REPO / "params.yaml"))
    try:
        p = quick_params(default, a.epochs, a.seeds, a.arms, a.set)
        validate_params(p, REPO)
    except (ValueError, ParamsError, KeyError) as e:
        sys.exit(f"quick: {e}")
    fresh_md = REPO / "benchmarks/fresh_repro.md"
    fresh = fresh_md.read_text() if fresh_md.exists() else ""
    train = p["recipes"][DATASET]["train"]
    speed = p["contrasts"].get("speed")
    m = re.search(r"\*\*([\d.]+) min\*\*", fresh)
    repro_time = f"{float(m[1]):.0f} minutes" if m else "about an hour and a half"
    banner = (f"QUICK LOOK, NOT THE RESULT: {len(p['grid']['seeds'])} seeds and {train['epochs']} of the recipe's "
              f"{default['recipes'][DATASET]['train']['epochs']} epochs, so the accuracies are not converged and "
              f"the intervals are wide. The result is the committed reports/main_table.md, or ./run.sh repro "
              f"({repro_time} on 2 CPU cores).")
    print(banner)
    print(f"\nThe real pipeline (dvc repro {' '.join(TARGETS)}) on {DATASET}, in a temporary copy: {train['epochs']} "
          f"epochs (warm-up {train['warmup_epochs']:g}), seeds {p['grid']['seeds']}, the test set every epoch, "
          f"arms {', '.join(map(init_label, cells.main_inits(p)))}, studies off"
          + (f"; the speed endpoint at {speed['fraction']:g} of the budget." if speed else "."))
    if (seconds := estimate_seconds(p, default, fresh)) is not None:
        print(f"Expected: about {math.ceil(seconds / 60)} minutes on the committed run's CPU (2 cores, bf16; "
              "benchmarks/fresh_repro.md's training rate); a CPU without native bf16 takes up to about 1.6x that.")
    print(f"\n{expectation(REPO / 'reports/curves.csv', default)}")
    if a.dry_run:
        print("\n--dry-run: the stages it would run, in a copy, with these params.yaml changes:")
        print("\n".join(f"  {s}" for s in stage_names(p)))
        changes = {"grid": p["grid"], "init": p["init"], "contrasts": {"speed": speed},
                   f"recipes.{DATASET}.train": {k: train[k] for k in ("epochs", "warmup_epochs", "eval_every")}}
        print(yaml.safe_dump(changes, sort_keys=False), end="")
        return 0
    with scratch.Scratch("quick", keep=a.keep) as s:
        repo = scratch.copy_working_tree(s.repo)          # as if nothing had run: no outputs
        (repo / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
        print(f"\nRunning in {repo} ...", flush=True)
        log = s.root / "dvc.log"
        code = run_pipeline(repo, a.verbose, log)
        if code:
            print(log.read_text()[-4000:], file=sys.stderr)
            print(f"quick: dvc repro failed in the copy (its whole log: {log}, kept)", file=sys.stderr)
            s.keep = True
            return code
        print(f"\n{learned(repo, p)}\n\n{banner}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
