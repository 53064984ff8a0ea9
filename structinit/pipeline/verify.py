"""Did a re-run reproduce the committed results? `./run.sh verify` after `./run.sh repro`.

    python -m structinit.pipeline.verify [--against HEAD] [--tolerance-images N]

Bytes are the same only on the CPU that made them (docs/reproducibility.md), so this
answers the question a reader has on another machine, in three steps:

1. Every output dvc.lock records (models, results, reports, figures) has the same hash in the
   workspace as in the committed dvc.lock -> "identical bytes", exit 0.
2. Otherwise, per trained cell (results/**/seed<s>/metrics.json): each seed's final test
   accuracy against the committed one, counted in test images (difference x the dataset's
   test images), and the cell's mean over seeds.
3. Every report's conclusions (reports/conclusions/<report>.json): each tested statement's
   verdict against the committed one.

Exit 1 when a cell's mean accuracy moved by more than the tolerance (in test images; the
README states it and the measurement it comes from) or a conclusion changed, unless that
conclusion is fragile (its corrected p within a factor of 2 of alpha, here or in the
committed run: float noise may flip it). Fragile changes are listed, never failed. With nothing
to compare with (no committed dvc.lock), verify() raises MissingFileError and the command
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

# A cell's mean accuracy over seeds may move this many test images (docs/reproducibility.md):
# settings that should not matter moved a digits cell's mean by at most 2.3
# images (the committed default in fp32 under the old AVX2 pin vs bf16 on the CPU's own
# kernels, same machine, 36 cells) and at 80 epochs by at most 0.7 (benchmarks/amp_agreement.py);
# about 2.5x the larger, so that noise passes and a real shift (a seed of 5 leaving its plateau,
# ~60 images of mean) does not.
TOLERANCE_TEST_IMAGES = 6
CONCLUSIONS_DIR = "reports/conclusions"


@dataclass
class CellChange:
    cell: str
    dataset: str
    test_images: int
    seeds: dict[int, tuple[float, float]]          # seed -> (committed acc, workspace acc), fractions

    def images_moved(self, seed: int) -> float:
        before, after = self.seeds[seed]
        return (after - before) * self.test_images

    @property
    def mean_images_moved(self) -> float:
        return sum(self.images_moved(s) for s in self.seeds) / len(self.seeds)


@dataclass
class Verification:
    identical: bool
    outputs_changed: list[str] = field(default_factory=list)
    cells: list[CellChange] = field(default_factory=list)
    cells_missing: list[str] = field(default_factory=list)
    conclusions_changed: list[dict] = field(default_factory=list)   # {report, id, before, after, fragile}
    conclusions_unmatched: list[str] = field(default_factory=list)
    tolerance: float = TOLERANCE_TEST_IMAGES

    @property
    def cells_beyond_tolerance(self) -> list[CellChange]:
        return [c for c in self.cells if abs(c.mean_images_moved) > self.tolerance]

    @property
    def failing_conclusions(self) -> list[dict]:
        return [c for c in self.conclusions_changed if not c["fragile"]]

    @property
    def ok(self) -> bool:
        return self.identical or not (self.cells_beyond_tolerance or self.failing_conclusions
                                      or self.cells_missing or self.conclusions_unmatched)


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
            out[o["path"]] = o.get("md5") or o.get("hash") or ""
    return out


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


def verify(repo: str | Path = ".", against: str = "HEAD", tolerance: float = TOLERANCE_TEST_IMAGES) -> Verification:
    repo = Path(repo)
    committed_lock = _git_show(repo, against, "dvc.lock")
    if committed_lock is None:
        raise MissingFileError(f"{against} has no dvc.lock: nothing committed to compare with")
    workspace_lock = (repo / "dvc.lock").read_text()
    before, after = output_hashes(committed_lock), output_hashes(workspace_lock)
    changed = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    v = Verification(identical=not changed, outputs_changed=changed, tolerance=tolerance)
    if v.identical:
        return v

    committed_results = _git_files(repo, against, "results")
    workspace_results = [p.relative_to(repo).as_posix() for p in (repo / "results").rglob("metrics.json")]
    acc_before = _accuracies(lambda f: _git_show(repo, against, f), committed_results)
    acc_after = _accuracies(lambda f: (repo / f).read_text() if (repo / f).exists() else None, workspace_results)
    by_cell: dict[str, CellChange] = {}
    for key in sorted(acc_before.keys() | acc_after.keys()):
        cell, seed = key
        if key not in acc_before or key not in acc_after:
            v.cells_missing.append(f"{cell} seed {seed}: only in the {'workspace' if key in acc_after else 'commit'}")
            continue
        dataset, b = acc_before[key]
        change = by_cell.setdefault(cell, CellChange(cell, dataset, TEST_IMAGES.get(dataset, 0), {}))
        change.seeds[seed] = (b, acc_after[key][1])
    v.cells = list(by_cell.values())

    for name in sorted({Path(f).name for f in _git_files(repo, against, CONCLUSIONS_DIR)}
                       | {p.name for p in (repo / CONCLUSIONS_DIR).glob("*.json")}):
        old_text = _git_show(repo, against, f"{CONCLUSIONS_DIR}/{name}")
        new_path = repo / CONCLUSIONS_DIR / name
        if old_text is None or not new_path.exists():
            v.conclusions_unmatched.append(f"{name}: only in the {'workspace' if old_text is None else 'commit'}")
            continue
        old = {c["id"]: c for c in json.loads(old_text)["conclusions"]}
        new = {c["id"]: c for c in json.loads(new_path.read_text())["conclusions"]}
        for cid in sorted(old.keys() | new.keys()):
            if cid not in old or cid not in new:
                v.conclusions_unmatched.append(f"{name}: {cid}: only in the {'workspace' if cid in new else 'commit'}")
            elif old[cid]["verdict"] != new[cid]["verdict"]:
                v.conclusions_changed.append({
                    "report": name, "id": cid, "before": old[cid]["verdict"], "after": new[cid]["verdict"],
                    "p_before": _adjusted_p(old[cid]), "p_after": _adjusted_p(new[cid]),
                    "fragile": bool(old[cid].get("fragile") or new[cid].get("fragile"))})
    return v


def _adjusted_p(conclusion: dict) -> float:
    """A conclusion's adjusted p (`p_holm` in records written before the paired statistics)."""
    return conclusion.get("p_adjusted", conclusion.get("p_holm"))


def _p(x) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3g}"


def render(v: Verification, against: str) -> str:
    if v.identical:
        return f"identical bytes: every output in dvc.lock has the hash {against} committed"
    lines = [f"{len(v.outputs_changed)} output(s) differ in bytes from {against} (expected on another CPU: "
             "docs/reproducibility.md); comparing what they conclude.", "",
             f"Accuracy per cell, in test images (workspace - {against}); tolerance: a cell's mean "
             f"over seeds within ±{v.tolerance:g} images:"]
    for c in v.cells:
        seeds = " ".join(f"s{s}:{c.images_moved(s):+.0f}" for s in sorted(c.seeds))
        flag = "  <-- beyond tolerance" if abs(c.mean_images_moved) > v.tolerance else ""
        lines.append(f"  {c.cell}: mean {c.mean_images_moved:+.1f} of {c.test_images} ({seeds}){flag}")
    lines += [f"  {m}  <-- not comparable" for m in v.cells_missing]
    lines += ["", "Conclusions (reports/conclusions/*.json):"]
    if not v.conclusions_changed and not v.conclusions_unmatched:
        lines.append("  every conclusion is the same")
    for c in v.conclusions_changed:
        tag = "fragile, not failed" if c["fragile"] else "CHANGED"
        lines.append(f"  {c['report']}: {c['id']}: {c['before']} -> {c['after']} "
                     f"(Holm p {_p(c['p_before'])} -> {_p(c['p_after'])}) [{tag}]")
    lines += [f"  {m}  <-- not comparable" for m in v.conclusions_unmatched]
    lines += ["", "verdict: " + ("reproduced: the same conclusions, accuracies within tolerance" if v.ok else
                                 "NOT reproduced: " + "; ".join(filter(None, [
                                     f"{len(v.cells_beyond_tolerance)} cell(s) beyond tolerance"
                                     if v.cells_beyond_tolerance else "",
                                     f"{len(v.failing_conclusions)} conclusion(s) changed"
                                     if v.failing_conclusions else "",
                                     "outputs that cannot be compared" if v.cells_missing or v.conclusions_unmatched
                                     else ""])))]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="HEAD", help="the commit whose outputs to compare with (default HEAD)")
    ap.add_argument("--tolerance-images", type=float, default=TOLERANCE_TEST_IMAGES,
                    help=f"largest change of a cell's mean accuracy, in test images (default {TOLERANCE_TEST_IMAGES})")
    a = ap.parse_args(argv)
    try:
        v = verify(".", a.against, a.tolerance_images)
    except StructinitError as e:       # nothing to compare with: the message says why, no traceback
        sys.exit(f"error: {e}")
    print(render(v, a.against))
    return 0 if v.ok else 1


if __name__ == "__main__":
    sys.exit(main())
