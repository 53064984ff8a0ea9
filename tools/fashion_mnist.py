"""Fashion-MNIST on one GPU in one command: its main grid through DVC, then its epoch budget.

    python -m tools.fashion_mnist                     # on a GPU: both (the data in datasets/fashion_mnist/,
                                                      # or another route: docs/fashion-mnist.md)
    python -m tools.fashion_mnist --grid              # the grid's cells alone, committed beside digits
    python -m tools.fashion_mnist --grid --main-only --timeout 480   # its main cells alone, in a window
    python -m tools.fashion_mnist --budget            # the budget alone, at B and 2B
    python -m tools.fashion_mnist --tiny --out DIR    # the budget at toy sizes on the CPU: the suite's run

--grid lists fashion_mnist in params.yaml's GPU lists, unfreezes the GPU stages in dvc.yaml and runs `dvc repro` of each
train_gpu_* stage (one cell, its seeds stacked), of analyze_gpu (the attention analysis, run where the weights
are, into the compact results/analysis_gpu/fashion_mnist.pt) and, unless --main-only, of the data-size study. It
puts dvc.yaml back as it was, so a CPU's `dvc repro` reports the committed cells instead of training them, writes times,
accuracies and card to benchmarks/ and prints what to commit. --root: another checkout (the suite's tiny copy).

--budget trains every arm of the main grid at the recipe's budget B and at 2B, validated on 10,000 of the 60,000
training images (held out, stratified, seeded; the test set is never read). B is converged if doubling it moves no
arm's mean by over 1 point (structinit/reporting/budget.py); the command reports, the recipe's author decides. The
B run also prices the main grid on this card: the same stacked models on 50,000 images where the cells train on
60,000, so B's training seconds x 60/50, plus start-ups. After each arm and budget it writes epochs.csv (validation
accuracy per evaluated epoch, arm, budget and seed) and epochs.md (machine, times, verdict, the grid's price) in
--out (default results/evidence/fashion_mnist_budget); a re-run skips what is there. Without a GPU both stop at
once (the budget says how long the CPU would take), unless --tiny, or STRUCTINIT_ALLOW_CPU=1 for the grid.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import torch
from tabulate import tabulate

from structinit.data.specs import TRAIN_IMAGES
from tools.gpu_hours import card_slug

REPO = Path(__file__).resolve().parents[1]
DATASET = "fashion_mnist"
VALIDATION = 10_000
SPLIT_SEED = 0
TINY = dict(model=dict(patch_size=4, embed_dim=12, depth=1, num_heads=3), epochs=1, batch_size=16,
            train=96, validation=32, seeds=2)


def arms(params) -> list[str]:
    return [*params["grid"]["baselines"], *(f"impulse{k}" for k in params["grid"]["kernels"])]


def primary_first(params, inits: list[str] | None = None) -> list[str]:
    """`inits` (default: the budget's arms), the primary pair first, so a run cut short has what the paper's
    claim needs."""
    inits = arms(params) if inits is None else inits
    first = [i for i in (f"impulse{params['init']['kernel']}", "trunc_normal") if i in inits]
    return list(dict.fromkeys([*first, *inits]))


def machine(device: torch.device, root: Path = REPO) -> dict:
    from structinit.numerics import numerics_record

    card = torch.cuda.get_device_name(device) if device.type == "cuda" else numerics_record()["cpu"]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True,
                           text=True).stdout.strip()
    return {"card": card, "device": device.type, "torch": torch.__version__,
            "commit": (head.stdout.strip() or "unknown") + (" (uncommitted changes)" if dirty else "")}


# dvc.yaml's GPU stages are frozen by this line; DVC's freeze refuses matrix stages (and its unfreeze rewrites
# the whole file), so a GPU's run switches the lines off for itself and puts the file back after
GPU_FROZEN = "frozen: true         # GPU"


def unfrozen_gpu(text: str) -> str:
    """dvc.yaml's text with the GPU datasets' stages unfrozen."""
    if GPU_FROZEN not in text:
        raise ValueError(f"dvc.yaml has no `{GPU_FROZEN}` line: nothing to unfreeze")
    return text.replace(GPU_FROZEN, "frozen: false        # GPU: unfrozen for a GPU's run")


def tiny_data(spec, n_train: int, n_test: int):
    """Synthetic images of Fashion-MNIST's shape with labels a toy model can learn a little of."""
    from structinit.data.tensors import ImageData

    g = torch.Generator().manual_seed(0)
    labels = lambda n: torch.arange(n) % spec.num_classes                                   # noqa: E731
    images = lambda y: (y.view(-1, 1, 1, 1) * 25 + torch.randint(0, 30, (len(y), 1, 28, 28), generator=g)  # noqa: E731
                        ).to(torch.uint8)
    ytr, yte = labels(n_train), labels(n_test)
    return ImageData(spec, images(ytr), ytr, images(yte), yte)


def write_report(out: Path, curves: pd.DataFrame, seconds: dict, info: dict, rec, tiny: bool) -> str:
    from structinit.reporting.budget import TOLERANCE, budget_finals, converged_budget, doubling_moves, move_text
    from structinit.reporting.presentation import init_label

    finals = budget_finals(curves)
    means = finals.groupby(["init", "budget"]).test_acc.agg(["mean", "std"])
    budgets = sorted(int(b) for b in finals.budget.unique())
    rows = [[init_label(i), *(f"{means.loc[(i, b), 'mean']:.2f} ± {means.loc[(i, b), 'std']:.2f}"
                              if (i, b) in means.index else "-" for b in budgets)]
            for i in dict.fromkeys(finals.init)]
    moves = doubling_moves(finals)
    verdict = converged_budget(finals)
    B = rec.train["epochs"]
    if B in moves:
        worst = max(moves[B], key=lambda i: abs(moves[B][i]))
        said = (f"Doubling {B} epochs moves {init_label(worst)} most, {move_text(moves[B][worst])} points: "
                + (f"**{B} is converged** (within {TOLERANCE:g} point)." if abs(moves[B][worst]) <= TOLERANCE
                   else f"**{B} is NOT converged** (beyond {TOLERANCE:g} point)."))
    else:
        said = f"Not measured: the run at {2 * B} epochs did not finish."
    n_train = int(curves.attrs.get("train_images", 0))
    command = "python -m tools.fashion_mnist" + (" --tiny" if tiny else "")
    lines = [f"# Fashion-MNIST's epoch budget ({command})", ""]
    if tiny:
        lines += ["**tiny (CPU): not a measurement**: a toy model on synthetic images, to keep the command "
                  "runnable.", ""]
    lines += [f"Machine: {info['card']} ({info['device']}), torch {info['torch']}, commit {info['commit']}; "
              f"dtype {', '.join(sorted(curves.dtype.unique()))}.",
              f"Recipe: recipes.fashion_mnist of params.yaml ({rec.model}), each arm's {curves.seed.nunique()} seeds "
              f"stacked as a cell; trained on {n_train:,} images, evaluated on a validation split of "
              f"{int(curves.attrs.get('validation_images', 0)):,} held out of the training set (seed {SPLIT_SEED}); "
              "the test set is not read.", "",
              "Validation accuracy at the end of each budget, % (mean ± std over seeds):", "",
              tabulate(rows, headers=["arm", *(f"{b} epochs" for b in budgets)], tablefmt="github"), "",
              said + (f" The smallest converged budget measured: {verdict}." if verdict else ""), "",
              "Time per budget (every arm, one cell after another; each cell's build, Q/K solve, training "
              "and evaluation every tenth of the budget):", "",
              tabulate([[f"{b} epochs", f"{seconds[b]:.0f}"] for b in budgets if b in seconds],
                       headers=["budget", "wall s"], tablefmt="github"), ""]
    if B in seconds and n_train:
        images = TINY["train"] + TINY["validation"] if tiny else TRAIN_IMAGES[DATASET]    # what a cell trains on
        grid = seconds[B] * images / n_train
        lines += [f"The main grid's cells at {B} epochs on this {info['card']}: about **{grid / 60:.1f} min** "
                  f"(the {B}-epoch run's seconds x {images:,}/{n_train:,} training images; the "
                  "stages evaluate every epoch on the 10,000 test images, this run every tenth of the budget on "
                  "its validation split), plus the stages' start-ups (one per cell, and download, preoptimize, "
                  "the reports).", ""]
    text = "\n".join(lines)
    (out / "epochs.md").write_text(text)
    return text


# the two lists a GPU dataset joins: its main cells' and its data-size study's, each `[]` until then
GPU_LISTS = {"grid.gpu_datasets": re.compile(r"^(  gpu_datasets:) *\[\] *(#.*)?$", re.M),
             "studies.data_size.gpu.datasets": re.compile(r"^(      datasets:) *\[\] *(#.*)?$", re.M)}


def listed_in(params: dict, dotted: str) -> list:
    node = params
    for key in dotted.split("."):
        node = (node or {}).get(key)
    return list(node or [])


def list_as_gpu_dataset(params_path: Path, lists: tuple[str, ...] = tuple(GPU_LISTS)) -> bool:
    """Add fashion_mnist to `lists` in params.yaml, comments kept, each list found by its indentation
    (tests/test_fashion_mnist_budget.py); False if all list it already. The new text is checked before writing."""
    import tempfile

    from structinit.pipeline.load import load_params

    text = params_path.read_text()
    for dotted in lists:
        pattern = GPU_LISTS[dotted]
        if DATASET in listed_in(load_params(params_path), dotted):
            continue
        match = pattern.search(text)
        if match is None:
            raise SystemExit(f"error: {params_path}: {dotted} is neither [] nor lists {DATASET}: add it by hand")
        indent = " " * (len(match[1]) - len(match[1].lstrip()) + 2)
        pad = " " * (match.start(2) - match.end(1)) if match[2] else ""       # the comment keeps its column
        text = text[:match.start()] + f"{match[1]}{pad}{match[2] or ''}\n{indent}- {DATASET}" + text[match.end():]
    if text == params_path.read_text():
        return False
    with tempfile.TemporaryDirectory() as tmp:
        check = Path(tmp) / "params.yaml"
        check.write_text(text)
        wrong = [d for d in lists if DATASET not in listed_in(load_params(check), d)]
        if wrong:
            raise SystemExit(f"error: {params_path}: could not list {DATASET} in {wrong}: add it by hand")
    params_path.write_text(text)
    return True


def final_accuracy(metrics: Path) -> float | None:
    """A finished seed's final test accuracy, %; None before (dvclive's running metrics.json lacks it)."""
    if not metrics.exists():
        return None
    acc = json.loads(metrics.read_text()).get("final_test_acc")
    return None if acc is None else acc * 100


def stage_logs(timings: Path, since: float) -> dict | None:
    """What a stage run by this command logged (stages/train.py): phase marks and its first seed's epoch seconds
    (a stack's seeds share one clock). None if no phases.json is newer than `since` (DVC skipped it, or it was cut
    before saving)."""
    path = timings / "phases.json"
    # mtimes come from a coarse clock that lags time.time() by up to a tick; an older run's log is seconds older
    if not path.exists() or path.stat().st_mtime < since - 1.0:
        return None
    marks = {k: v for k, v in json.loads(path.read_text())["seconds_since_start"].items() if v is not None}
    records = sorted(timings.glob("seed*.json"))
    epochs = sum(e["seconds"] for e in json.loads(records[0].read_text())["epochs"]) if records else None
    return {**marks, "epochs": epochs}


def stage_table(stage_seconds: dict, started: dict, cells: dict, code: int, root: Path) -> tuple[list, dict]:
    """Each stage's row of seconds, and the stages this command trained to the end ({target: wall s}, for the
    price). A last stage that stopped reads as cut short or failed, by dvc's status."""
    from structinit.pipeline.scratch import TIMED_OUT

    rows, fresh = [], {}
    last = list(stage_seconds)[-1] if stage_seconds else None
    for target, wall in stage_seconds.items():
        if target == last and code:
            rows.append([target + (" (cut short)" if code == TIMED_OUT else " (failed)"), f"{wall:.1f}",
                         *["-"] * 5])
            continue
        logs = stage_logs(root / "logs/timings" / cells[target], started[target]) if target in cells else None
        if logs is None or "saved" not in logs:
            rows.append([target + " (up to date: not run)" if target in cells else target, f"{wall:.1f}",
                         *["-"] * 5])
            continue
        fresh[target] = wall
        parts = (logs.get("training"), logs["trained"] - logs["training"] if "training" in logs else None,
                 logs["epochs"], logs["saved"] - logs["trained"], wall - logs["saved"])
        rows.append([target, f"{wall:.1f}", *("-" if x is None else f"{x:.1f}" for x in parts)])
    return rows, fresh


def forced(root: Path, target: str, cells_of: dict, params: dict) -> tuple[str, ...]:
    """`dvc repro` flags for a grid stage: -f -s for the (cheap) analysis, which DVC would skip after a retrain as
    its deps are its code; -f for an up-to-date main cell whose weights are not here (never committed), so the
    analysis has them."""
    if target.startswith("analyze_gpu@"):
        return ("-f", "-s")
    if target in cells_of:
        weights = root / "models/gpu" / Path(cells_of[target]).name
        if not all((weights / f"seed{s}.pt").is_file() for s in params["grid"]["seeds"]):
            return ("-f",)
    return ()


def run_grid(root: Path, timeout: float | None = None, main_only: bool = False) -> int:
    """--grid in `root`, a timed stage at a time; `timeout` bounds the whole (finished stages stay); returns dvc's
    status. If it does not finish, params.yaml is restored: a frozen stage without outputs stops every `dvc repro`."""
    from structinit.pipeline.cells import main_cell, main_inits, main_stage, study_cell
    from structinit.pipeline.load import load_params
    from structinit.pipeline.scratch import TIMED_OUT, pipeline_env, run_dvc

    if not torch.cuda.is_available() and os.environ.get("STRUCTINIT_ALLOW_CPU") != "1":
        raise SystemExit("error: no GPU: the grid's stages train on a GPU (on this CPU each cell would take "
                         "days: the training stage says how long); STRUCTINIT_ALLOW_CPU=1 runs them anyway")
    info = machine(torch.device("cuda" if torch.cuda.is_available() else "cpu"), root)   # before any edit
    env = pipeline_env(root)
    original, frozen_yaml = (root / "params.yaml").read_text(), (root / "dvc.yaml").read_text()
    code, seconds, stage_seconds, started, cells_of, finished = 1, {}, {}, {}, {}, False
    ends = None if timeout is None else time.monotonic() + timeout
    try:
        listed = list_as_gpu_dataset(root / "params.yaml", ("grid.gpu_datasets",) if main_only else tuple(GPU_LISTS))
        params = load_params(root / "params.yaml")
        size = params["studies"]["data_size"]
        order = primary_first(params, main_inits(params))
        groups = {"main grid": [main_stage("train", DATASET, init, params) for init in order],
                  "attention analysis": [f"analyze_gpu@{DATASET}"]}
        cells_of = {main_stage("train", DATASET, init, params): f"results/train/{main_cell(DATASET, init)}"
                    for init in order}
        if not main_only:
            groups["data-size study"] = [f"study_data_size_gpu@{DATASET}-{f}-{init}"
                                         for f in size["gpu"]["fractions"] for init in size["inits"]]
        (root / "dvc.yaml").write_text(unfrozen_gpu(frozen_yaml))
        for group, targets in groups.items():
            t = time.perf_counter()
            for target in targets:
                left = None if ends is None else ends - time.monotonic()
                if left is not None and left <= 0:                  # the window is spent: launch nothing
                    code = TIMED_OUT
                    break
                s, started[target] = time.perf_counter(), time.time()
                code = run_dvc(root, "repro", *forced(root, target, cells_of, params), target, env=env,
                               timeout=left, on_line=lambda line: print(line, end="", flush=True))
                stage_seconds[target] = time.perf_counter() - s
                if code:
                    break
            seconds[group] = time.perf_counter() - t
            if code:
                break
        finished = code == 0
    finally:
        (root / "dvc.yaml").write_text(frozen_yaml)                      # frozen again, whatever happened
        if not finished:
            (root / "params.yaml").write_text(original)
            print("\nthe grid did not finish: params.yaml is as it was. A stage that ran and failed had its "
                  "outputs removed by DVC: `git checkout -- results/` brings committed ones back. dvc.lock keeps "
                  "the finished cells' entries, so a re-run skips them (`git checkout -- dvc.lock` drops them) "
                  "and resumes a cut cell from its checkpoint", flush=True)
    rows = []
    for init in main_inits(params):
        for seed in params["grid"]["seeds"]:
            acc = final_accuracy(root / "results/train" / main_cell(DATASET, init) / f"seed{seed}" / "metrics.json")
            rows.append([init, seed, "-" if acc is None else f"{acc:.2f}"])
    cells = list(cells_of.values()) + [f"results/analysis_gpu/{DATASET}.pt"] + ([] if main_only else [
        f"results/studies/data_size/{study_cell(DATASET, f, i)}"
        for f in size["gpu"]["fractions"] for i in size["inits"]])
    name = f"fashion_mnist_grid-{card_slug(info['card'])}-{info['commit'].split()[0]}.md"
    per_stage, fresh = stage_table(stage_seconds, started, cells_of, code, root)
    main_targets = groups["main grid"]
    done_main = [t for t in main_targets if t in fresh]
    priced = ""
    if done_main and len(done_main) < len(main_targets):
        later = [fresh[t] for t in done_main[1:]] or [fresh[done_main[0]]]
        whole = sum(fresh[t] for t in done_main) + (len(main_targets) - len(done_main)) * sum(later) / len(later)
        priced = (f"\n\n{len(done_main)} of the main grid's {len(main_targets)} cells trained to the end in this "
                  f"run. With each other cell priced at the mean of those after the first (whose epoch 1 compiled "
                  f"cold), the whole main grid would take about **{whole / 60:.1f} min** on this card "
                  "(an extrapolation, not a measurement of the whole grid).")
    text = (f"# Fashion-MNIST on one {info['card']} (python -m tools.fashion_mnist --grid)\n\n"
            f"Machine: {info['card']} ({info['device']}), torch {info['torch']}, commit {info['commit']}"
            f"{'; this run listed it in params.yaml' if listed and finished else ''}. `dvc repro` exit {code}.\n\n"
            + tabulate([[g, len(groups[g]), f"{seconds[g] / 60:.1f}"] for g in seconds],
                       headers=["what", "stages", "min (dvc repro, stage start-ups included)"], tablefmt="github")
            + "\n\nEach stage in the order run: its wall seconds (`dvc repro <stage>`); in its process, the "
              "seconds before training (the interpreter, imports, data, models, Q/K solve), training (the "
              "stacking plan and memory estimate, the data to the device, the epochs, checkpoints), of which "
              "the epochs (training and the test set every epoch, the compile in epoch 1; its first seed's "
              "record), and after training (saving); outside its process, DVC's. From logs/timings/<cell>/ "
              "(phases.json, seed<s>.json):\n\n"
            + tabulate(per_stage, headers=["stage", "wall s", "before training s", "training s", "of which epochs s",
                                           "after training s", "DVC s"], tablefmt="github", disable_numparse=True)
            + priced
            + "\n\nThe main grid's final test accuracy per seed, % (- : not finished):\n\n"
            + tabulate(rows, headers=["init", "seed", "final test acc %"], tablefmt="github") + "\n")
    (root / "benchmarks" / name).write_text(text)
    print(text)
    if finished:
        print("commit: params.yaml dvc.lock " + " ".join(cells) + f" benchmarks/{name}")
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", action="store_true", help="the main grid's cells through DVC alone (docstring)")
    ap.add_argument("--budget", action="store_true", help="the budget at B and 2B alone")
    ap.add_argument("--main-only", action="store_true", help="with --grid: the main grid's cells alone (lists "
                                                             "the dataset in grid.gpu_datasets only)")
    ap.add_argument("--timeout", type=float, help="with --grid: seconds for all of its stages; the cells "
                                                  "finished by then stay")
    ap.add_argument("--root", type=Path, default=REPO, help="with --grid: the checkout to run it in (the budget "
                                                            "reads this checkout's params.yaml)")
    ap.add_argument("--arms", nargs="+", metavar="ARM", help="with --budget: these arms, in this order (default: "
                                                                 "every arm, the primary pair first)")
    ap.add_argument("--deadline", type=float, metavar="S", help="with --budget: seconds it may take; a run that "
                                                                "would end after it is not started")
    ap.add_argument("--out", type=Path, default=REPO / "results/evidence/fashion_mnist_budget")
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU: not a measurement")
    ap.add_argument("--local", type=Path, default=REPO / "datasets/fashion_mnist",
                    help="the folder the four files may be in (the other routes: docs/fashion-mnist.md)")
    a = ap.parse_args(argv)
    if a.tiny and a.grid:
        ap.error("--tiny runs the budget at toy sizes; the grid's tiny run is a test "
                 "(tests/test_fashion_mnist_grid.py)")
    if a.tiny and a.out == ap.get_default("out"):
        ap.error("--tiny writes a toy run: give it its own --out (not the real budget's folder)")
    if a.grid or not (a.budget or a.tiny):            # neither flag (or both): the grid, then the budget
        code = run_grid(a.root.resolve(), a.timeout, a.main_only)
        if code or (a.grid and not a.budget):
            return code

    from structinit.data.specs import get_spec
    from structinit.data.tensors import prepare_dataset, validation_split
    from structinit.evidence.epoch_budget import run_budget
    from structinit.pipeline.load import load_params
    from structinit.training.trainer import default_device

    params = load_params(REPO / "params.yaml")
    rec = params.recipe(DATASET)
    spec = get_spec(DATASET)
    device = torch.device("cpu") if a.tiny else default_device()
    if device.type != "cuda" and not a.tiny:
        from structinit.pipeline.estimate import training_time_line
        raise SystemExit("error: no GPU: this is a GPU measurement. "
                         + training_time_line(DATASET, rec.model, spec, rec.train, 50_000, len(arms(params)) * 5 * 3,
                                              device="cpu")
                         + " (every arm's 5 seeds at B and 2B, as 3 B-runs). Use --tiny to run it at toy sizes.")
    seeds = params["grid"]["seeds"][:TINY["seeds"]] if a.tiny else params["grid"]["seeds"]
    if a.tiny:
        rec = type(rec)(rec.dataset, dict(rec.model, **TINY["model"]),
                        dict(rec.train, epochs=TINY["epochs"], batch_size=TINY["batch_size"], randaugment=None))
        data = tiny_data(spec, TINY["train"] + TINY["validation"], 8)
        split = validation_split(data, TINY["validation"], SPLIT_SEED)
    else:
        data = prepare_dataset(DATASET, root=REPO / "data/raw", local=a.local)
        split = validation_split(data, VALIDATION, SPLIT_SEED)
    info = machine(device)
    a.out.mkdir(parents=True, exist_ok=True)
    csv = a.out / "epochs.csv"
    curves = pd.read_csv(csv) if csv.exists() else pd.DataFrame()
    # what a row was trained with: a re-run resumes only the same recipe, seeds and split
    recipe = hashlib.sha256(json.dumps([rec.model, rec.train, seeds, len(split.test_labels), SPLIT_SEED],
                                       sort_keys=True).encode()).hexdigest()[:12]
    if len(curves) and set(curves.get("recipe", pd.Series(["unrecorded"])).astype(str)) != {recipe}:
        raise SystemExit(f"error: {csv} holds runs of another recipe, seeds or split than this one ({recipe}): "
                         "give another --out, or delete it to start over")
    B = rec.train["epochs"]
    order = list(dict.fromkeys(a.arms or primary_first(params)))
    unknown = sorted(set(order) - set(arms(params)))
    if unknown:
        ap.error(f"--arms {' '.join(unknown)}: not an arm of the main grid; choose from {' '.join(arms(params))}")
    ends = None if a.deadline is None else time.monotonic() + a.deadline
    for arm, budget in [(arm, budget) for arm in order for budget in (B, 2 * B)]:   # each arm's pair together
        if len(curves) and ((curves.init == arm) & (curves.budget == budget)).any():
            print(f"{arm} at {budget} epochs: in {csv} already")
            continue
        if ends is not None and len(curves):     # a run it cannot finish is not started (a cut one is lost)
            need = 1.1 * budget * (curves.cell_seconds / curves.budget).max()      # the slowest epoch rate yet
            if need > ends - time.monotonic():
                print(f"{arm} at {budget} epochs: needs ~{need:.0f} s, {ends - time.monotonic():.0f} s left: "
                      "not started", flush=True)
                break
        t = time.perf_counter()
        rows = run_budget(split, {"model": rec.model, "train": rec.train}, [arm], seeds, budget,
                          warmup_prefix=rec.train.get("warmup_prefix", False), cpu=info["card"],
                          dataset=DATASET, eval_every=max(1, budget // 10), device=device)
        wall = time.perf_counter() - t
        curves = pd.concat([curves, rows.assign(cell_seconds=round(wall, 1), recipe=recipe)], ignore_index=True)
        curves.to_csv(csv, index=False)
        print(f"{arm} at {budget} epochs: {wall:.0f} s, validation acc "
              f"{rows.groupby('seed').test_acc.last().mean():.2f} %", flush=True)
    seconds = {int(b): g.groupby("init").cell_seconds.first().sum() for b, g in curves.groupby("budget")}
    curves.attrs.update(train_images=len(split.train_labels), validation_images=len(split.test_labels))
    if len(curves):
        print(write_report(a.out, curves, seconds, info, rec, a.tiny))
    done = set(zip(curves.init, curves.budget)) if len(curves) else set()
    missing = [(arm, b) for arm in arms(params) for b in (B, 2 * B) if (arm, b) not in done]
    print("budget: measured" if not missing else f"budget: {len(missing)} of {2 * len(arms(params))} runs to go",
          flush=True)          # the last line, read by benchmarks/gpu_session.py
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
