"""The softness law (structinit/init/softness.py): data, fit, and check on held-out shapes,
made by the frozen stage softness_law (stages/softness_law.py: results/evidence/softness_law/).

softness_law.csv holds the official solver's mean target mass (10,000 Adam steps, P
pseudo-input) on FIT shapes (28), none of which is in params.yaml, and on HELD_OUT shapes:
every model shape the pipeline and its studies use, plus ViT-B/16. The law is fitted on FIT
rows only; the table shows, for every row, the law's mass, the closed form's mass at that shape
(same offsets) and the official one. Its last line: `max held-out error: <e>`; the goal is
<= 0.03. tests/test_solvers.py checks that softness.COEFFICIENTS are the fit of this data.
"""
import csv
import math
from pathlib import Path

import numpy as np
from tabulate import tabulate

from structinit.init import softness, solve_impulse_qk

# (grid side, width, heads, kernel, seed)
FIT = [(6, 48, 3, 3, 0), (6, 64, 2, 3, 0), (6, 96, 4, 3, 0), (8, 32, 2, 3, 0), (8, 32, 4, 3, 0),
       (8, 64, 2, 5, 0), (8, 64, 4, 3, 0), (8, 96, 2, 3, 0), (8, 96, 6, 3, 0), (8, 128, 4, 3, 0),
       (8, 128, 8, 3, 0), (10, 80, 5, 3, 0), (10, 160, 4, 3, 0), (10, 320, 10, 3, 0),
       (12, 64, 4, 3, 0), (12, 96, 3, 3, 0), (12, 128, 2, 5, 0), (12, 192, 6, 3, 0),
       (12, 256, 8, 3, 0), (14, 192, 4, 3, 0), (16, 64, 4, 3, 0), (16, 96, 2, 3, 0),
       (16, 128, 4, 3, 0), (16, 256, 4, 3, 0), (16, 320, 5, 3, 0), (14, 384, 8, 3, 0),
       (12, 448, 8, 3, 0), (16, 448, 7, 3, 0)]
HELD_OUT = [(8, 48, 3, 3, 0), (8, 48, 3, 3, 1), (8, 48, 3, 3, 2), (8, 48, 3, 5, 0), (8, 48, 3, 5, 1),
            (8, 48, 6, 3, 0), (8, 72, 6, 3, 0),                     # digits recipe, h6, w72h6
            (16, 192, 3, 3, 0), (16, 192, 8, 3, 0),                 # ViT-T/2, vit_t_h8
            (16, 384, 6, 3, 0), (16, 384, 16, 3, 0),                # vit_s_h6, vit_s_h16
            (14, 192, 3, 3, 0), (14, 192, 8, 3, 0),                 # ImageNet: ViT-T/16, vit_t_h8
            (14, 384, 6, 3, 0), (14, 384, 16, 3, 0),                # ImageNet: vit_s_h6, vit_s_h16
            (14, 768, 12, 3, 0),                                    # ViT-B/16
            (14, 96, 3, 3, 0), (14, 96, 3, 5, 0)]                   # Fashion-MNIST's recipe (patch 2 on 28x28)


OTHER_PSEUDO_INPUTS = ("U", "G", "A", "B")


def official(shape, pseudo_input="P"):
    g, c, h, k, seed = shape
    sol = solve_impulse_qk((g, g), c, h, 1, kernel=k, seed=seed, solver="adam", pseudo_input=pseudo_input)
    return sol.target_mass, sol.fit_mse


HEADER = ["grid", "embed_dim", "num_heads", "kernel", "seed", "pseudo_input", "official_mass", "official_mse"]


def solve_rows(log=print) -> list[list]:
    """The official solver on every shape (about half an hour on 2 cores): the CSV's rows, in
    FIT, HELD_OUT, then the other pseudo-inputs' order."""
    rows = []
    for shape, kind in [(s, "P") for s in FIT + HELD_OUT] + [((8, 48, 3, 3, 0), k) for k in OTHER_PSEUDO_INPUTS]:
        m, mse = official(shape, pseudo_input=kind)     # the law is for P; the others show how far off
        rows.append([*shape, kind, f"{m:.4f}", f"{mse:.6f}"])
        log(f"{shape} {kind}: official mass {m:.4f}")
    return rows


def write_csv(path: Path, rows: list[list]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        w.writerows(rows)


def read_csv(path: Path):
    with open(path) as f:
        return {(int(r["grid"]), int(r["embed_dim"]), int(r["num_heads"]), int(r["kernel"]),
                 int(r["seed"])): float(r["official_mass"]) for r in csv.DictReader(f)
                if r["pseudo_input"] == "P"}


def fit(data):
    """Least squares of log z on the features of softness.py, z = logit(mass) + log(N - 1)."""
    x = np.array([softness.features(g * g, c, h) for (g, c, h, *_), m in data])
    y = np.array([math.log(math.log(m / (1 - m)) + math.log(g * g - 1)) for (g, *_), m in data])
    return np.linalg.lstsq(x, y, rcond=None)[0]


def law_table(masses: dict) -> str:
    """The fit on FIT, the library's COEFFICIENTS beside it, and every row's official, law and
    closed-form mass; last line `max held-out error: <e>`."""
    missing = [s for s in FIT + HELD_OUT if s not in masses]
    if missing:
        raise ValueError(f"no official mass for {missing}: run the softness_law stage")
    coef = fit([(s, masses[s]) for s in FIT])
    table, held_err = [], []
    for part, shapes in (("fit", FIT), ("held out", HELD_OUT)):
        for s in shapes:
            g, c, h, k, seed = s
            law = softness.official_target_mass(g * g, c, h)
            fast = solve_impulse_qk((g, g), c, h, 1, kernel=k, seed=seed).target_mass
            if part == "held out":
                held_err.append(abs(fast - masses[s]))
            table.append([part, f"{g}x{g}", c, h, k, seed, f"{masses[s]:.3f}", f"{law:.3f}",
                          f"{fast:.3f}", f"{fast - masses[s]:+.3f}"])
    return ("fitted coefficients: " + ", ".join(f"{c:.4f}" for c in coef)
            + f" (in the library: {', '.join(f'{c:.4f}' for c in softness.COEFFICIENTS)})\n\n"
            + tabulate(table, headers=["", "grid", "width", "heads", "kernel", "seed", "official",
                                       "law", "closed form", "closed - official"], tablefmt="github")
            + f"\n\nmax held-out error: {max(held_err):.3f}\n")


def disagreements(masses: dict, reference: dict) -> list[str]:
    """The CSV's rows against the pipeline's own official solves (reference_solve's records:
    {(grid, width, heads, kernel, seed): target mass}) at the shapes both hold, to the CSV's
    4 decimals: "" for each that agrees, else what differs."""
    return [f"{s}: csv {masses[s]:.4f}, reference_solve {m:.4f}" for s, m in reference.items()
            if s in masses and round(m, 4) != masses[s]]
