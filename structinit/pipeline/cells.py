"""Which cells params.yaml asks for, and what they are called: the one home of cell names.

A *cell* is one configuration trained on one dataset for every seed of its seed list; each
seed's results live in <results>/<cell>/seed<s>/. Names, as dvc.yaml's matrix stages write
their output folders (tests/test_dvc_deps.py checks that the two agree):

    main grid      <dataset>-<init>                 digits-mimetic, digits-impulse3
    convmixer      <dataset>-<size>-<mode>          digits-cm64d4k3-learned
    pseudo_input   <dataset>-<variant>              digits-UU, digits-PPL
    heads_width    <dataset>-<shape>-<init>         digits-h6-impulse3
    data_size      <dataset>-<fraction>-<init>      digits-0.1-mimetic

An initializer name is a kernel-independent one (trunc_normal, kaiming_uniform, mimetic, or any
with a file in init/methods/) or impulse<k>, the structured init with a k x k kernel. Which
names exist is the registry's business (the params schema checks them); this module only
names cells, and stays torch-free for the report stages.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from structinit.config import PSEUDO_INPUTS
from structinit.data.specs import STREAMED

IMPULSE = "impulse"          # the structured init: cells named impulse<k>, one per kernel
STUDIES = ("convmixer", "pseudo_input", "heads_width", "data_size")


# ---- initializer names --------------------------------------------------------------------

def impulse_init(kernel: int) -> str:
    """The structured init with a k x k kernel, as cells name it: impulse_init(3) == "impulse3"."""
    return f"{IMPULSE}{kernel}"


def impulse_kernel(init: str) -> int | None:
    """"impulse5" -> 5; None for any other name."""
    rest = init.removeprefix(IMPULSE)
    return int(rest) if rest != init and rest.isdigit() else None


def parse_init(init: str) -> tuple[str, int | None]:
    """A cell's initializer name -> (initialize() method, kernel or None): "impulse3" ->
    ("impulse", 3), "mimetic" -> ("mimetic", None). A bare "impulse" (no kernel) is a
    ValueError; whether other names exist is initialize()'s (and the schema's) to say."""
    if (k := impulse_kernel(init)) is not None:
        return IMPULSE, k
    if init.startswith(IMPULSE) or not init.isidentifier():
        raise ValueError(f"{init!r} is not a cell's initializer: a registered initializer's name "
                         f"or {IMPULSE}<k> (the structured init, k x k kernel, e.g. {impulse_init(3)})")
    return init, None


# ---- pseudo-input variants (the pseudo-input study's cells) ---------------------------------

def pseudo_variant(pseudo_input: str, pseudo_input_rest: str | None, per_layer: bool) -> str:
    """Structured-init options -> their pseudo-input variant name (parse_pseudo_variant's inverse)."""
    return pseudo_input + (pseudo_input_rest or pseudo_input) + ("L" if per_layer else "")


def parse_pseudo_variant(variant: str) -> dict:
    """Pseudo-input variant name -> structured-init options.

    "<first><rest>[L]": pseudo-input of block 0, of the later blocks (P, U, G, A, B), and an
    optional "L" for a per-layer solve (default: one shared solve). "PP" is the main grid's
    structured init; "UPL" = U for block 0, P after, each block solved afresh.
    """
    per_layer = variant.endswith("L")
    core = variant[:-1] if per_layer else variant
    if len(core) != 2 or any(c not in PSEUDO_INPUTS for c in core):
        raise ValueError(f"pseudo-input variant {variant!r}: expected two of {PSEUDO_INPUTS} "
                         "(first block, later blocks) and an optional 'L' (per-layer solve), e.g. 'UP', 'PPL'")
    return {"pseudo_input": core[0], "pseudo_input_rest": core[1], "per_layer": per_layer}


def main_variant(params: dict) -> str:
    """The pseudo-input variant the main grid's structured init runs ("PP" by default)."""
    s = params["solve"]
    return pseudo_variant(s["pseudo_input"], s["pseudo_input_rest"], s["per_layer"])


# ---- the cells params.yaml asks for ---------------------------------------------------------

def main_inits(params: dict) -> list[str]:
    """The main grid's initializers, in table order: grid.baselines, grid.variants' names, then
    impulse<k> per grid.kernels."""
    grid = params["grid"]
    return (list(grid["baselines"]) + [v["name"] for v in grid.get("variants") or []]
            + [impulse_init(k) for k in grid["kernels"]])


# ---- variants: an initializer at other options, a cell of its own ---------------------------

def variant(params: dict, init: str) -> dict | None:
    """The entry named `init` ({"name", "init", "options"}) of grid.variants or of the regime
    study's arms (studies.regime.arms: the same form, cells of that study alone), or None.
    check_params keeps the names of both lists apart."""
    regime = ((params.get("studies") or {}).get("regime") or {}).get("arms") or []
    return next((v for v in [*(params["grid"].get("variants") or []), *regime] if v["name"] == init), None)


def check_variant(name: str, init: str, options: dict, kernel_free: list[str]) -> None:
    """A variant's name is a new cell name (no registered initializer's, no impulse<k>); its
    init is a method file's name; ValueError naming what is allowed."""
    if not name.isidentifier() or name.startswith(IMPULSE) or name in kernel_free:
        raise ValueError(f"variant name {name!r}: letters, digits and underscores, not a registered "
                         f"initializer's ({kernel_free}) and not starting with {IMPULSE!r}: it names the cell")
    if init != IMPULSE and init not in kernel_free:
        raise ValueError(f"variant {name!r}: init {init!r} is not an initializer; allowed: "
                         f"{kernel_free + [IMPULSE]} (the structured init: init: {IMPULSE}, options.kernel)")


def main_variant_stage(params: dict, stage: str, dataset: str, init: str) -> str | None:
    """DVC's address of a variant cell's stage (matrix items that are dicts are numbered):
    train_variant@digits-variant0; None when `init` is no variant."""
    names = [v["name"] for v in params["grid"].get("variants") or []]
    return f"{stage}_variant@{dataset}-variant{names.index(init)}" if init in names else None


def main_cell(dataset: str, init: str) -> str:
    return f"{dataset}-{init}"


MAIN_STAGES = ("train", "analyze")       # dvc.yaml's stages with one cell of the main grid each


def main_stage(stage: str, dataset: str, init: str, params: dict | None = None) -> str:
    """DVC's exact address of the stage that makes a main-grid cell, for `dvc repro -f`:
    main_stage("train", "digits", "impulse3") == "train_impulse@digits-3". dvc.yaml splits each
    of MAIN_STAGES into <stage>_baseline (matrix key <dataset>-<init>) and <stage>_impulse (key
    <dataset>-<kernel>), so an address is not <stage>@<cell> and DVC takes no wildcard there.
    A dataset read from a local folder has its own templates: train_streamed_impulse@imagenet-3.
    A variant (grid.variants, so `params` is needed) is <stage>_variant@<dataset>-variant<i>, and
    a GPU dataset's cell (grid.gpu_datasets) train_gpu_<baseline|impulse>@...; given no params, the
    address is the one grid.datasets would give."""
    if stage not in MAIN_STAGES:
        raise ValueError(f"stage {stage!r}: the main grid's stages are {MAIN_STAGES}")
    if params is not None and (address := main_variant_stage(params, stage, dataset, init)):
        return address
    method, kernel = parse_init(init)
    gpu = params is not None and dataset in gpu_datasets(params)
    if gpu and stage != "train":
        raise ValueError(f"{dataset} is a GPU dataset (grid.gpu_datasets): only its cells are trained, "
                         f"by train_gpu_* stages; it has no {stage} stage")
    template = f"{stage}_streamed" if dataset in STREAMED else f"{stage}_gpu" if gpu else stage
    if method == IMPULSE:
        return f"{template}_{IMPULSE}@{dataset}-{kernel}"
    return f"{template}_baseline@{main_cell(dataset, init)}"


def solve_stage(dataset: str, kernel: int) -> str:
    """DVC's address of the preoptimize stage of one dataset and kernel, for `dvc repro -f`."""
    return f"preoptimize{'_streamed' if dataset in STREAMED else ''}@{solve_cell(dataset, kernel)}"


def solve_cell(dataset: str, kernel: int) -> str:
    """preoptimize's / reference_solve's name for the structured init's solves of one kernel."""
    return f"{dataset}-{kernel}"


def main_datasets(params: dict) -> list[str]:
    """The main grid's datasets, in table order: grid.datasets (trained from tensors on the
    device), grid.streamed_datasets (read from a local folder: their own stage templates), then
    grid.gpu_datasets (trained by a GPU in frozen stages: docs/fashion-mnist.md)."""
    grid = params["grid"]
    return list(grid["datasets"]) + list(grid.get("streamed_datasets") or []) + list(grid.get("gpu_datasets") or [])


def gpu_datasets(params: dict) -> list[str]:
    """grid.gpu_datasets: trained by a GPU in frozen stages, their cells only (no solve records,
    no analyses yet: docs/fashion-mnist.md)."""
    return list(params["grid"].get("gpu_datasets") or [])


def table_datasets(params: dict) -> list[str]:
    """The main table's columns: grid.datasets, then the GPU datasets."""
    return list(params["grid"]["datasets"]) + gpu_datasets(params)


def main_runs(params: dict) -> list[tuple[str, str, int]]:
    """Every (dataset, init, seed) of the main grid, in table order."""
    return list(itertools.product(main_datasets(params), main_inits(params), params["grid"]["seeds"]))


@dataclass(frozen=True)
class Run:
    """One seed of one cell: where its results are and what the report's row calls it."""
    folder: Path                   # <results>/<cell>
    seed: int
    fields: dict                   # the row's columns: dataset, init, variant, ...

    @property
    def dir(self) -> Path:
        return seed_dir(self.folder, self.seed)


def run_name(cell: str, seed: int) -> str:
    """One seed of a cell, as messages, curves and errors name it: "digits-mimetic-3"."""
    return f"{cell}-{seed}"


def seed_dir(cell_dir: str | Path, seed: int) -> Path:
    """One seed's folder inside a cell's output folder (a stage trains every seed of a cell)."""
    return Path(cell_dir) / f"seed{seed}"


def study_cell(dataset: str, *parts) -> str:
    """A study cell's name: the dataset, then the study's matrix values (module docstring)."""
    return "-".join(str(p) for p in (dataset, *parts))


def study_runs(params: dict, study: str, main: str | Path, studies: str | Path) -> list[Run]:
    """Every run a study's table reads: its own cells under <studies>/<study>/, then the main
    grid's cells it reuses under <main>/ (the pseudo-input study's main variant, the heads/width
    study's recipe shape, the data-size study's 100 % points)."""
    if study not in STUDIES:
        raise ValueError(f"unknown study {study!r}; choose one of {STUDIES}")
    s = params["studies"][study]
    main, own = Path(main), Path(studies) / study
    if study == "convmixer":
        return [Run(own / study_cell(d, z, m), seed, dict(dataset=d, size=z, mode=m))
                for d, z, m, seed in itertools.product(s["datasets"], s["sizes"], s["modes"], s["seeds"])]
    if study == "pseudo_input":
        k, variant = s["kernel"], main_variant(params)
        runs = [Run(own / study_cell(d, v), seed, dict(dataset=d, variant=v, solve="study"))
                for d, v, seed in itertools.product(s["datasets"], s["variants"], s["seeds"])]
        if variant not in s["variants"]:
            runs += [Run(main / main_cell(d, impulse_init(k)), seed,
                         dict(dataset=d, variant=variant, solve="main grid"))
                     for d, seed in itertools.product(s["datasets"], s["seeds"])]
        return runs
    if study == "heads_width":
        return ([Run(own / study_cell(d, z, i), seed, dict(dataset=d, shape=z, init=i))
                 for d, z, i, seed in itertools.product(s["datasets"], s["shapes"], s["inits"], s["seeds"])]
                + [Run(main / main_cell(d, i), seed, dict(dataset=d, shape="recipe", init=i))
                   for d, i, seed in itertools.product(s["datasets"], s["inits"], s["seeds"])])
    # data_size: each dataset at its own fractions (a GPU dataset's: studies.data_size.gpu)
    gpu = s.get("gpu") or {}
    sizes = [(d, s["fractions"]) for d in s["datasets"]] + [(d, gpu["fractions"]) for d in gpu.get("datasets") or []]
    return ([Run(own / study_cell(d, f, i), seed, dict(dataset=d, fraction=f, init=i))
             for d, fractions in sizes for f, i, seed in itertools.product(fractions, s["inits"], s["seeds"])]
            + [Run(main / main_cell(d, i), seed, dict(dataset=d, fraction=1.0, init=i))
               for (d, _), i, seed in itertools.product(sizes, s["inits"], s["seeds"])])


def ours(params: dict) -> str:
    """The arm params.yaml calls "ours", the one the headline tests: the structured init at
    init.kernel (impulse<init.kernel>). The one place that name is resolved."""
    return impulse_init(params["init"]["kernel"])


def planned_contrast(params: dict, text: str) -> tuple[str, str]:
    """A planned contrast of params.yaml ("ours vs trunc_normal"), "ours" resolved: ("impulse3",
    "trunc_normal") at init.kernel 3."""
    return parse_contrast(text, ours(params))


def parse_contrast(text: str, ours: str | None = None) -> tuple[str, str]:
    """A planned contrast as params.yaml writes it: "ours vs trunc_normal" -> ("impulse3",
    "trunc_normal") when ours = "impulse3" (planned_contrast passes params' own)."""
    parts = [p.strip() for p in str(text).split(" vs ")]
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"contrast {text!r}: write it as '<arm> vs <arm>', e.g. 'ours vs trunc_normal'")
    return tuple(ours if (p == "ours" and ours) else p for p in parts)

