"""Did a re-run reproduce the committed results? `./run.sh verify` after `./run.sh repro`.

    python -m structinit.pipeline.verify [--against HEAD] [--tolerance-images N]

It judges the workspace, not the text of two dvc.lock files, in this order:

1. The workspace is a finished run: every output its dvc.lock records exists, and `dvc
   status` says every stage is up to date (the outputs are those dvc.lock's hashes name).
   Otherwise it stops there, exit 1: nothing it would compare is a run's output.
2. params.yaml against the compared commit's: each differing key is named (an experiment
   such as `-S init.kernel=5` is then another configuration, not a re-run of the commit's).
3. Bytes are the same only on the CPU that made them (docs/reproducibility.md): every
   output with the same hash as the commit's dvc.lock records -> "identical bytes", exit 0.
4. Otherwise, per trained cell both runs have (results/**/seed<s>/metrics.json): each seed's
   final test accuracy against the committed one, counted in test images (difference x the
   dataset's test images), and the cell's mean over seeds. Cells only the workspace has (a
   GPU run's CIFAR cells, a new initializer) are listed as new, not failed.
5. Every report's conclusions (reports/conclusions/<report>.json): each tested statement's
   verdict against the committed one; statements only the workspace has are listed as new.

Exit 1 when a cell's mean accuracy moved by more than its kind's tolerance (in test images,
from the committed seeds' spread: TOLERANCE_SDS), a conclusion changed, or something the
commit has is missing from the workspace, unless that conclusion is fragile (its corrected p
within a factor of 2 of alpha, here or in the committed run: float noise may flip it).
Fragile changes are listed, never failed. A pair a report only describes (every pair of a study
with fewer seeds than a verdict needs) is no conclusion: it is in its record's "described", never
compared. The last line says why it fails, in one line, naming differing params there too. With
nothing to compare with (no committed dvc.lock), verify() raises MissingFileError and the command
exits 1 with its message.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from structinit.data.specs import TEST_IMAGES
from structinit.errors import StructinitError
from structinit.io import MissingFileError

# How far a cell's mean over its n seeds may move, in test images: TOLERANCE_SDS x sd x sqrt(2 / n),
# sd the across-seed SD of its kind in the committed run (<kind>/seed*/metrics.json: pooled over the
# commit's cells of that kind, each cell's own mean removed; cell_kind). Why: another CPU moves a run
# about as much as another seed does (benchmarks/cpu_variation.md), so a mean's move is the difference
# of two n-seed means, SD sd sqrt(2 / n); 3 of those let noise pass (a normal move beyond them: 1 in
# 370) and fail a real shift. One bound for every cell does not fit: a data-size cell's seeds (144
# training images) spread far wider than a main-grid cell's. Never below one image.
TOLERANCE_SDS = 3
CONCLUSIONS_DIR = "reports/conclusions"


@dataclass
class CellChange:
    cell: str
    dataset: str
    test_images: int
    seeds: dict[int, tuple[float, float]]          # seed -> (committed acc, workspace acc), fractions
    seed_sd: float = math.nan                      # its kind's across-seed SD in the commit, test images
    tolerance: float = math.nan                    # test images (tolerance_images)

    @property
    def kind(self) -> str:
        return cell_kind(self.cell)

    @property
    def beyond_tolerance(self) -> bool:
        return abs(self.mean_images_moved) > self.tolerance

    def images_moved(self, seed: int) -> float:
        before, after = self.seeds[seed]
        return (after - before) * self.test_images

    @property
    def mean_images_moved(self) -> float:
        return sum(self.images_moved(s) for s in self.seeds) / len(self.seeds)


@dataclass
class Verification:
    identical: bool
    outputs_missing: list[str] = field(default_factory=list)      # dvc.lock's outputs not in the workspace
    stages_stale: list[str] = field(default_factory=list)         # `dvc status`: not up to date
    params_changed: list[str] = field(default_factory=list)       # "key: committed -> workspace"
    outputs_changed: list[str] = field(default_factory=list)
    cells: list[CellChange] = field(default_factory=list)
    cells_new: list[str] = field(default_factory=list)            # only in the workspace: listed
    cells_missing: list[str] = field(default_factory=list)        # only in the commit: not comparable
    conclusions_changed: list[dict] = field(default_factory=list)   # {report, id, before, after, fragile}
    conclusions_new: list[str] = field(default_factory=list)
    conclusions_unmatched: list[str] = field(default_factory=list)
    tolerance: float | None = None              # asked for (--tolerance-images); None: each kind's own

    @property
    def cells_beyond_tolerance(self) -> list[CellChange]:
        return [c for c in self.cells if c.beyond_tolerance]

    @property
    def failing_conclusions(self) -> list[dict]:
        return [c for c in self.conclusions_changed if not c["fragile"]]

    @property
    def params_changed_keys(self) -> str:
        """The differing params.yaml keys, comma-separated."""
        return ", ".join(c.split(":")[0] for c in self.params_changed)

    @property
    def workspace_finished(self) -> bool:
        return not (self.outputs_missing or self.stages_stale)

    def why_not(self) -> str | None:
        """One line: why the workspace does not reproduce the commit (None: it does)."""
        if self.outputs_missing:
            return (f"{len(self.outputs_missing)} output(s) dvc.lock records are not in the workspace "
                    f"(first: {self.outputs_missing[0]}): run ./run.sh repro first")
        if self.stages_stale:
            return (f"dvc status: {len(self.stages_stale)} stage(s) not up to date (first: {self.stages_stale[0]}): "
                    "the workspace is not one run's output; finish ./run.sh repro, then verify")
        if self.identical:
            return None
        reasons = list(filter(None, [
            f"{len(self.cells_beyond_tolerance)} cell(s) beyond tolerance" if self.cells_beyond_tolerance else "",
            f"{len(self.failing_conclusions)} conclusion(s) changed" if self.failing_conclusions else "",
            f"{len(self.cells_missing) + len(self.conclusions_unmatched)} output(s) of the commit with no "
            "counterpart in the workspace" if self.cells_missing or self.conclusions_unmatched else ""]))
        if not reasons:
            return None
        if self.params_changed:
            reasons.append(f"params.yaml differs from the commit in {self.params_changed_keys}: another "
                           "configuration, not a re-run")
        return "; ".join(reasons)

    @property
    def ok(self) -> bool:
        return self.why_not() is None


def dvc_status(repo: Path) -> list[str]:
    """The stages `dvc status` reports as changed in `repo` (empty: every stage up to date)."""
    r = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=repo,
                       capture_output=True, text=True)
    text = r.stdout.strip()
    try:
        changed = json.loads(text) if text else {}
    except json.JSONDecodeError:
        changed = None
    if r.returncode not in (0, 1) or not isinstance(changed, dict):
        said = (r.stderr or r.stdout).strip().splitlines()
        raise StructinitError(f"`dvc status` failed in {repo}: {said[-1] if said else f'exit {r.returncode}'}")
    return sorted(changed)


def _flat(d, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists stay whole."""
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) and v else {key: v})
    return out


def params_changes(committed_text: str | None, workspace_text: str | None) -> list[str]:
    """Every params.yaml key whose value differs: "key: committed -> workspace"."""
    before = _flat(yaml.safe_load(committed_text or "") or {})
    after = _flat(yaml.safe_load(workspace_text or "") or {})
    missing = "(absent)"
    return [f"{k}: {before.get(k, missing)} -> {after.get(k, missing)}"
            for k in sorted(before.keys() | after.keys()) if before.get(k, missing) != after.get(k, missing)]


def _git_show(repo: Path, rev: str, path: str) -> str | None:
    r = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=repo, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _git_files(repo: Path, rev: str, under: str) -> list[str]:
    r = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev, "--", under], cwd=repo,
                       capture_output=True, text=True, check=True)
    return r.stdout.split()


def output_hashes(lock_text: str) -> dict[str, str]:
    """path -> hash of every stage output in a dvc.lock (folders: their .dir hash)."""
    lock = yaml.safe_load(lock_text) or {}
    out = {}
    for stage in (lock.get("stages") or {}).values():
        for o in stage.get("outs") or []:
            # DVC 3: `hash` names the algorithm ("md5"), whose key holds the value
            out[o["path"]] = o.get(o.get("hash") or "md5") or o.get("md5") or ""
    return out


def test_image_count(repo: Path, dataset: str) -> int:
    """How many test images a dataset's accuracies count: the built-ins' are known (specs.py);
    your own dataset's is read from its prepared file, which the run that is judged made."""
    if dataset in TEST_IMAGES:
        return TEST_IMAGES[dataset]
    from structinit.io import load_checked        # torch: only for your own datasets

    path = repo / "data/prepared" / f"{dataset}.pt"
    try:
        return len(load_checked(path, f"a prepared dataset (dvc repro download@{dataset})")["test_labels"])
    except MissingFileError:
        raise StructinitError(f"{path} is missing: verify counts {dataset}'s accuracy changes in its test images, "
                          f"which that file holds (./run.sh dvc repro download@{dataset})") from None


def cell_kind(cell: str) -> str:
    """results/studies/data_size/digits-0.1-impulse3 -> results/studies/data_size/digits-0.1-*:
    the cells that differ only in their arm (the last part of the name) train alike."""
    folder, _, name = cell.rpartition("/")
    return f"{folder}/{name.rsplit('-', 1)[0]}-*"


def seed_sd(cells: list[list[float]]) -> float:
    """The across-seed SD pooled over cells, each cell's own mean removed; nan if no cell has 2 seeds."""
    df = sum(len(a) - 1 for a in cells)
    return math.sqrt(sum((x - sum(a) / len(a)) ** 2 for a in cells for x in a) / df) if df else math.nan


def tolerance_images(sd: float, n: int) -> float:
    """How far the mean over n seeds may move (TOLERANCE_SDS); one image where no spread is known."""
    return 1.0 if math.isnan(sd) else max(1.0, TOLERANCE_SDS * sd * math.sqrt(2 / n))


def _accuracies(read, files: list[str]) -> dict[tuple[str, int], tuple[str, float]]:
    """(cell folder, seed) -> (dataset, final test accuracy) for every metrics.json of a run."""
    out = {}
    for f in files:
        p = Path(f)
        if p.name != "metrics.json" or not p.parent.name.startswith("seed"):
            continue
        text = read(f)
        if text is None:
            continue
        cell = p.parent.parent.as_posix()
        out[cell, int(p.parent.name[4:])] = (p.parent.parent.name.split("-")[0],
                                              json.loads(text)["final_test_acc"])
    return out


def verify(repo: str | Path = ".", against: str = "HEAD", tolerance: float | None = None,
           status=None) -> Verification:
    """Judge the workspace of `repo` against commit `against` (module docstring). tolerance: one
    for every cell, in test images (None: each kind's own). status(repo) -> stale stage names:
    `dvc status` (dvc_status) unless given."""
    repo = Path(repo)
    committed_lock = _git_show(repo, against, "dvc.lock")
    if committed_lock is None:
        raise MissingFileError(f"{against} has no dvc.lock: nothing committed to compare with")
    lock_path = repo / "dvc.lock"
    workspace_lock = lock_path.read_text() if lock_path.exists() else ""
    before, after = output_hashes(committed_lock), output_hashes(workspace_lock)

    # 1. a finished run: its outputs there, every stage up to date
    missing = sorted(p for p in after if not (repo / p).exists())
    if not workspace_lock:
        missing = ["dvc.lock"]
    v = Verification(identical=False, outputs_missing=missing, tolerance=tolerance)
    if missing:
        return v
    v.stages_stale = (status or dvc_status)(repo)
    if v.stages_stale:
        return v

    # 2. the configuration; 3. bytes
    params = repo / "params.yaml"
    v.params_changed = params_changes(_git_show(repo, against, "params.yaml"),
                                      params.read_text() if params.exists() else None)
    v.outputs_changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    v.identical = not v.outputs_changed
    if v.identical:
        return v

    # 4. the cells both runs have
    committed_results = _git_files(repo, against, "results")
    workspace_results = [p.relative_to(repo).as_posix() for p in (repo / "results").rglob("metrics.json")]
    acc_before = _accuracies(lambda f: _git_show(repo, against, f), committed_results)
    acc_after = _accuracies(lambda f: (repo / f).read_text() if (repo / f).exists() else None, workspace_results)
    by_cell: dict[str, CellChange] = {}
    cells_before = {cell for cell, _ in acc_before}
    for key in sorted(acc_before.keys() | acc_after.keys()):
        cell, seed = key
        if key not in acc_before:
            what = "a new cell" if cell not in cells_before else "a new seed"
            v.cells_new.append(f"{cell} seed {seed}: {what}, only in the workspace")
            continue
        if key not in acc_after:
            v.cells_missing.append(f"{cell} seed {seed}: only in the commit")
            continue
        dataset, b = acc_before[key]
        if cell not in by_cell:
            by_cell[cell] = CellChange(cell, dataset, test_image_count(repo, dataset), {})
        change = by_cell[cell]
        change.seeds[seed] = (b, acc_after[key][1])
    v.cells = list(by_cell.values())
    committed: dict[str, dict[str, list[float]]] = {}        # kind -> cell -> its seeds' accuracies
    for (cell, _), (_, acc) in acc_before.items():
        committed.setdefault(cell_kind(cell), {}).setdefault(cell, []).append(acc)
    for c in v.cells:
        c.seed_sd = seed_sd([[a * c.test_images for a in accs] for accs in committed[c.kind].values()])
        c.tolerance = tolerance_images(c.seed_sd, len(c.seeds)) if tolerance is None else tolerance

    # 5. the conclusions both runs have
    for name in sorted({Path(f).name for f in _git_files(repo, against, CONCLUSIONS_DIR)}
                       | {p.name for p in (repo / CONCLUSIONS_DIR).glob("*.json")}):
        old_text = _git_show(repo, against, f"{CONCLUSIONS_DIR}/{name}")
        new_path = repo / CONCLUSIONS_DIR / name
        if old_text is None:
            v.conclusions_new.append(f"{name}: only in the workspace")
            continue
        if not new_path.exists():
            v.conclusions_unmatched.append(f"{name}: only in the commit")
            continue
        old = {c["id"]: c for c in json.loads(old_text)["conclusions"]}
        new = {c["id"]: c for c in json.loads(new_path.read_text())["conclusions"]}
        for cid in sorted(old.keys() | new.keys()):
            if cid not in old:
                v.conclusions_new.append(f"{name}: {cid}: only in the workspace")
            elif cid not in new:
                v.conclusions_unmatched.append(f"{name}: {cid}: only in the commit")
            elif old[cid]["verdict"] != new[cid]["verdict"]:
                v.conclusions_changed.append({
                    "report": name, "id": cid, "before": old[cid]["verdict"], "after": new[cid]["verdict"],
                    "p_label": _p_label(new[cid]), "p_before": _adjusted_p(old[cid]), "p_after": _adjusted_p(new[cid]),
                    "fragile": bool(old[cid].get("fragile") or new[cid].get("fragile"))})
    return v


def _p_label(conclusion: dict) -> str:
    """What the compared p is: the primary is tested alone (its p), a secondary contrast
    within Holm's family (its Holm-adjusted p)."""
    return {"primary": "p", "secondary": "Holm p"}.get(conclusion.get("role"), "adjusted p")


def _adjusted_p(conclusion: dict) -> float:
    """The p a conclusion's verdict rests on (`p_adjusted`; `p_holm` in records written before
    the paired statistics)."""
    return conclusion.get("p_adjusted", conclusion.get("p_holm"))


def _p(x) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def render(v: Verification, against: str) -> str:
    verdict = v.why_not()
    if not v.workspace_finished:
        items = v.outputs_missing or v.stages_stale
        head = "missing from the workspace" if v.outputs_missing else "not up to date (dvc status)"
        return "\n".join([f"{len(items)} {head}:", *[f"  {i}" for i in items[:10]],
                          *([f"  ... and {len(items) - 10} more"] if len(items) > 10 else []),
                          "", f"verdict: NOT verified: {verdict}"])
    lines = []
    if v.params_changed:
        lines += [f"params.yaml differs from {against} (the comparison covers what both runs have):",
                  *[f"  {c}" for c in v.params_changed], ""]
    if v.identical:
        return "\n".join(lines + [f"identical bytes: every output in dvc.lock has the hash {against} committed, "
                                  "and the workspace is up to date with it"])
    lines += [f"{len(v.outputs_changed)} output(s) differ in bytes from {against} (expected on another CPU: "
              "docs/reproducibility.md); comparing what they conclude.", "",
              f"Accuracy per cell, in test images (workspace - {against}); tolerance: "
              + (f"a cell's mean over seeds within ±{v.tolerance:g} images (asked for):" if v.tolerance is not None else
                 f"a cell's mean over its n seeds within {TOLERANCE_SDS} x sd x sqrt(2 / n) images, sd the across-seed "
                 f"SD of its kind in {against}'s results (<kind>/seed*/metrics.json; docs/reproducibility.md):")]
    for kind in dict.fromkeys(c.kind for c in v.cells):
        cells = [c for c in v.cells if c.kind == kind]
        lines.append(f"  {kind}: seed SD {cells[0].seed_sd:.2f} images")
        for c in cells:
            seeds = " ".join(f"s{s}:{c.images_moved(s):+.0f}" for s in sorted(c.seeds))
            lines.append(f"    {c.cell}: mean {c.mean_images_moved:+.1f} of {c.test_images} ({seeds}), tolerance "
                         f"±{c.tolerance:.1f}" + ("  <-- beyond tolerance" if c.beyond_tolerance else ""))
    lines += [f"  {m}  <-- not comparable" for m in v.cells_missing]
    lines += [f"  {m}  (new: listed, not compared)" for m in v.cells_new]
    lines += ["", "Conclusions (reports/conclusions/*.json):"]
    if not v.conclusions_changed and not v.conclusions_unmatched:
        lines.append("  every conclusion both runs have is the same")
    for c in v.conclusions_changed:
        tag = "fragile, not failed" if c["fragile"] else "CHANGED"
        lines.append(f"  {c['report']}: {c['id']}: {c['before']} -> {c['after']} "
                     f"({c['p_label']} {_p(c['p_before'])} -> {_p(c['p_after'])}) [{tag}]")
    lines += [f"  {m}  <-- not comparable" for m in v.conclusions_unmatched]
    lines += [f"  {m}  (new: listed, not compared)" for m in v.conclusions_new]
    also = (f" (params.yaml differs from {against} in {v.params_changed_keys})"
            if v.params_changed and verdict is None else "")
    lines += ["", "verdict: " + ("reproduced: the same conclusions, accuracies within tolerance" + also
                                 if verdict is None else f"NOT reproduced: {verdict}")]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="HEAD", help="the commit whose outputs to compare with (default HEAD)")
    ap.add_argument("--tolerance-images", type=float,
                    help="largest change of any cell's mean accuracy, in test images (default: each kind's own, "
                         "from the committed seeds' spread)")
    a = ap.parse_args(argv)
    try:
        v = verify(".", a.against, a.tolerance_images)
    except StructinitError as e:       # nothing to compare with: the message says why, no traceback
        sys.exit(f"error: {e}")
    print(render(v, a.against))
    return 0 if v.ok else 1


if __name__ == "__main__":
    sys.exit(main())
