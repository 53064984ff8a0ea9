"""What the evidence stages record and how a report reads it: results that cost hours, made by
frozen DVC stages (structinit/evidence/), quoted by reports only while they are fresh.

Each evidence stage writes results/evidence/<name>/ (small files, committed) and RECORD
(inputs.json): the DVC hash (dvc.lock's `md5`) of each pipeline output it read or compares with,
the main grid's cells for the trained evidence, as they were when it ran. DVC's own lock entry
of a frozen stage cannot say that: `dvc repro` of a frozen stage whose outputs exist records the
current deps beside them without running anything. So freshness is this module's: an evidence
is fresh when every recorded input still has the recorded hash, stale when one differs or is
gone, and unrecorded when it has no record (what an older benchmark left). Keyed on outputs, not
source files: a comment edit changes nothing; a retrained cell with other bytes makes the
evidence stale. A report quotes an evidence's verdict only while it is fresh; otherwise it says,
in one line (unmeasured_line), that the verdict was not measured on these cells. Here, not in
structinit/evidence/, because reports import no evidence code: they read its files.

This module knows the layout the stages hand it only through the paths they pass; EVIDENCE
holds what a reader needs to re-run each (its stage, folder and cost).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

RECORD = "inputs.json"


@dataclass(frozen=True)
class Evidence:
    name: str          # the DVC stage
    folder: str        # its outputs
    hours: str         # its cost on 2 CPU cores, for the unmeasured line
    what: str          # what it measures, for the line a report prints while it is not fresh

    @property
    def command(self) -> str:
        """How to run a frozen stage on purpose (DVC never runs a frozen stage, -f included:
        unfreeze it, force it, then check out the committed dvc.yaml, which restores `frozen: true`
        and the file as written: DVC's unfreeze rewrites all of it)."""
        return f"./run.sh dvc unfreeze {self.name} && ./run.sh dvc repro -f -s {self.name}; git checkout dvc.yaml"


EVIDENCE = {e.name: e for e in (
    Evidence("epoch_budget", "results/evidence/epoch_budget", "about 2 h", "its convergence"),
    Evidence("replication", "results/evidence/replication", "about 1 h",
             "the primary contrast's replication on disjoint seeds"),
    Evidence("regime", "results/evidence/regime", "about 1 h", "the regime study"),
    Evidence("softness_law", "results/evidence/softness_law", "about 0.5 h", "the softness law's data"),
)}


@dataclass(frozen=True)
class Freshness:
    """fresh: every recorded input has its recorded hash; stale: `changed` lists those that
    differ or are gone; unrecorded: the evidence has no record of its inputs."""
    status: str                                   # "fresh" | "stale" | "unrecorded"
    changed: tuple[str, ...] = field(default=())

    @property
    def fresh(self) -> bool:
        return self.status == "fresh"

    def __str__(self) -> str:
        if self.status == "stale":
            return "stale: " + ", ".join(self.changed) + " changed since it ran"
        if self.status == "unrecorded":
            return f"unrecorded: no {RECORD}, so what it was made from is unknown"
        return "fresh"


def freshness(record: Mapping | None, current: Mapping[str, str | None]) -> Freshness:
    """record: an evidence's RECORD ({"inputs": {path: md5}}), or None; current: path -> md5 now
    (lock_hashes of dvc.lock, or workspace_hashes), None or absent where the path is gone."""
    inputs = (record or {}).get("inputs")
    if not inputs:
        return Freshness("unrecorded")
    changed = tuple(sorted(p for p, md5 in inputs.items() if current.get(p) != md5))
    return Freshness("stale", changed) if changed else Freshness("fresh")


def lock_hashes(lock: Mapping) -> dict[str, str]:
    """A parsed dvc.lock -> {output path: its md5} for every stage's outs."""
    return {o["path"]: o["md5"] for stage in lock.get("stages", {}).values()
            for o in stage.get("outs", []) if "md5" in o}


def file_md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def dvc_md5(path: Path) -> str | None:
    """What dvc.lock records for an output at `path`: a file's md5; a folder's, the md5 of the
    JSON list of its files' (relpath, md5) plus ".dir" (DVC 3's tree hash); None if absent."""
    path = Path(path)
    if path.is_file():
        return file_md5(path)
    if not path.is_dir():
        return None
    entries = sorted(({"md5": file_md5(f), "relpath": f.relative_to(path).as_posix()}
                      for f in path.rglob("*") if f.is_file()), key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode()).hexdigest() + ".dir"


def workspace_hashes(paths, root: Path = Path(".")) -> dict[str, str | None]:
    """{path: dvc_md5(root / path)}: what dvc.lock would record for each, from the files."""
    return {p: dvc_md5(Path(root) / p) for p in paths}


def read_record(folder: Path) -> dict | None:
    path = Path(folder) / RECORD
    return json.loads(path.read_text()) if path.exists() else None


def inputs_record(evidence: str, paths, root: Path = Path(".")) -> dict:
    """The RECORD an evidence stage writes beside its results: the hash of each pipeline
    output it read (paths relative to the repository root `root`), as dvc.lock records it."""
    hashes = workspace_hashes(sorted(paths), root)
    if missing := [p for p, h in hashes.items() if h is None]:
        raise FileNotFoundError(f"{evidence}: its inputs {missing} do not exist: run their stages first")
    return {"evidence": evidence, "inputs": hashes}


def evidence_freshness(folder: Path, root: Path = Path(".")) -> Freshness:
    """An evidence folder's record against the workspace's files (what a report stage, which
    depends on those files, sees)."""
    record = read_record(folder)
    return freshness(record, workspace_hashes((record or {}).get("inputs", {}), root))


def unmeasured_line(name: str, subject: str = "") -> str:
    """The one line a report prints in place of a verdict whose evidence is not fresh."""
    e = EVIDENCE[name]
    what = f"{subject}: {e.what}" if subject else e.what[0].upper() + e.what[1:]
    return (f"{what} has not been measured on these cells "
            f"({e.folder}; `{e.command}`, {e.hours} on 2 cores)")
