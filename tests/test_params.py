"""params.yaml's schema: every rule refuses its bad value with one line naming the key, the
value and what is allowed; the stages refuse a bad file before importing torch."""
import copy
import dataclasses
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from structinit.config import IMPULSE_SOLVE_OPTIONS
from structinit.training.config import TrainConfig
from structinit.init.impulse import solve_impulse_qk
from structinit.init.solvers import SOLVERS
from structinit.pipeline.load import load_params
from structinit.pipeline.params import Adam, ClosedForm, ParamsError, Solve, Train, validate_params

REPO = Path(__file__).resolve().parents[1]
DEFAULT = yaml.safe_load((REPO / "params.yaml").read_text())


def _set(dotted: str, value):
    def mutate(p):
        *path, last = dotted.split(".")
        for key in path:
            p = p[int(key)] if isinstance(p, list) else p[key]
        p[last] = value
    return mutate


def _all(*mutations):
    """Several edits at once (a study's size rules apply only when the study is on)."""
    def mutate(p):
        for m in mutations:
            m(p)
    return mutate


_DATA_SIZE_ON = _set("studies.data_size.datasets", ["digits"])


def _drop(dotted: str):
    def mutate(p):
        *path, last = dotted.split(".")
        for key in path:
            p = p[key]
        del p[last]
    return mutate


# (id, mutation of the default params, fragments the one-line error must contain)
BAD = [
    ("unknown top-level key", _set("trian", {}), ["trian = {}: unknown key", "grid"]),
    ("misspelt train key", _set("recipes.digits.train.epoch", 40), ["recipes.digits.train.epoch = 40: unknown key", "epochs"]),
    ("unknown solver option", _set("solve.adam.stepz", 3), ["solve.adam.stepz = 3: unknown key", "steps"]),
    ("missing section", _drop("studies"), ["studies: missing"]),
    ("missing key", _drop("grid.seeds"), ["grid.seeds: missing"]),
    ("text for a number", _set("recipes.digits.train.lr", "fast"), ["recipes.digits.train.lr = 'fast'", "number"]),
    ("YAML's 1e-3 is text", _set("recipes.digits.train.lr", "1e-3"), ["recipes.digits.train.lr = '1e-3'", "1.0e-3"]),
    ("bool for an int", _set("recipes.digits.train.epochs", True), ["recipes.digits.train.epochs = True", "integer"]),
    ("negative lr", _set("recipes.digits.train.lr", -0.1), ["recipes.digits.train.lr = -0.1", "> 0"]),
    ("warm-up past the end", _set("recipes.digits.train.warmup_epochs", 500), ["warmup_epochs = 500", "between 0 and epochs"]),
    ("label smoothing 1", _set("recipes.digits.train.label_smoothing", 1.0), ["label_smoothing = 1.0", "[0, 1)"]),
    ("unknown amp", _set("recipes.digits.train.amp", "fp8"), ["amp = 'fp8'", "'bf16'"]),
    ("bad randaugment", _set("recipes.digits.train.randaugment", "rand-q9"), ["randaugment = 'rand-q9'", "known keys"]),
    ("cpu_chunks 0", _set("recipes.digits.train.cpu_chunks", 0), ["cpu_chunks = 0", "positive integer"]),
    ("zero epochs", _set("recipes.digits.train.epochs", 0), ["epochs = 0", ">= 1"]),
    ("unknown dataset", _set("grid.datasets", ["digits", "mnist"]), ["grid.datasets[1] = 'mnist'", "'cifar10'"]),
    ("recipe for an unknown dataset", _set("recipes.mnist", DEFAULT["recipes"]["digits"]), ["recipes.mnist", "'digits'"]),
    ("impulse as a baseline", _set("grid.baselines", ["impulse"]), ["grid.baselines[0] = 'impulse'", "'mimetic'"]),
    ("unknown solver", _set("solve.solver", "sgd"), ["solve.solver = 'sgd'", "'closed_form'"]),
    ("unknown offset order", _set("solve.offset_order", "spiral"), ["solve.offset_order = 'spiral'", "'random'"]),
    ("unknown pseudo-input", _set("solve.pseudo_input", "Z"), ["solve.pseudo_input = 'Z'", "'P'"]),
    ("softness out of range", _set("solve.closed_form.target_mass", 1.5), ["target_mass = 1.5", "less than 1"]),
    ("seed twice", _set("grid.seeds", [0, 1, 1]), ["grid.seeds", "[1] listed twice"]),
    ("no seeds", _set("grid.seeds", []), ["grid.seeds = []", "at least 1"]),
    ("negative seed", _set("grid.seeds", [-1]), ["grid.seeds[0] = -1", "greater than or equal to 0"]),
    ("train_size 0", _set("data.train_size", 0), ["data.train_size = 0", "fraction in (0, 1]"]),
    ("train_size 1.5", _set("data.train_size", 1.5), ["data.train_size = 1.5", "fraction in (0, 1]"]),
    ("train_size as text", _set("data.train_size", "1e-1"), ["data.train_size = '1e-1'", "1.0e-3"]),
    ("train_size below one image per class", _set("data.train_size", 5), ["data.train_size = 5", "10 classes"]),
    ("cpu_chunks neither text nor integer", _set("recipes.digits.train.cpu_chunks", 2.5),
     ["recipes.digits.train.cpu_chunks = 2.5", "a valid string or a valid integer"]),
    ("init.kernel outside grid.kernels", _set("init.kernel", 7), ["init.kernel = 7", "grid.kernels [3, 5]"]),
    ("speed endpoint at no fraction of the budget", _set("contrasts.speed.fraction", 0),
     ["contrasts.speed.fraction = 0", "greater than 0"]),
    ("speed endpoint past the budget", _set("contrasts.speed.fraction", 1.5),
     ["contrasts.speed.fraction = 1.5", "less than or equal to 1"]),
    ("main contrast names the bare structured init", _set("contrasts.primary", "impulse vs trunc_normal"),
     ["contrasts.primary", "'impulse' is not an initializer", "impulse<k>"]),
    ("main contrast names an arm the grid lacks", _set("contrasts.secondary", ["xavier vs trunc_normal"]),
     ["contrasts.secondary[0]", "'xavier' is not an initializer"]),
    ("speed endpoint pair malformed", _set("contrasts.speed.primary", "ours versus trunc_normal"),
     ["contrasts.speed.primary", "'<arm> vs <arm>'"]),
    ("even kernel", _set("grid.kernels", [3, 4]), ["grid.kernels[1] = 4", "odd"]),
    ("kernel larger than the patch grid", _set("grid.kernels", [3, 9]), ["grid.kernels[1] = 9", "8x8 patch grid", "up to 7"]),
    ("kernel that fits no longer after a patch change",
     _set("recipes.digits.model.patch_size", 2), ["grid.kernels[1] = 5", "4x4 patch grid"]),
    ("patch size not dividing the image", _set("recipes.digits.model.patch_size", 3), ["recipes.digits.model.patch_size = 3", "image size 8"]),
    ("heads not dividing width", _set("recipes.digits.model.num_heads", 5), ["recipes.digits.model.num_heads = 5", "divide embed_dim 48"]),
    ("width not a multiple of 4", _all(_set("recipes.digits.model.embed_dim", 54), _set("recipes.digits.model.num_heads", 3)),
     ["recipes.digits.model.embed_dim = 54", "multiple of 4"]),
    ("a study shape's heads not dividing width",   # checked where the study runs: switch it on
     _all(_set("studies.heads_width.datasets", ["digits"]), _set("model_shapes.h6.num_heads", 5)),
     ["model_shapes.h6.num_heads = 5", "digits with shape h6"]),
    ("dataset without a recipe", _drop("recipes.digits"), ["grid.datasets = 'digits'", "has no recipe"]),
    ("study's pseudo-input kernel too big", _all(_set("studies.pseudo_input.datasets", ["digits"]),
                                                  _set("studies.pseudo_input.kernel", 9), _set("grid.kernels", [3, 5])),
     ["studies.pseudo_input.kernel = 9", "8x8 patch grid"]),
    ("bad pseudo-input variant", _set("studies.pseudo_input.variants", ["UU", "XQ"]), ["studies.pseudo_input.variants", "'XQ'", "e.g. 'UP'"]),
    ("pseudo-input study seeds not in the grid", _set("studies.pseudo_input.seeds", [0, 7]),
     ["studies.pseudo_input.seeds = [7]", "subset of grid.seeds", "reuses the main grid"]),
    ("pseudo-input study kernel not in the grid", _all(_set("studies.pseudo_input.kernel", 7), _set("grid.kernels", [3, 5])),
     ["studies.pseudo_input.kernel = 7", "grid.kernels"]),
    ("heads/width study seeds not in the grid", _set("studies.heads_width.seeds", [9]), ["studies.heads_width.seeds = [9]", "subset of grid.seeds"]),
    ("heads/width study dataset not in the grid", _set("studies.heads_width.datasets", ["cifar10"]),
     ["studies.heads_width.datasets = ['cifar10']", "subset of grid.datasets"]),
    ("heads/width init not an initializer", _set("studies.heads_width.inits", ["xavier"]), ["studies.heads_width.inits", "'xavier'", "impulse<k>"]),
    ("heads/width init not in the main grid", _set("studies.heads_width.inits", ["impulse7"]),
     ["studies.heads_width.inits = ['impulse7']", "main grid's initializers"]),
    ("data-size study seeds not in the grid", _set("studies.data_size.seeds", [0, 9]),
     ["studies.data_size.seeds = [9]", "subset of grid.seeds", "100 % points are the main grid's cells"]),
    ("data-size study dataset not in the grid", _set("studies.data_size.datasets", ["svhn"]),
     ["studies.data_size.datasets = ['svhn']", "subset of grid.datasets"]),
    # every study's data comes from download, which prepares grid.datasets only (the paper-size
    # ConvMixer command once named cifar10 for the study alone: nothing prepared its data)
    ("ConvMixer study dataset not in the grid", _set("studies.convmixer.datasets", ["cifar10"]),
     ["studies.convmixer.datasets = ['cifar10']", "subset of grid.datasets", "only grid.datasets are downloaded"]),
    ("pseudo-input study dataset not in the grid, its main variant run by the study itself",
     _all(_set("studies.pseudo_input.variants", ["PP", "UU"]), _set("studies.pseudo_input.datasets", ["svhn"])),
     ["studies.pseudo_input.datasets = ['svhn']", "only grid.datasets are downloaded"]),
    ("data-size init not an initializer", _set("studies.data_size.inits", ["xavier"]), ["studies.data_size.inits", "'xavier'", "impulse<k>"]),
    ("data-size init not in the main grid", _set("studies.data_size.inits", ["trunc_normal", "impulse7"]),
     ["studies.data_size.inits = ['impulse7']", "main grid's initializers"]),
    ("data-size fraction 1 (the main grid's cell)", _set("studies.data_size.fractions", [0.1, 1.0]),
     ["studies.data_size.fractions[1] = 1.0", "less than 1"]),
    ("data-size fraction 0", _set("studies.data_size.fractions", [0.0]), ["studies.data_size.fractions[0] = 0.0", "greater than 0"]),
    ("data-size fraction twice", _set("studies.data_size.fractions", [0.1, 0.1]), ["studies.data_size.fractions", "[0.1] listed twice"]),
    ("data-size fraction as text", _set("studies.data_size.fractions", ["1e-1"]), ["studies.data_size.fractions[0] = '1e-1'", "1.0e-3"]),
    ("data-size fraction below one batch", _all(_DATA_SIZE_ON, _set("studies.data_size.fractions", [0.04])),
     ["studies.data_size.fractions[0] = 0.04", "57 of the main grid's 1437 digits training images", "one batch (64)"]),
    ("data-size fraction below one batch of a smaller main grid",
     _all(_DATA_SIZE_ON, _set("studies.data_size.fractions", [0.1]), _set("data.train_size", 300)),
     ["studies.data_size.fractions[0] = 0.1", "30 of the main grid's 300 digits", "fractions >= 0.213"]),
    ("unknown ConvMixer size", _set("studies.convmixer.sizes", ["cm1"]), ["studies.convmixer.sizes[0] = 'cm1'", "cm64d4k3"]),
    ("even ConvMixer kernel", _set("convmixer_sizes.cm64d4k3.kernel_size", 4), ["convmixer_sizes.cm64d4k3.kernel_size = 4", "odd"]),
    ("unknown filter mode", _set("studies.convmixer.modes", ["learned", "gabor"]), ["studies.convmixer.modes[1] = 'gabor'", "'box'"]),
    ("unknown model shape", _set("studies.heads_width.shapes", ["h7"]), ["studies.heads_width.shapes[0] = 'h7'", "model_shapes"]),
    # the regime study's rules across keys hold when it runs (datasets set): off, it binds nothing
    ("regime own seed in grid", lambda p: (_set("studies.regime.datasets", ["digits"])(p),
                                           _set("studies.regime.shared_seeds", [0, 1])(p),
                                           _set("studies.regime.own_seeds", [4, 5])(p)),
     ["studies.regime.own_seeds", "[4] in grid.seeds"]),
    ("regime shared seed not in grid", lambda p: (_set("studies.regime.datasets", ["digits"])(p),
                                                  _set("studies.regime.shared_seeds", [0, 11])(p)),
     ["studies.regime.shared_seeds = [11]", "grid.seeds"]),
    ("regime seed in both lists", _set("studies.regime.shared_seeds", [0, 5]), ["studies.regime", "[5] in both"]),
    ("regime unknown arm in a contrast", _set("studies.regime.contrasts.primary", "imp3_m090 vs trunc_normal"),
     ["studies.regime", "'imp3_m090'", "imp3_m030"]),
    ("regime reused arm not in the grid", lambda p: (_set("studies.regime.datasets", ["digits"])(p),
                                                     _set("studies.regime.reused", ["trunc_normal", "impulse3",
                                                                                    "impulse7"])(p)),
     ["studies.regime.reused = ['impulse7']", "main grid's initializers"]),
    ("regime arm's kernel larger than the grid", lambda p: (
        _set("studies.regime.datasets", ["digits"])(p),
        _set("studies.regime.arms", [{"name": "imp3_m030", "init": "impulse", "options": {"kernel": 9, "target_mass": 0.3}},
                                     {"name": "imp3_m060", "init": "impulse", "options": {"kernel": 3}}])(p)),
     ["studies.regime.arms[0].options.kernel = 9", "digits"]),
    ("regime dataset not in grid", _set("studies.regime.datasets", ["svhn"]), ["studies.regime.datasets", "grid.datasets"]),
    ("regime arm without its kernel", _set("studies.regime.arms", [{"name": "imp_m5", "init": "impulse",
                                                                     "options": {"target_mass": 0.5}}]),
     ["studies.regime.arms", "options.kernel"]),
]


@pytest.mark.parametrize("mutate, fragments", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_each_rule_refuses_its_bad_value_in_one_line(mutate, fragments):
    params = copy.deepcopy(DEFAULT)
    mutate(params)
    with pytest.raises(ParamsError) as e:
        validate_params(params)
    lines = str(e.value).splitlines()
    hit = [line for line in lines if all(f in line for f in fragments)]
    assert hit, f"no line has all of {fragments}:\n{e.value}"
    assert all(line.startswith("params.yaml: ") for line in lines)


def test_the_default_and_a_reused_main_variant_are_valid():
    assert validate_params(copy.deepcopy(DEFAULT)) == DEFAULT
    # the regime study is off: more main-grid seeds may reach its own (5-9) without a refusal
    p = copy.deepcopy(DEFAULT)
    p["grid"]["seeds"] = [0, 1, 2, 3, 4, 5]
    validate_params(p)
    p["studies"]["regime"]["datasets"] = ["digits"]
    with pytest.raises(ParamsError, match=r"studies.regime.own_seeds .*\[5\] in grid.seeds"):
        validate_params(p)
    # a pseudo-input study that trains its own PP cell reuses nothing: its seeds are free
    p = copy.deepcopy(DEFAULT)
    p["studies"]["pseudo_input"]["variants"] = ["PP", "UU"]
    p["studies"]["pseudo_input"]["seeds"] = [0, 7]
    validate_params(p)


def test_a_variant_is_an_arm_of_the_main_contrasts():
    p = copy.deepcopy(DEFAULT)
    p["contrasts"]["secondary"] = ["mimetic_a05 vs mimetic"]
    with pytest.raises(ParamsError, match=r"'mimetic_a05' is not an initializer"):
        validate_params(p)
    p["grid"]["variants"] = [{"name": "mimetic_a05", "init": "mimetic", "options": {"alpha": 0.5}}]
    validate_params(p)


def test_every_problem_is_listed():
    p = copy.deepcopy(DEFAULT)
    _set("recipes.digits.train.lr", "fast")(p)
    _set("grid.seeds", [0, 0])(p)
    with pytest.raises(ParamsError) as e:
        validate_params(p)
    assert len(str(e.value).splitlines()) == 2


def test_yaml_syntax_error_names_the_line(tmp_path):
    (tmp_path / "params.yaml").write_text("grid:\n  seeds: [0, 1\ninit: {}\n")
    with pytest.raises(ParamsError, match=r"params.yaml: line \d+: not valid YAML"):
        load_params(tmp_path / "params.yaml")


def test_schema_agrees_with_the_code_it_describes():
    """The train section is TrainConfig (less its seed); the solver sections are the solvers'
    keyword options with their defaults."""
    fields = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.name != "seed"}
    assert {k: f.default for k, f in Train.model_fields.items()} == fields
    for section, solver in ((ClosedForm, "closed_form"), (Adam, "adam")):
        options = {p.name: p.default for p in inspect.signature(SOLVERS[solver]).parameters.values()
                   if p.kind is p.KEYWORD_ONLY and p.name not in ("head_dim", "scale", "generator")}
        # in the signature's order too: a variant's "allowed" list comes from here (params._initializer_options)
        assert list({k: f.default for k, f in section.model_fields.items()}.items()) == list(options.items()), solver
    # the `solve` section: IMPULSE_SOLVE_OPTIONS (what stages pass on) plus one section per
    # solver, and every one of them a keyword of solve_impulse_qk
    assert set(Solve.model_fields) == set(IMPULSE_SOLVE_OPTIONS) | set(SOLVERS)
    keywords = {p.name for p in inspect.signature(solve_impulse_qk).parameters.values() if p.kind is p.KEYWORD_ONLY}
    assert set(IMPULSE_SOLVE_OPTIONS) <= keywords


def _write_params(dirpath: Path, params: dict) -> None:
    (dirpath / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


# One bad file of each kind for the stage itself (a process each, ~4 s): how the stage refuses
# is one code path whichever rule fires, and every rule's own line is checked in-process above
# (test_each_rule_refuses_its_bad_value_in_one_line, all of BAD).
STAGE_CASES = ["unknown top-level key", "text for a number", "unknown dataset", "kernel larger than the patch grid",
               "heads/width study dataset not in the grid", "data-size fraction twice"]


def test_check_params_refuses_a_bad_file_of_each_kind_in_one_line_per_problem(tmp_path):
    """What `dvc repro` runs first: the check_params stage, in a folder whose params.yaml has one
    bad value. Each is refused with status 1, one line per problem, no traceback, and nothing
    written (the stage every other stage depends on never produces its output)."""
    # the repo first, and whatever PYTHONPATH already holds (where dependencies may come from)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    cases = [b for b in BAD if b[0] in STAGE_CASES]
    assert len(cases) == len(STAGE_CASES)
    for name, mutate, fragments in cases:
        params = copy.deepcopy(DEFAULT)
        mutate(params)
        _write_params(tmp_path, params)
        r = subprocess.run([sys.executable, "-m", "stages.check_params", "--out", "checked"], cwd=tmp_path, env=env,
                           capture_output=True, text=True)
        assert r.returncode == 1, (name, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr and not (tmp_path / "checked").exists(), (name, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert lines[0].startswith("error: params.yaml: ") and all(l.startswith("params.yaml: ") for l in lines[1:])
        assert any(all(f in line for f in fragments) for line in lines), (name, r.stderr)


def test_the_schema_reads_each_initializer_as_the_registry_loads_it():
    """check_params reads the method files' registrations without importing them
    (pipeline/initializers.py); every file reads there as the registry loads it: name,
    takes_kernel, and the options a variant may set, for each solver of the structured init."""
    from structinit.init.registry import allowed_options, get_initializer, method_names as registry_names
    from structinit.pipeline import initializers
    from structinit.pipeline.params import _initializer_options, _kernel_free_initializers

    assert initializers.method_names() == registry_names()
    assert set(initializers.SHIPPED) <= set(registry_names())
    for name in initializers.method_names():
        found, init = initializers.declared(name), get_initializer(name)
        assert found is not None and (found.name, found.takes_kernel) == (name, init.takes_kernel), name
        if not callable(init.options):
            assert found.options == init.options, name
        for options in ({}, *({"solver": s} for s in SOLVERS)):
            assert _initializer_options(name, options) == (init.takes_kernel, list(allowed_options(init, options)))
    assert _kernel_free_initializers() == sorted(n for n in registry_names() if not get_initializer(n).takes_kernel)
    with pytest.raises(ValueError, match="unknown solver 'sgd'"):
        _initializer_options("impulse", {"solver": "sgd"})
    with pytest.raises(ValueError, match="unknown solver 'sgd'"):
        allowed_options(get_initializer("impulse"), {"solver": "sgd"})


def test_variants_are_checked_against_their_initializers_options():
    p = copy.deepcopy(DEFAULT)
    p["grid"]["variants"] = [{"name": "mimetic_a05", "init": "mimetic", "options": {"alpha": 0.5}},
                             {"name": "imp_adam", "init": "impulse", "options": {"kernel": 3, "solver": "adam",
                                                                                  "steps": 10}}]
    validate_params(p, REPO)
    for variant, fragment in (({"name": "m2", "init": "mimetic", "options": {"gamma": 1}}, "unknown option(s) ['gamma']"),
                              ({"name": "i2", "init": "impulse", "options": {"kernel": 3, "steps": 5}},
                               "unknown option(s) ['steps']"),              # the closed form's options
                              ({"name": "i3", "init": "impulse", "options": {"target_mass": 0.3}},
                               "needs options.kernel"),
                              ({"name": "i4", "init": "impulse", "options": {"kernel": 3, "solver": "sgd"}},
                               "unknown solver 'sgd'"),
                              ({"name": "x1", "init": "nope", "options": {"a": 1}}, "is not an initializer")):
        p["grid"]["variants"] = [variant]
        with pytest.raises(ParamsError, match=re.escape(fragment)):
            validate_params(p, REPO)


def test_check_params_imports_neither_torch_nor_timm():
    """The first stage of every `dvc repro` is a second's work: the schema reads initializer
    names from their files."""
    code = ("import sys; from structinit.pipeline.params import check_params_file; check_params_file(); "
            "print(sorted(m for m in ('torch', 'timm', 'torchvision') if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
