"""Which pipeline outputs a change altered: the check behind "behaviour must not change".

    python -m tools.output_diff REV [--renamed new=old ...]

Compares the output hashes of `dvc.lock` at git revision REV with the working tree's
`dvc.lock` (after a `dvc repro`), then every committed file under results/ and reports/ that
differs from REV: a JSON record whose only change is renamed keys (--renamed fit_mse=loss:
the key is fit_mse now, loss at REV) counts as unchanged in meaning. Prints the counts and
every other difference; exit status 1 when there is one.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import yaml


def output_hashes(lock_text: str) -> dict[str, str | None]:
    """dvc.lock text -> {output path: md5 (a folder's .dir hash)}."""
    stages = yaml.safe_load(lock_text)["stages"]
    return {o["path"]: o.get("md5") for s in stages.values() for o in s.get("outs", [])}


def with_keys_renamed(value, renamed: dict[str, str]):
    """`value` with every dict key in `renamed` replaced by its old name, at any depth."""
    if isinstance(value, dict):
        return {renamed.get(k, k): with_keys_renamed(v, renamed) for k, v in value.items()}
    if isinstance(value, list):
        return [with_keys_renamed(v, renamed) for v in value]
    return value


def only_renamed(old_text: str, new_text: str, renamed: dict[str, str]) -> bool:
    """True when two JSON texts hold the same values once the new one's keys are renamed back."""
    try:
        return with_keys_renamed(json.loads(new_text), renamed) == json.loads(old_text)
    except json.JSONDecodeError:
        return False


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", help="the git revision to compare with, e.g. the commit before a refactor")
    ap.add_argument("--renamed", nargs="*", default=[], metavar="NEW=OLD",
                    help="JSON keys renamed by the change (new name = old name)")
    a = ap.parse_args()
    renamed = dict(pair.split("=", 1) for pair in a.renamed)
    old, new = output_hashes(_git("show", f"{a.rev}:dvc.lock")), output_hashes(open("dvc.lock").read())
    changed_outputs = sorted(p for p in old if p in new and old[p] != new[p])
    print(f"dvc.lock outputs: {len(old)} at {a.rev}, {len(new)} now; "
          f"{sum(old[p] == new.get(p) for p in old)} identical, {len(changed_outputs)} changed, "
          f"{len(set(old) ^ set(new))} only on one side")
    for p in changed_outputs:
        print(f"  changed: {p}")
    files = _git("diff", "--name-only", a.rev, "--", "results", "reports").split()
    committed = set(_git("ls-tree", "-r", "--name-only", a.rev, "--", "results", "reports").split())
    # a file only on one side (added or removed since REV) is a change of its own
    # only a JSON record can differ by renamed keys alone; any other file git lists differs
    other = [f for f in files
             if f not in committed or not os.path.exists(f) or not f.endswith(".json")
             or not only_renamed(_git("show", f"{a.rev}:{f}"), open(f).read(), renamed)]
    print(f"committed results/reports files: {len(files)} differ from {a.rev}, "
          f"{len(files) - len(other)} only by renamed keys {sorted(renamed)}")
    for f in other:
        print(f"  other change: {f}")
    return 1 if other or set(old) ^ set(new) else 0


if __name__ == "__main__":
    sys.exit(main())
