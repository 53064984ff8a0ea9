"""Every seed's ModelAnalysis of a grid's cells -> the numbers of reports/attention.md.

runs maps (init, seed) -> {"at_init": ModelAnalysis, "trained": ModelAnalysis}; every function
here is pure (arrays and text out), so the attention_report stage only loads and writes.
"""
from __future__ import annotations

import itertools

import numpy as np
from tabulate import tabulate

from structinit.analysis.cka import cka_matrix
from structinit.reporting.presentation import init_label

STATES = ("at_init", "trained")
SOURCES = ("images", "pseudo")


def mean_std(values, digits: int = 3) -> str:
    v = np.asarray(values, dtype=float)
    return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}"


def target_mass(runs, inits, seeds) -> dict:
    """init -> {(state, source): [per seed: mass on the impulse offset, mean over blocks, heads]}."""
    return {i: {(st, src): [float(getattr(runs[i, s][st], f"target_{src}").mean()) for s in seeds]
                for st in STATES for src in SOURCES} for i in inits}


def target_mass_table(mass: dict) -> str:
    cols = [("at_init", "pseudo"), ("at_init", "images"), ("trained", "pseudo"), ("trained", "images")]
    rows = [[init_label(i)] + [mean_std(m[c]) for c in cols] for i, m in mass.items()]
    return tabulate(rows, headers=["init", "pseudo-input, at init", "test images, at init",
                                   "pseudo-input, trained", "test images, trained"],
                    tablefmt="github", disable_numparse=True)


def distances(runs, inits, seeds) -> dict:
    """init -> {(state, source): (seeds, L)} mean attention distance in patches, mean over heads."""
    return {i: {(st, src): np.stack([getattr(runs[i, s][st], f"distance_{src}").mean(-1).numpy()
                                     for s in seeds])
                for st, src in itertools.product(STATES, SOURCES)}
            for i in inits}


def distance_table(dist: dict, uniform: float) -> str:
    """Per block: mean distance on the test images at init -> trained (± std of trained)."""
    depth = next(iter(dist.values()))[("trained", "images")].shape[1]
    rows = []
    for init, d in dist.items():
        before, after = d[("at_init", "images")], d[("trained", "images")]
        spread = [after[:, b].std(ddof=1) if len(after) > 1 else 0.0 for b in range(depth)]
        rows.append([init_label(init)] + [f"{before[:, b].mean():.2f} → {after[:, b].mean():.2f} (± {spread[b]:.2f})"
                                          for b in range(depth)])
    rows.append(["uniform attention"] + [f"{uniform:.2f}"] * depth)
    return tabulate(rows, headers=["init"] + [f"block {b + 1}: at init → trained (± std)" for b in range(depth)],
                    tablefmt="github", disable_numparse=True)


def cka_init_vs_trained(runs, inits, seeds) -> dict:
    """init -> (L, L): CKA(block i at init, block j trained) of the same model, mean over seeds."""
    return {i: np.mean([cka_matrix(list(runs[i, s]["at_init"].representations),
                                   list(runs[i, s]["trained"].representations)).numpy() for s in seeds], 0)
            for i in inits}


def cka_between_inits(runs, inits, seeds) -> dict:
    """(a, b) for every pair a before b -> (L, L): CKA(block i of the trained a-model, block j of
    the trained b-model), same seed, mean over seeds."""
    return {(a, b): np.mean([cka_matrix(list(runs[a, s]["trained"].representations),
                                        list(runs[b, s]["trained"].representations)).numpy() for s in seeds], 0)
            for a, b in itertools.combinations(inits, 2)}


def cka_table(init_vs_trained: dict, between: dict) -> str:
    """Per init and block: CKA with itself at init, and with the same block of each other
    trained initializer (mean over those)."""
    inits = list(init_vs_trained)
    depth = next(iter(init_vs_trained.values())).shape[0]

    def others(i, b):
        return np.mean([m[b, b] for pair, m in between.items() if i in pair]) if between else float("nan")

    rows = [[init_label(i)] + [f"{init_vs_trained[i][b, b]:.2f}" for b in range(depth)]
            + [f"{others(i, b):.2f}" for b in range(depth)] for i in inits]
    return tabulate(rows, headers=["init"] + [f"block {b + 1}: at init vs trained" for b in range(depth)]
                    + [f"block {b + 1}: vs other inits, trained (mean)" for b in range(depth)],
                    tablefmt="github", disable_numparse=True)


def barely_trained(init_vs_trained: dict, threshold: float = 0.95) -> list[str]:
    """Initializers whose every block kept its representation through training (CKA with itself
    at init >= threshold): their 'trained' rows describe the init, not what training made of it."""
    return [i for i, m in init_vs_trained.items() if float(np.diagonal(m).min()) >= threshold]


# ---- a GPU dataset's analyses, compact: committed in git beside its cells -----------------------
# A GPU dataset's weights stay on the GPU machine, so its analysis is made there (stages/analyze_gpu.py)
# and committed. The per-seed files of a CPU dataset hold each block's representations of the test
# images (for CKA): megabytes per seed. The compact form keeps what the report reads: every run's
# distances, target masses, Q/K norms and offsets; the offset profiles of the first seed (the figures
# draw it); and the CKA matrices, computed where the representations are, instead of them.

def compact(runs, inits, seeds, images: int) -> dict:
    """runs (init, seed) -> {state: ModelAnalysis} -> a dict of tensors and plain values (for
    save_checked): the analyses without representations, profiles for seeds[0] alone, and the
    report's CKA matrices (cka_init_vs_trained, cka_between_inits) in their place."""
    import torch

    def slim(analysis, first: bool) -> dict:
        d = dict(analysis.to_dict(), representations=None)
        if not first:
            d.update(profile_pseudo=None, profile_images=None)
        return d
    inits, seeds = list(inits), list(seeds)
    return {"images": int(images), "inits": inits, "seeds": seeds,
            "runs": {f"{i}/{s}": {st: slim(runs[i, s][st], s == seeds[0]) for st in STATES}
                     for i in inits for s in seeds},
            "cka_init_vs_trained": {i: torch.from_numpy(np.asarray(m))
                                    for i, m in cka_init_vs_trained(runs, inits, seeds).items()},
            "cka_between_inits": {f"{a}/{b}": torch.from_numpy(np.asarray(m))
                                  for (a, b), m in cka_between_inits(runs, inits, seeds).items()}}


def expand(d: dict) -> tuple[dict, dict, dict]:
    """compact's dict -> (runs, cka_init_vs_trained, cka_between_inits) as the report's functions
    take and give them (runs' analyses without representations: the CKA is in the other two)."""
    from structinit.analysis.model import ModelAnalysis

    runs = {}
    for key, states in d["runs"].items():
        init, seed = key.rsplit("/", 1)
        runs[init, int(seed)] = {st: ModelAnalysis.from_dict(v) for st, v in states.items()}
    init_vs_trained = {i: m.numpy() for i, m in d["cka_init_vs_trained"].items()}
    between = {tuple(k.split("/")): m.numpy() for k, m in d["cka_between_inits"].items()}
    return runs, init_vs_trained, between
