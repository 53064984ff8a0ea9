"""softness_law (frozen; about 0.5 h on 2 cores): the official solver's softness on every shape,
and the law fitted to it (structinit/init/softness.py).

    python -m stages.softness_law --reference results/reference --out results/evidence/softness_law
    python -m stages.softness_law --reuse ...   # solve nothing: refit and check the committed CSV

Writes into --out: softness_law.csv (the official solver's mass on the law's FIT and HELD_OUT
shapes: structinit/evidence/softness_law.py), softness_law.md (the fit, the library's
coefficients beside it, every row's law and closed-form mass) and inputs.json: the DVC hash
of the pipeline's own official solves (reference_solve's records, --reference) whose target
masses the CSV's rows at the same shapes equal. The law depends on no trained cell; a change
of the official solver that moves those solves makes it stale.
"""
import argparse
import json
from pathlib import Path

from stages.common import run_stage, write_json, write_text
from structinit.records import RECORD, inputs_record
from structinit.evidence import softness_law as ev
from structinit.pipeline.load import load_params


def reference_masses(reference: Path, params) -> tuple[dict, list[str]]:
    """{(grid, width, heads, kernel, seed): target mass} of reference_solve's records for digits,
    and the record folders read."""
    model = params["recipes"]["digits"]["model"]
    side = 8 // model["patch_size"]
    out, folders = {}, []
    for folder in sorted(Path(reference).glob("digits-*")):
        folders.append(str(folder))
        for f in sorted(folder.glob("seed*.json")):
            r = json.loads(f.read_text())
            out[side, model["embed_dim"], model["num_heads"], int(r["kernel"]), int(r["seed"])] = r["target_mass"]
    return out, folders


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", type=Path, default=Path("results/reference"))
    ap.add_argument("--out", type=Path, default=Path("results/evidence/softness_law"))
    ap.add_argument("--reuse", action="store_true", help="solve nothing: refit and check --out's CSV")
    a = ap.parse_args()
    csv_path = a.out / "softness_law.csv"
    if not a.reuse:
        a.out.mkdir(parents=True, exist_ok=True)
        ev.write_csv(csv_path, ev.solve_rows())
    masses = ev.read_csv(csv_path)
    reference, folders = reference_masses(a.reference, load_params())
    if bad := ev.disagreements(masses, reference):
        raise SystemExit(f"{csv_path} disagrees with the pipeline's official solves ({a.reference}): {bad}")
    text = ev.law_table(masses)
    write_text(a.out / "softness_law.md", "# The softness law: official solver, law and closed form by shape "
               "(stage softness_law)\n\n" + text)
    write_json(a.out / RECORD, inputs_record("softness_law", folders))
    print(text)


if __name__ == "__main__":
    run_stage(main)
