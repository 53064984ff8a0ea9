"""params.yaml's schema: every key, its type and range, and the rules across keys.

    check_params_file("params.yaml") -> the loaded Params (pipeline/load.py), or ParamsError listing every
                                        problem, one line each: the key path, the bad value, what is allowed

The pipeline's first stage, check_params, checks the whole file before any other stage runs, so a typo in a
study's section fails in seconds, not after the main table. The other stages read params.yaml as it is
(pipeline/load.py) and never import this schema: editing a rule re-runs nothing but that check. Unknown keys
are refused, since a misspelt key would be silently ignored. Initializer names are init/methods/'s files,
read without importing them (pipeline/initializers.py): the check imports neither torch nor timm.
"""
from __future__ import annotations

import dataclasses
import re
import sys
import typing
from pathlib import Path
from typing import Any, Annotated, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from structinit.config import (FILTER_MODES, IMPULSE_SOLVE_OPTIONS, OFFSET_ORDERS, PSEUDO_INPUTS, SOLVER_NAMES,
                               check_kernel, patch_grid_for)
from structinit.data import own
from structinit.data.specs import DATASETS, STREAMED, TRAIN_IMAGES
from structinit.pipeline import cells
from structinit.pipeline.cells import IMPULSE, impulse_init, impulse_kernel, parse_contrast, parse_pseudo_variant
from structinit.pipeline.initializers import SHIPPED, declared, method_names
from structinit.pipeline.load import Params, ParamsError, load_params
from structinit.training.config import TrainConfig, subset_size


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _unique(values: list) -> list:
    twice = sorted({v for v in values if values.count(v) > 1}, key=str)
    if twice:
        raise ValueError(f"{twice} listed twice; each entry once")
    return values


def _pair(text: str) -> str:
    """One planned pair, "<arm> vs <arm>": the form (cells.parse_contrast, whose ValueError says it), two arms."""
    a, b = parse_contrast(text)
    if a == b:
        raise ValueError(f"contrast {text!r} compares an arm with itself")
    return text


def _once(planned: list[str]) -> list[str]:
    seen = [frozenset(parse_contrast(t)) for t in planned]
    twice = [t for t, pair in zip(planned, seen) if seen.count(pair) > 1]
    if twice:
        raise ValueError(f"{twice}: the same pair planned twice; each pair once")
    return planned


def _variant_name(v: str) -> str:
    parse_pseudo_variant(v)                      # its ValueError names what is allowed
    return v


PosInt = Annotated[int, Field(gt=0)]
PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(gt=0, lt=1)]
Dataset = Literal[tuple(DATASETS)]
Pair = Annotated[str, AfterValidator(_pair)]
Unique = AfterValidator(_unique)
Seeds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1), Unique]
StudyDatasets = Annotated[list[Dataset], Unique]   # [] = the study is off (its report says how to bring it back)


def _some(item) -> Any:
    """A list of at least one `item`, each once."""
    return Annotated[list[item], Field(min_length=1), Unique]


class Variant(_Section):
    """An initializer at options other than its defaults: a cell of its own, named `name`."""
    name: str
    init: str                            # a method file's name (init/methods/<init>.py); impulse: options.kernel
    options: Annotated[dict[str, Any], Field(min_length=1)]

    @model_validator(mode="after")
    def _known(self):
        cells.check_variant(self.name, self.init, self.options, _kernel_free_initializers())
        takes_kernel, options = _initializer_options(self.init, self.options)
        allowed = [o for o in options if o != "solution"]
        if unknown := sorted(set(self.options) - set(allowed)):
            raise ValueError(f"variant {self.name!r}: unknown option(s) {unknown} for {self.init!r}; "
                             f"allowed: {allowed}")
        if takes_kernel and not isinstance(self.options.get("kernel"), int):
            raise ValueError(f"variant {self.name!r}: {self.init!r} needs options.kernel (a whole number, "
                             f"e.g. 3), got {self.options.get('kernel')!r}")
        return self


class Grid(_Section):
    datasets: Annotated[list[str], Unique]    # built-in (DATASETS) or own_datasets' names: _dataset_problems
    streamed_datasets: Annotated[list[Dataset], Unique] = []   # read from a local folder (ImageNet)
    gpu_datasets: Annotated[list[Dataset], Unique] = []        # trained by a GPU, in frozen stages
    baselines: Annotated[list[Annotated[str, AfterValidator(lambda name: _kernel_free(name))]], Unique]
    variants: list[Variant] = []              # an initializer at other options, a cell each (docs/library.md)
    kernels: _some(PosInt)
    seeds: Seeds

    @model_validator(mode="after")
    def _variant_names(self):
        names = _unique([v.name for v in self.variants])
        if clash := sorted(set(names) & set(self.baselines)):
            raise ValueError(f"variants {clash} are named like a baseline: a variant's name is its own cell's")
        for kind, why in (("gpu_datasets", "the GPU datasets' frozen stages have none"),
                          ("streamed_datasets", "the streamed datasets' templates have none yet")):
            if self.variants and (other := getattr(self, kind)):
                raise ValueError(f"grid.variants train on grid.datasets only; {why}: empty grid.variants or "
                                 f"grid.{kind} (now {other})")
        return self


class ClosedForm(_Section):              # keyword options of init/solvers.solve_qk_closed_form
    target_mass: Optional[Fraction] = None
    rtol: PosFloat = 0.03
    filler_std: Annotated[float, Field(ge=0)] = 0.02


class Adam(_Section):                    # keyword options of init/solvers.solve_qk_adam
    steps: PosInt = 10_000
    lr: PosFloat = 1e-4
    renorm_every: PosInt = 100
    early_stop: bool = False
    tol: PosFloat = 1e-3
    window: PosInt = 1000


class Init(_Section):
    kernel: PosInt                       # the headline Imp.-k row


class SpeedEndpoint(_Section):           # test accuracy early in training, tested like the primary
    fraction: Annotated[float, Field(gt=0, le=1)]   # of each recipe's epochs: the first tested epoch at or after it
    primary: Pair                        # "<arm> vs <arm>" ("ours" allowed), tested alone at alpha


class RegimeContrasts(_Section):         # planned, paired tests (reporting/stats.py); the regime study's
    alpha: Fraction = 0.05
    primary: Pair                        # "<arm> vs <arm>"; tested alone at alpha
    secondary: list[Pair] = []           # Holm over these only
    speed: Optional[SpeedEndpoint] = None   # a pre-specified speed endpoint beside final accuracy


def _registered(v):
    if v is not None and "ours" in parse_contrast(v):
        raise ValueError(f"contrast {v!r}: name the arms as registered (e.g. impulse3), not 'ours'")
    return v


class Contrasts(RegimeContrasts):        # the main table's
    direction: Literal["two-sided", "greater"] = "two-sided"   # greater: the primary's first arm wins
    # the primary as fixed before the committed run, arms named ("impulse3 vs trunc_normal"); a run whose
    # primary resolves otherwise (another init.kernel) is labelled exploratory
    registered: Annotated[Optional[str], AfterValidator(_registered)] = None


class Solve(_Section):                   # solve_impulse_qk's options (IMPULSE_SOLVE_OPTIONS) + each solver's
    solver: Literal[SOLVER_NAMES]
    offset_order: Literal[OFFSET_ORDERS]
    pseudo_input: Literal[PSEUDO_INPUTS]
    pseudo_input_rest: Optional[Literal[PSEUDO_INPUTS]]
    per_layer: bool
    closed_form: ClosedForm
    adam: Adam


def _fraction_or_count(v):
    if v is None or (isinstance(v, int) and v >= 1) or (isinstance(v, float) and 0 < v <= 1):
        return v
    raise ValueError("must be null (all images), a fraction in (0, 1] or a count >= 1")


class Data(_Section):
    train_size: Annotated[Optional[float | int], AfterValidator(_fraction_or_count)]
    subset_seed: Annotated[int, Field(ge=0)]


class LocalDatasets(_Section):           # datasets read from a local directory (datasets.STREAMED)
    imagenet: Optional[str] = None
    imagenet_require_full: bool = True   # false: a copy with fewer images than ILSVRC-2012 only warns


class OwnDataset(_Section):             # your own dataset, read from datasets/<name>/ (data/own.py)
    image_size: PosInt                   # what the model is built for, declared so that every stage
    channels: Literal[1, 3]              # knows it before the files are read; checked against them
    num_classes: Annotated[int, Field(ge=2)]


class VitModel(_Section):                # create_vit's shape arguments
    patch_size: PosInt
    embed_dim: PosInt
    depth: PosInt
    num_heads: PosInt
    mlp_ratio: PosFloat = 4.0


# a partial VitModel: any of its keys, typed as there
ShapeOverride = create_model("ShapeOverride", __base__=_Section, **{
    name: (Optional[Annotated[(f.annotation, *f.metadata)]], None) for name, f in VitModel.model_fields.items()})


class _TrainBase(_Section):
    @model_validator(mode="after")
    def _as_train_config(self):
        TrainConfig(**self.model_dump(), seed=0)   # its own checks: ranges, amp, randaugment
        if self.warmup_epochs > self.epochs:       # allowed in the library, a slip in a recipe
            raise ValueError(f"warmup_epochs={self.warmup_epochs}: must be between 0 and epochs ({self.epochs})")
        return self


# recipes.<dataset>.train: TrainConfig's fields, their types and defaults (its seed comes from the seed lists)
_HINTS = typing.get_type_hints(TrainConfig)
Train = create_model("Train", __base__=_TrainBase, **{f.name: (_HINTS[f.name], f.default)
                                                      for f in dataclasses.fields(TrainConfig) if f.name != "seed"})


class Recipe(_Section):
    model: VitModel
    train: Train


class EquivalenceTest(_Section):         # TOST: is the pair's paired difference within +-margin?
    pair: Pair
    margin: PosFloat                     # in the study's unit (accuracy points), stated before the run


class StudyContrasts(_Section):          # a study's planned, paired tests (reporting/stats.py)
    alpha: Fraction = 0.05
    planned: Annotated[list[Pair], Field(min_length=1), AfterValidator(_once)]   # Holm per family
    equivalence: list[EquivalenceTest] = []


def _study_init(name: str) -> str:
    """A study trains the shipped initializers (pipeline/initializers.SHIPPED) or impulse<k>: its stages
    depend on those files alone, so a study cell of another would not be retrained when its file changes."""
    shipped = [n for n in SHIPPED if n != IMPULSE]
    if cells.parse_init(name)[0] not in (IMPULSE, *shipped):       # parse_init's ValueError names the form
        raise ValueError(f"{name!r}: a study trains the shipped initializers {shipped} or {IMPULSE}<k> (the "
                         f"structured init, e.g. {impulse_init(3)}); a study stage depends on those files alone: "
                         "to study another one, add its file to dvc.yaml's &study_deps and its name to "
                         "pipeline/initializers.SHIPPED")
    return name


StudyInits = Annotated[list[Annotated[str, AfterValidator(_study_init)]], Field(min_length=1), Unique]


class ConvmixerStudy(_Section):
    datasets: StudyDatasets
    sizes: _some(str)                    # keys of convmixer_sizes
    modes: _some(Literal[FILTER_MODES])
    seeds: Seeds
    contrasts: StudyContrasts            # arms: filter modes


class PseudoInputStudy(_Section):
    datasets: StudyDatasets
    kernel: PosInt
    variants: _some(Annotated[str, AfterValidator(_variant_name)])
    seeds: Seeds
    contrasts: StudyContrasts            # arms: pseudo-input variants (the main grid's: "PP" by default)


class HeadsWidthStudy(_Section):
    datasets: StudyDatasets
    shapes: _some(str)                   # keys of model_shapes
    inits: StudyInits
    seeds: Seeds
    contrasts: StudyContrasts            # arms: initializers, compared within each shape


class DataSizeGpu(_Section):             # a GPU dataset's own sizes, in frozen stages as its main cells
    datasets: Annotated[list[Dataset], Unique] = []   # a subset of grid.gpu_datasets
    fractions: _some(Fraction) = [0.05, 0.2]


class DataSizeStudy(_Section):
    datasets: StudyDatasets
    fractions: _some(Fraction)           # of the main grid's training set (its 100 % point, reused, not trained)
    inits: StudyInits
    seeds: Seeds
    contrasts: StudyContrasts            # arms: initializers, compared within each size (and their gaps' changes)
    gpu: DataSizeGpu = DataSizeGpu()     # the GPU datasets' sizes (docs/fashion-mnist.md)


class RegimeStudy(_Section):             # beyond the paper: the structured init at sharper target masses
    datasets: StudyDatasets = []         # [] = off, the default (the frozen stage regime runs it in a copy)
    reused: _some(str)                   # main-grid arms: grid.seeds reused, own_seeds added
    arms: Annotated[list[Variant], Field(min_length=1)]   # an initializer at other options, a cell each
    shared_seeds: Seeds                  # a subset of grid.seeds: the reused arms' cells
    own_seeds: Seeds                     # outside grid.seeds: trained by the study for every arm
    contrasts: RegimeContrasts

    @model_validator(mode="after")
    def _arms(self):
        names = self.reused + [a.name for a in self.arms]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"arm name(s) {twice} listed twice across reused and arms; each arm once")
        c = self.contrasts
        for text in [c.primary, *c.secondary, *([c.speed.primary] if c.speed else [])]:
            if unknown := [x for x in parse_contrast(text) if x not in names]:
                raise ValueError(f"contrast {text!r}: {unknown} is not an arm of the study; arms: {names}")
        if both := sorted(set(self.shared_seeds) & set(self.own_seeds)):
            raise ValueError(f"seed(s) {both} in both shared_seeds and own_seeds: a seed is one pair")
        return self


class Studies(_Section):
    convmixer: ConvmixerStudy
    pseudo_input: PseudoInputStudy
    heads_width: HeadsWidthStudy
    data_size: DataSizeStudy
    regime: RegimeStudy                  # beyond the paper, off the default (datasets: []); dvc.yaml reads it


class ConvmixerSize(_Section):
    dim: PosInt
    depth: PosInt
    kernel_size: PosInt
    patch_size: PosInt


class ParamsSchema(_Section):
    grid: Grid
    init: Init
    contrasts: Contrasts
    solve: Solve
    data: Data
    recipes: dict[str, Recipe]           # a key per dataset: built-in or own_datasets' (_dataset_problems)
    studies: Studies
    convmixer_sizes: dict[str, ConvmixerSize]
    model_shapes: dict[str, ShapeOverride]
    local_datasets: LocalDatasets = LocalDatasets()
    own_datasets: dict[str, OwnDataset] = {}


# ---- initializers, as the registry would list them, without importing torch ---------------------------------

def _kernel_free_initializers() -> list[str]:
    """The initializers a grid lists by name: each init/methods/ file whose registration takes no kernel (read
    from the file, pipeline/initializers.py), and any registered in this process under a name no method file
    has (a notebook's, a test's): the registry tells no more without loading the files, which imports torch."""
    names = {name: (declared(name) or _registry_entry(name)).takes_kernel for name in method_names()}
    if (registry := sys.modules.get("structinit.init.registry")) is not None:   # imported: its registrations count
        names.update({name: registry.INITIALIZERS[name].takes_kernel      # registered already: loads no file
                      for name in registry.available() if name not in names})
    return [name for name, takes_kernel in sorted(names.items()) if not takes_kernel]


def _registry_entry(name: str):
    """The registry's Initializer (imports the method file, so torch), for a file only running it tells."""
    from structinit.init.registry import get_initializer

    return get_initializer(name)


def _initializer_options(name: str, options: dict) -> tuple[bool, list[str]]:
    """(takes_kernel, the options `name` accepts given `options`), as registry.allowed_options gives them: a
    literal options=(...) from the method file; the structured init's from the chosen solver's section of this
    schema (tests/test_params.py holds those equal to the solvers' keywords); any other from the registry."""
    found = declared(name)
    if found is not None and found.options is not None:
        return found.takes_kernel, list(found.options)
    if found is not None and name == IMPULSE:
        solver = options.get("solver", "closed_form")           # methods/impulse.py's default solver
        if not isinstance(solver, str) or solver not in SOLVER_NAMES:
            raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVER_NAMES}")
        section = Solve.model_fields[solver].annotation
        return found.takes_kernel, ["kernel", *IMPULSE_SOLVE_OPTIONS, "solution", *section.model_fields]
    from structinit.init.registry import allowed_options

    init = _registry_entry(name)
    return init.takes_kernel, list(allowed_options(init, options))


def _kernel_free(name: str) -> str:
    if name not in (kernel_free := _kernel_free_initializers()):
        raise ValueError(f"not a registered kernel-independent initializer; allowed: {kernel_free} "
                         "(the structured init's rows are grid.kernels; a new one is a file "
                         "structinit/init/methods/<name>.py: docs/library.md)")
    return name


# ---- the rules across keys: (key path, value, what is wrong and what is allowed) ------------------------------

def _cross_field_problems(p: ParamsSchema, root: str | Path = ".") -> list[tuple[str, object, str]]:
    out, train_images = _dataset_problems(p, root)      # `root` holds datasets/<name>/: your datasets' files
    specs = {**p.own_datasets, **DATASETS}              # your declaration or a built-in spec (a clash is refused)
    image = {d: v.image_size for d, v in specs.items()}
    classes = {d: v.num_classes for d, v in specs.items()}
    g, s = p.grid, p.studies
    model = {d: r.model.model_dump() for d, r in p.recipes.items()}
    if p.init.kernel not in g.kernels:
        out.append(("init.kernel", p.init.kernel, f"must be one of grid.kernels {g.kernels} "
                    "(it picks the main table's headline row)"))
    kernel_free = _kernel_free_initializers()
    arms = kernel_free + [v.name for v in g.variants]       # a variant is a main-table arm of its own
    for where, text in [("contrasts.primary", p.contrasts.primary),
                        *((f"contrasts.secondary[{i}]", t) for i, t in enumerate(p.contrasts.secondary))]:
        for arm in parse_contrast(text):
            if arm != "ours" and impulse_kernel(arm) is None and arm not in arms:
                out.append((where, text, f"{arm!r} is not an initializer; allowed: ours (the headline "
                            f"impulse<init.kernel>), {arms} or {IMPULSE}<k>. A contrast whose arms are "
                            "not in the grid is reported as not run"))
    if not g.datasets and not g.streamed_datasets:
        out.append(("grid.datasets", g.datasets, "the grid needs a dataset (here or in grid.streamed_datasets)"))
    out += [(f"grid.datasets[{i}]", d, "is read from a local folder while training: list it in "
             "grid.streamed_datasets (its stages are their own: download_streamed, train_streamed_*)")
            for i, d in enumerate(g.datasets) if d in STREAMED]
    out += [(f"grid.gpu_datasets[{i}]", d, "a GPU dataset's cells train in frozen stages of their own, from tensors "
             f"on the device: list it here only (not in grid.datasets; streamed datasets {list(STREAMED)} have "
             "their own list)") for i, d in enumerate(g.gpu_datasets) if d in STREAMED or d in g.datasets]
    out += [(f"grid.streamed_datasets[{i}]", d, "is trained from tensors on the device: list it in grid.datasets "
             f"(streamed datasets: {list(STREAMED)})") for i, d in enumerate(g.streamed_datasets) if d not in STREAMED]
    grid_datasets = [d for d in g.datasets if d in image]     # an unknown one is reported above
    used = sorted({("grid.datasets", d) for d in grid_datasets} | {
        ("grid.streamed_datasets", d) for d in g.streamed_datasets} | {
        ("grid.gpu_datasets", d) for d in g.gpu_datasets} | {
        (f"studies.{name}.datasets", d) for name in cells.STUDIES for d in getattr(s, name).datasets})
    no_folder = set()
    for path, d in used:
        if d not in p.recipes:
            out.append((path, d, f"has no recipe: add recipes.{d} (recipes has {sorted(p.recipes)})"))
        if d in STREAMED and getattr(p.local_datasets, d) is None and d not in no_folder:
            no_folder.add(d)                   # said once, at the first key that asks for it
            out.append((path, d, f"is read from a local directory, never downloaded: set local_datasets.{d} "
                        "to its folder (ILSVRC layout: train/<wnid>/*.JPEG, val/<wnid>/*.JPEG)"))
    size = p.data.train_size
    for d in [d for _, d in used] if isinstance(size, int) else []:
        if size < classes[d]:
            out.append(("data.train_size", size, f"a count must be at least {d}'s {classes[d]} classes (one image "
                        "per class); 1.0 = all"))
            break
        if d in train_images and size > train_images[d]:
            out.append(("data.train_size", size, f"{d} has {train_images[d]} training images; allowed: a count in "
                        f"{classes[d]}..{train_images[d]}, a fraction in (0, 1], or null (all)"))
            break
    for d in p.recipes:
        out += _vit_problems(f"recipes.{d}.model", model[d], d, image[d]) if d in image else []
    # kernels of the structured init, against the patch grid of each model they initialize
    for d in [d for d in grid_datasets + g.streamed_datasets + g.gpu_datasets if d in p.recipes]:
        for i, k in enumerate(g.kernels):
            out += _kernel_problems(f"grid.kernels[{i}]", k, k, model[d], d, image[d])
    for d in [d for d in s.pseudo_input.datasets if d in p.recipes]:
        k = s.pseudo_input.kernel
        out += _kernel_problems("studies.pseudo_input.kernel", k, k, model[d], d, image[d])
    for i, z in enumerate(s.convmixer.sizes):
        if z not in p.convmixer_sizes:
            out.append((f"studies.convmixer.sizes[{i}]", z,
                        f"not a key of convmixer_sizes {sorted(p.convmixer_sizes)}"))
            continue
        size = p.convmixer_sizes[z]
        if size.kernel_size % 2 == 0:
            out.append((f"convmixer_sizes.{z}.kernel_size", size.kernel_size, "must be odd (3, 5, 7, ...)"))
        out += [(f"convmixer_sizes.{z}.patch_size", size.patch_size, f"must divide {d}'s image size "
                 f"{DATASETS[d].image_size}") for d in s.convmixer.datasets if DATASETS[d].image_size % size.patch_size]
    for i, z in enumerate(s.heads_width.shapes):
        if z not in p.model_shapes:
            out.append((f"studies.heads_width.shapes[{i}]", z, f"not a key of model_shapes {sorted(p.model_shapes)}"))
            continue
        for d in [d for d in s.heads_width.datasets if d in p.recipes]:
            shaped = {**model[d], **p.model_shapes[z].model_dump(exclude_none=True)}
            out += _vit_problems(f"model_shapes.{z}", shaped, d, image[d], f" with shape {z}")
            out += [problem for name in s.heads_width.inits if (k := impulse_kernel(name)) is not None
                    for problem in _kernel_problems("studies.heads_width.inits", name, k, shaped, d, image[d],
                                                    f" with shape {z}")]
    # every study trains on data the download stage prepares, which it does for grid.datasets only
    # (dvc.yaml: download foreach grid.datasets); a study dataset outside it would have no data
    for name in [*cells.STUDIES, "regime"]:
        out += _subset(f"studies.{name}.datasets", getattr(s, name).datasets, "grid.datasets", g.datasets,
                       "only grid.datasets are downloaded and prepared (add it there too)")
    # studies that reuse the main grid's cells need those cells to exist
    plain = p.model_dump()
    main_variant, main_inits = cells.main_variant(plain), cells.main_inits(plain)
    if main_variant not in s.pseudo_input.variants:      # the "PP" row is the main grid's impulse cell
        why = (f"the study reuses the main grid's {impulse_init(s.pseudo_input.kernel)} cells "
               f"(its {main_variant} row)")
        out += _subset("studies.pseudo_input.seeds", s.pseudo_input.seeds, "grid.seeds", g.seeds, why)
        if s.pseudo_input.kernel not in g.kernels:
            out.append(("studies.pseudo_input.kernel", s.pseudo_input.kernel,
                        f"must be one of grid.kernels {g.kernels}: {why}"))
    for name, why in (("heads_width", "the study's \"recipe\" rows are the main grid's cells"),
                      ("data_size", "the study's 100 % points are the main grid's cells")):
        out += _subset(f"studies.{name}.seeds", getattr(s, name).seeds, "grid.seeds", g.seeds, why)
        out += _subset(f"studies.{name}.inits", getattr(s, name).inits, "the main grid's initializers", main_inits,
                       why)
    return out + _data_size_problems(p) + _study_contrast_problems(p, kernel_free) + _regime_problems(p, main_inits,
                                                                                                     image)


def _regime_problems(p: ParamsSchema, main_inits: list[str], image: dict) -> list[tuple[str, object, str]]:
    """When it runs (off, nothing binds it): the regime study reuses the main grid's cells (its shared seeds, its
    reused arms) and adds seeds of its own, outside grid.seeds; an arm's kernel must fit each dataset's patch grid."""
    r, g = p.studies.regime, p.grid
    if not r.datasets:
        return []
    out = [problem for d in r.datasets if d in p.recipes and d in image
           for i, arm in enumerate(r.arms) if isinstance(k := arm.options.get("kernel"), int)
           for problem in _kernel_problems(f"studies.regime.arms[{i}].options.kernel", k, k,
                                           p.recipes[d].model.model_dump(), d, image[d])]
    why = "the study reuses the main grid's cells for these"
    out += _subset("studies.regime.shared_seeds", r.shared_seeds, "grid.seeds", g.seeds, why)
    out += _subset("studies.regime.reused", r.reused, "the main grid's initializers", main_inits, why)
    if inside := sorted(set(r.own_seeds) & set(g.seeds)):
        out.append(("studies.regime.own_seeds", r.own_seeds, f"{inside} in grid.seeds: the study trains its "
                    "own seeds for every arm, so they must be outside grid.seeds (its shared_seeds reuse those)"))
    if clash := sorted({a.name for a in r.arms} & set(main_inits)):
        out.append(("studies.regime.arms", clash, "an arm's name is a main-grid initializer's or grid.variants' "
                    "(it names the cell): choose another"))
    return out


def _study_contrast_problems(p: ParamsSchema, kernel_free: list[str]) -> list:
    """Each study's planned pairs name arms of its kind. An arm the study's lists leave out is no error: the
    report says the pair was planned but not run (as the main table's contrasts)."""
    def variant(arm):
        try:
            return bool(parse_pseudo_variant(arm))
        except ValueError:
            return False
    initializer = (lambda arm: impulse_kernel(arm) is not None or arm in kernel_free,
                   f"an initializer; allowed: {kernel_free} or {IMPULSE}<k> (e.g. {impulse_init(3)})")
    kinds = {"convmixer": (lambda arm: arm in FILTER_MODES, f"a filter mode; allowed: {list(FILTER_MODES)}"),
             "pseudo_input": (variant, f"a pseudo-input variant; allowed: two of {list(PSEUDO_INPUTS)} (first "
                              "block, later blocks) and an optional 'L' (per-layer solve), e.g. 'PP', 'UU', 'PPL'"),
             "heads_width": initializer, "data_size": initializer}
    out = []
    for study, (valid, allowed) in kinds.items():
        c, where = getattr(p.studies, study).contrasts, f"studies.{study}.contrasts"
        texts = [(f"{where}.planned[{i}]", t) for i, t in enumerate(c.planned)]
        texts += [(f"{where}.equivalence[{i}].pair", e.pair) for i, e in enumerate(c.equivalence)]
        out += [(path, text, f"{arm!r} is not {allowed}") for path, text in texts
                for arm in parse_contrast(text) if not valid(arm)]
    return out


def _data_size_problems(p: ParamsSchema) -> list:
    """Each fraction of each dataset's main-grid training set must hold one batch of its recipe: the study keeps
    the batch size and matches the optimizer's steps (training/config.py)."""
    s = p.studies.data_size
    out = [(f"studies.data_size.gpu.datasets[{i}]", d, "its cells train in frozen GPU stages beside the main "
            f"grid's: list it in grid.gpu_datasets too (now {p.grid.gpu_datasets})")
           for i, d in enumerate(s.gpu.datasets) if d not in p.grid.gpu_datasets]
    for where, datasets, fractions in (("studies.data_size.fractions", s.datasets, s.fractions),
                                       ("studies.data_size.gpu.fractions", s.gpu.datasets, s.gpu.fractions)):
        for d in [d for d in datasets if d in p.recipes]:            # no recipe: reported above
            n_main, batch = subset_size(TRAIN_IMAGES[d], p.data.train_size), p.recipes[d].train.batch_size
            out += [(f"{where}[{i}]", f, f"{count} of the main grid's {n_main} {d} training images, fewer than "
                     f"one batch ({batch}); allowed: fractions >= {batch / n_main:.3g}")
                    for i, f in enumerate(fractions) if (count := subset_size(n_main, f)) < batch]
    return out


def _vit_problems(path: str, model: dict, dataset: str, image: int, context: str = "") -> list:
    """A ViT shape on `dataset`, of `image`-pixel images (context: e.g. " with shape h6", for the message)."""
    width, heads, patch, where = model["embed_dim"], model["num_heads"], model["patch_size"], dataset + context
    return ([(f"{path}.num_heads", heads, f"must divide embed_dim {width} ({where})")] if width % heads else []) + (
        [(f"{path}.embed_dim", width, f"must be a multiple of 4: the 2-D sin-cos position encoding ({where})")]
        if width % 4 else []) + (
        [(f"{path}.patch_size", patch, f"must divide {dataset}'s image size {image}")] if image % patch else [])


def _kernel_problems(path: str, value, kernel: int, model: dict, dataset: str, image: int, context: str = "") -> list:
    """`value` (at `path`) asks for a kernel x kernel impulse filter on this model and dataset."""
    try:                                            # the structured init's own check
        check_kernel(kernel, patch_grid_for(image, model["patch_size"]))
    except ValueError as e:
        return [(path, value, f"{e} ({dataset}{context}, patch {model['patch_size']})")]
    return []


def _dataset_problems(p: ParamsSchema, root) -> tuple[list, dict[str, int]]:
    """(problems, training images per dataset). Every name in grid.datasets and recipes is a built-in dataset or
    one of own_datasets; each of yours is a new name whose folder datasets/<name>/ holds what its entry declares
    (data/own.py reads headers and labels only)."""
    out, train_images = [], dict(TRAIN_IMAGES)
    for name, entry in p.own_datasets.items():
        where = f"own_datasets.{name}"
        if name in DATASETS:
            out.append((where, name, f"is a built-in dataset's name; give yours another (built-in: {list(DATASETS)})"))
            continue
        if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            out.append((where, name, "a dataset's name is lowercase letters, digits and underscores, starting "
                        "with a letter: it names stages and cells (download@<name>, <name>-trunc_normal)"))
            continue
        try:
            facts = own.scan(own.source_dir(name, root))
        except own.OwnDatasetError as e:
            out.append((where, name, str(e)))
            continue
        train_images[name] = facts.train_images
        out += [(f"{where}.{key}", getattr(entry, key), f"{own.ROOT}/{name}/ holds {getattr(facts, key)} "
                 f"({facts.layout}: {facts.image_size}x{facts.image_size} images, {facts.channels} channel(s), "
                 f"{facts.num_classes} classes)")
                for key in ("image_size", "channels", "num_classes") if getattr(entry, key) != getattr(facts, key)]
    allowed = (f"built-in {[d for d in DATASETS if d not in STREAMED]} or your own "
               f"(own_datasets: {sorted(p.own_datasets)})")
    out += [(f"grid.datasets[{i}]", d, f"unknown dataset; allowed: {allowed}")
            for i, d in enumerate(p.grid.datasets) if d not in DATASETS and d not in p.own_datasets]
    out += [(f"recipes.{d}", d, f"not a dataset; allowed: {allowed}")
            for d in p.recipes if d not in DATASETS and d not in p.own_datasets]
    return out, train_images


def _subset(path: str, values: list, of_path: str, of: list, why: str) -> list:
    extra = [v for v in values if v not in of]
    return [(path, extra, f"must be a subset of {of_path} {list(of)}: {why}")] if extra else []


# ---- entry points and pydantic's errors as lines ---------------------------------------------------------------

def validate_params(raw, root: str | Path = ".") -> dict:
    """The params dict itself when it is valid; else ParamsError (every problem, one line each). `root`: the
    project folder, which holds your own datasets' files (datasets/<name>/)."""
    if not isinstance(raw, dict):
        raise ParamsError(f"params.yaml: expected a mapping of sections, got {type(raw).__name__}")
    try:
        parsed = ParamsSchema.model_validate(raw)
    except ValidationError as e:
        raise ParamsError("\n".join(_lines(e.errors()))) from None
    if problems := _cross_field_problems(parsed, root):
        raise ParamsError("\n".join(f"params.yaml: {path} = {_short(value)}: {msg}" for path, value, msg in problems))
    return raw


def check_params_file(path: str | Path = "params.yaml") -> Params:
    """params.yaml loaded (load_params) and checked: the loaded Params, or ParamsError."""
    path = Path(path)
    return validate_params(load_params(path), path.parent)


def _lines(errors: list[dict]) -> list[str]:
    """One line per key: pydantic fails a union's branches (train_size: float or int) separately; their
    messages are joined ("a valid string or a valid integer")."""
    by_key: dict[tuple, list[dict]] = {}
    for err in errors:
        by_key.setdefault(tuple(p for p in err["loc"] if not _is_type_tag(p)), []).append(err)
    lines = []
    for loc, errs in by_key.items():
        msgs = dict.fromkeys(e["msg"].removeprefix("Input should be ") for e in errs)
        lines.append(_line(dict(errs[0], loc=loc, **({"msg": "Input should be " + " or ".join(msgs)}
                                                      if len(errs) > 1 else {}))))
    return lines


def _is_type_tag(part) -> bool:
    """pydantic's name for a union branch or validator in an error's location, not a key."""
    return isinstance(part, str) and (part in ("float", "int", "str", "bool", "none") or "[" in part)


def _line(err: dict) -> str:
    loc, value = err["loc"], err.get("input")
    path = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc).lstrip(".")
    if err["type"] == "extra_forbidden":
        return f"params.yaml: {path} = {_short(value)}: unknown key; allowed here: {_allowed_keys(loc[:-1])}"
    if err["type"] == "missing":
        return f"params.yaml: {path}: missing; this key is required"
    msg = err["msg"].removeprefix("Value error, ")
    # a section-level check that names its key ("warmup_epochs=50: must be ..."): point at the key
    named = re.fullmatch(r"(\w+)=(.+?)[:;] (.*)", msg)
    if isinstance(value, dict) and named and named[1] in value:
        path, value, msg = f"{path}.{named[1]}", value[named[1]], named[3]
    try:
        hint = f" (YAML read {value!r} as text: write it as a number, e.g. 1.0e-3 rather than 1e-3)" * (
            isinstance(value, str) and float(value) is not None)
    except ValueError:
        hint = ""
    return f"params.yaml: {path} = {_short(value)}: {msg}{hint}"


def _allowed_keys(loc: tuple) -> list[str]:
    """The keys a section at `loc` may have, walking the schema's classes (a dict's key: its values' type)."""
    model = ParamsSchema
    for part in (x for x in loc if not isinstance(x, int)):
        fields = model.model_fields if isinstance(model, type) and issubclass(model, BaseModel) else None
        model = fields[part].annotation if fields and part in fields else (typing.get_args(model) or [None])[-1]
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


def _short(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
