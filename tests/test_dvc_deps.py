"""dvc.yaml against the code. dvc.yaml is written by hand, its code deps listed by concern (the
stage script, the core modules, the packages whose code makes its outputs, an initializer's own file
for its own cells): every stage's deps cover every project module its script imports (a module
edit that DVC would not notice leaves stale results), a cell's initializer files are its own, and
the matrix stages' output folders are the cell names structinit/pipeline/cells.py gives (the one
home of cell names). The import closure that defines "imports" is here, read from the code."""
import ast
import functools
import importlib
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from dvc.dependency.param import ParamsDependency

import structinit
from structinit.pipeline.initializers import SHIPPED
from structinit.pipeline import cells

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("stages", "structinit", "benchmarks", "tools")


# ---- a stage script's import closure: what its deps must cover -------------------------------

def module_file(name: str) -> Path | None:
    """A project module's file (package: its __init__.py); None outside the project."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = REPO / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.exists():
            return path
    return None


@functools.cache
def lazy_exports(package: str) -> dict[str, str]:
    """A project package's PEP 562 exports, {name: defining module}: the dict literal
    `LAZY_EXPORTS` of its __init__.py (structinit, structinit.models), read without importing."""
    path = module_file(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == "LAZY_EXPORTS":
            return ast.literal_eval(node.value)
    return {}


def imported_modules(path: Path, name: str) -> set[str]:
    """Every module an `import` anywhere in the file names (function-level imports included:
    they run when the stage runs; `if TYPE_CHECKING:` blocks excluded: they never run),
    resolved to project module names, and every module that a package's lazy loader imports
    for a name imported from it (`from structinit.models import create_vit`) or, for the
    structinit package, an attribute of it (`si.get_spec`, `structinit.reporting.tables.x`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    out, package_names = set(), set()       # package_names: local names bound to structinit
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
            package_names |= {a.asname or "structinit" for a in node.names
                              if a.name == "structinit" or (a.name.startswith("structinit.") and not a.asname)}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            out.add(base)
            for alias in node.names:
                if module_file(f"{base}.{alias.name}"):                # `from pkg import module`
                    out.add(f"{base}.{alias.name}")
                elif alias.name in (lazy := lazy_exports(base)):        # a lazy export
                    out.add(lazy[alias.name])
    for node in ast.walk(tree):             # structinit.__getattr__ imports on attribute access
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in package_names:
            if node.attr in structinit.LAZY_EXPORTS:
                out.add(structinit.LAZY_EXPORTS[node.attr])
            elif module_file(f"structinit.{node.attr}"):
                out.add(f"structinit.{node.attr}")
    return out


def import_closure(module: str) -> set[str]:
    """The files (repository paths) of `module` and of every project module it imports,
    transitively, with the __init__.py of every package on the way (importing a.b runs
    a/__init__.py first)."""
    seen, todo, files = set(), [module], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]    # parent packages
        path = module_file(name)
        if path is None:
            continue
        files.add(path.relative_to(REPO).as_posix())
        todo += [m for m in imported_modules(path, name) if module_file(m)]
    return files



def resolved_stages(root: Path = REPO) -> dict:
    """Every stage of dvc.yaml as DVC resolves it (matrix expanded): name -> Stage."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        return {s.name: s for s in repo.index.stages}


@pytest.fixture(scope="module")
def stages():
    return resolved_stages()


def test_the_pipeline_reads_nothing_under_benchmarks(stages):
    """Every file a report quotes is a stage's output: no stage depends on benchmarks/ (hand-run
    measurements), and no command names it."""
    for name, stage in stages.items():
        assert not [d.def_path for d in stage.deps if str(d.def_path).startswith("benchmarks")], name
        assert "benchmarks" not in (stage.cmd or ""), name


def is_code(dep: str) -> bool:
    """A dep on project code: a .py file or a folder under stages/, structinit/, benchmarks/, tools/
    (results/evidence/<name> is data: a frozen evidence stage's output)."""
    dep = dep.rstrip("/")
    return dep.split("/")[0] in PACKAGES and (dep.endswith(".py") or "." not in Path(dep).name)


def concern(path: str) -> str:
    """The package a code path belongs to: stages, structinit (its top-level modules) or
    structinit/<package> (structinit/init/methods/x.py: structinit/init)."""
    path = path.rstrip("/")
    folder = str(Path(path).parent) if path.endswith(".py") else path
    parts = folder.split("/")
    return "/".join(parts[:2]) if parts[0] == "structinit" else parts[0]


def deps_problems(deps: list[str], needed: set[str]) -> tuple[list[str], list[str]]:
    """(missing, unused): the needed files no dep covers (a dep is a file or a folder), and the
    project-code deps outside every package the stage's code is in (a twin's script, a package's
    other modules are its concern; a package it never imports is not). Data deps are not code."""
    deps = [d.rstrip("/") for d in deps]
    missing = sorted(f for f in needed if not any(f == d or f.startswith(d + "/") for d in deps))
    concerns = {concern(f) for f in needed}
    unused = sorted(d for d in deps if is_code(d) and concern(d) not in concerns
                    and not any(f.startswith(d + "/") for f in needed))
    return missing, unused


def cell_method(init: str, params: dict | None = None) -> str:
    """A cell's initializer method: its name's, or a grid.variants entry's `init`."""
    params = params or yaml.safe_load((REPO / "params.yaml").read_text())
    own = cells.variant(params, init)
    return own["init"] if own else cells.parse_init(init)[0]


# an initializer per cell, any shipped one
STUDIES_WITH_INITS = ("study_heads_width@", "study_data_size@", "study_regime_reused@", "analyze_regime_reused@")


def needed_code(stage, params: dict | None = None) -> set[str]:
    """What a stage runs: its script's import closure and, for a cell with an initializer, that
    initializer's method file (registry.get_initializer imports init/methods/<name>.py by name,
    which no import statement shows); a study stage runs any shipped initializer (check_params
    keeps its list to them)."""
    script = re.search(r"python -m (stages\.\w+)", stage.cmd)
    assert script, f"{stage.name}: expected `python -m stages.<script>` in its cmd: {stage.cmd!r}"
    needed = import_closure(script[1])
    if stage.name == "check_params":      # the schema loads every method file to list them
        methods = [p.stem for p in (REPO / "structinit/init/methods").glob("*.py") if p.stem != "__init__"]
    elif stage.name.startswith(STUDIES_WITH_INITS):
        methods = SHIPPED
    elif init := re.search(r"--init (\S+)", stage.cmd):
        methods = [cell_method(init[1], params)]
    else:
        methods = []
    for method in methods:
        needed |= import_closure(f"structinit.init.methods.{method}")
    return needed


def test_every_stage_depends_on_the_code_its_script_imports_and_only_its_concerns(stages):
    problems = []
    for name, stage in stages.items():
        missing, unused = deps_problems([d.def_path for d in stage.deps], needed_code(stage))
        if missing:
            problems.append(f"{name}: add to deps {missing}")
        if unused:
            problems.append(f"{name}: its script never imports {unused}: drop them from deps")
    assert not problems, "\n".join(problems)


def test_a_cell_depends_on_its_own_initializer_file_and_no_other(stages):
    # what makes adding or editing an initializer retrain its cells alone (test_edit_reruns.py
    # shows it end to end): no training or analysis stage takes the methods folder whole
    methods = "structinit/init/methods"
    for name, stage in stages.items():
        deps = {d.def_path.rstrip("/") for d in stage.deps}
        own = {d for d in deps if d.startswith(methods + "/") and d != methods + "/__init__.py"}
        if name == "check_params":          # all of structinit: its output never changes
            assert "structinit" in deps
            continue
        assert methods not in deps, name
        init = re.search(r"--init (\S+)", stage.cmd)
        if name.startswith(STUDIES_WITH_INITS):
            assert own == {f"{methods}/{m}.py" for m in SHIPPED}, name
        elif init:
            assert own == {f"{methods}/{cell_method(init[1])}.py"}, name
        else:
            assert not own, name


def test_the_closure_sees_function_level_imports_and_leaves_out_what_training_never_runs():
    # pipeline/build.py imports the ConvMixer inside a function: it must be in the training
    # stage's closure, or the test above could pass on an incomplete deps list; and the
    # training script imports no schema, no report and no streamed-dataset code, so editing
    # them retrains nothing (tests/test_edit_reruns.py runs that end to end)
    closure = import_closure("stages.train")
    assert {"structinit/data/tensors.py", "structinit/models/convmixer.py", "structinit/__init__.py",
            "stages/__init__.py", "structinit/init/impulse.py", "structinit/init/registry.py"} <= closure
    assert not {f for f in closure if f.startswith("structinit/init/methods/")}   # loaded by name
    never = {"structinit/pipeline/params.py", "structinit/data/imagenet.py", "structinit/training/streamed.py",
             "structinit/reporting/tables.py", "structinit/reporting/presentation.py", "scale/fanout.py"}
    assert not never & closure
    assert {"structinit/data/imagenet.py", "structinit/training/streamed.py"} <= import_closure("stages.train_streamed")


def test_deps_problems_reports_a_removed_module_and_an_extra_one(stages):
    # the check above can fail: a dep dropped from a real stage is missing, another package's
    # module or folder is unused; a module of a package the stage imports is its concern
    stage = stages["train_baseline@digits-trunc_normal"]
    deps, needed = [d.def_path for d in stage.deps], needed_code(stage)
    assert deps_problems(deps, needed) == ([], [])
    assert deps_problems([d for d in deps if d != "structinit/io.py"], needed) == (["structinit/io.py"], [])
    gone = [d for d in deps if d != "structinit/models"]                        # a folder dep
    assert deps_problems(gone, needed)[0] == sorted(f for f in needed if f.startswith("structinit/models/"))
    extra = "structinit/reporting/tables.py"
    assert deps_problems(deps + [extra, "results/train"], needed) == ([], [extra])
    assert deps_problems(deps + ["structinit/analysis"], needed) == ([], ["structinit/analysis"])   # a folder dep
    assert deps_problems(deps + ["stages/curves.py", "structinit/records.py"], needed) == ([], [])


def test_the_closure_sees_structinit_attribute_access(tmp_path):
    # structinit.__getattr__ imports a submodule or a lazy export's module on attribute access:
    # no `import` statement names it, so the closure must read the attribute chains
    script = tmp_path / "script.py"
    script.write_text("import structinit as si\nimport structinit.pipeline.params\n"
                      "si.reporting\nsi.get_spec('digits')\nstructinit.analysis\nsi.no_such_name\n")
    assert imported_modules(script, "stages.script") == {
        "structinit", "structinit.pipeline.params", "structinit.reporting", "structinit.data.specs",
        "structinit.analysis"}


def test_every_lazy_package_declares_what_it_loads():
    # imported_modules reads a package's LAZY_EXPORTS literal: a package whose __getattr__ loads
    # names without one (or with one that disagrees with what it loads) would hide imports from it
    lazy = {p.relative_to(REPO).parent.as_posix().replace("/", ".") for pkg in PACKAGES
            for p in (REPO / pkg).rglob("__init__.py")
            if any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in ast.parse(p.read_text()).body)}
    assert lazy == {"structinit", "structinit.models"}
    for package in lazy:
        declared = lazy_exports(package)
        module = importlib.import_module(package)
        assert declared and declared == module.LAZY_EXPORTS, package
        for name, where in declared.items():
            assert getattr(module, name) is getattr(importlib.import_module(where), name), (package, name)


def test_a_name_from_a_lazy_package_is_a_dependency_on_its_module(tmp_path):
    f = tmp_path / "user.py"
    f.write_text("from structinit.models import create_convmixer\nimport structinit as si\nsi.create_vit\n")
    got = imported_modules(f, "user")
    assert {"structinit.models.convmixer", "structinit.models.vit"} <= got


def test_reference_solve_params_are_the_solve_options_it_reads(stages):
    # a solve.* option it reads but does not declare would leave stale records; one it declares
    # but ignores would re-run the 10,000-step solve for nothing
    from stages.reference_solve import SHARED_WITH_PREOPTIMIZE

    ref = {name: s for name, s in stages.items() if name.startswith("reference_solve@")}
    assert ref
    for name, stage in ref.items():
        keys = {k for d in stage.deps if isinstance(d, ParamsDependency) for k in d.params}
        declared = {k for k in keys if k == "solve" or k.startswith("solve.")}
        assert declared == {f"solve.{k}" for k in SHARED_WITH_PREOPTIMIZE}, name


def test_matrix_stages_write_the_cells_that_cells_py_names(stages):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    outs = {o.def_path for s in stages.values() for o in s.outs}
    for dataset, init in {(d, i) for d, i, _ in cells.main_runs(params)}:
        cell = cells.main_cell(dataset, init)
        for folder in ("results/train", "models", "artifacts/analysis"):   # train_* and analyze_* outs
            assert f"{folder}/{cell}" in outs, (folder, dataset, init)
    for dataset, kernel in ((d, k) for d in params["grid"]["datasets"] for k in params["grid"]["kernels"]):
        assert f"preoptimize@{cells.solve_cell(dataset, kernel)}" in stages
        assert f"artifacts/preopt/{cells.solve_cell(dataset, kernel)}" in outs
    for study in cells.STUDIES:
        own = {r.folder.as_posix() for r in cells.study_runs(params, study, "results/train", "results/studies")
               if r.folder.parts[1] == "studies"}
        assert own <= outs, (study, sorted(own - outs))
        assert bool(own) == bool(params["studies"][study]["datasets"]), study   # off: no cells


def test_no_cached_output_is_tracked_by_git(stages):
    """A cached output (models, solves) lives in DVC's cache, never in git: a checkpoint
    committed to git goes stale on the next run and bloats every clone (models/digits-mimetic_qk
    once was). Outputs with cache: false (results/train/*) are git's by design."""
    import subprocess

    cached = sorted({o.def_path for s in stages.values() for o in s.outs if o.use_cache})
    tracked = subprocess.run(["git", "ls-files", "--", *cached], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert cached and tracked == [], f"DVC-cached outputs tracked by git: {tracked} (git rm --cached them)"


def test_a_variant_cell_depends_on_its_initializer_file_and_its_options_are_in_its_command(tmp_path):
    # grid.variants (a list of dicts: DVC numbers the matrix keys) in a copy of dvc.yaml
    from dvc.repo import Repo

    Repo.init(str(tmp_path), no_scm=True)
    (tmp_path / "dvc.yaml").write_text((REPO / "dvc.yaml").read_text())
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["grid"]["variants"] = [{"name": "mimetic_a05", "init": "mimetic", "options": {"alpha": 0.5}},
                                  {"name": "imp3_m30", "init": "impulse", "options": {"kernel": 3, "target_mass": 0.3}}]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stages = resolved_stages(tmp_path)
    train = stages["train_variant@digits-variant0"]
    assert train.cmd.endswith("--options --alpha 0.5")      # a new value changes the command: a rerun
    assert "results/train/digits-mimetic_a05" in {o.def_path for o in train.outs}
    assert stages["analyze_variant@digits-variant1"].cmd.endswith("--kernel 3 --target_mass 0.3")
    assert cells.main_stage("train", "digits", "imp3_m30", params) == "train_variant@digits-variant1"
    for name in ("train_variant@digits-variant0", "analyze_variant@digits-variant1"):
        stage = stages[name]
        assert deps_problems([d.def_path for d in stage.deps], needed_code(stage, params)) == ([], []), name
    own = {d.def_path for d in stages["train_variant@digits-variant1"].deps if "/methods/" in d.def_path}
    assert own == {"structinit/init/methods/__init__.py", "structinit/init/methods/impulse.py"}


def test_the_gpu_datasets_stages_are_frozen_and_a_gpu_run_alone_unfreezes_them():
    from tools.fashion_mnist import unfrozen_gpu

    text = (REPO / "dvc.yaml").read_text()
    stages = yaml.safe_load(text)["stages"]
    gpu = {name for name in stages if name.startswith("train_gpu_") or name.endswith("_gpu")}
    assert gpu == {"train_gpu_baseline", "train_gpu_impulse", "study_data_size_gpu", "analyze_gpu"}
    assert all(stages[name]["frozen"] is True for name in gpu)
    unfrozen = yaml.safe_load(unfrozen_gpu(text))["stages"]
    assert all(unfrozen[name]["frozen"] is False for name in gpu)
    # nothing else changes: the evidence stages stay frozen, the rest as they were
    assert {n: s for n, s in unfrozen.items() if n not in gpu} == {n: s for n, s in stages.items() if n not in gpu}
    # their deps are their code alone (a frozen stage's deps must exist in a fresh clone)
    for name in gpu:
        assert all(not str(d).startswith(("data/", "artifacts/", "results/")) for d in stages[name]["deps"]), name


def test_the_attention_report_depends_on_the_gpu_analyses_folder_which_a_fresh_clone_has(stages):
    """A dependency DVC cannot find fails its stage, so the folder of the GPU datasets' analyses
    (analyze_gpu's outputs, committed) is in git before any GPU dataset is analysed, holding an
    empty .gitkeep; once one is, its file changes the folder's hash and the report re-runs."""
    deps = {d.def_path for d in stages["attention_report"].deps}
    assert "results/analysis_gpu" in deps
    tracked = subprocess.run(["git", "ls-files", "results/analysis_gpu"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert "results/analysis_gpu/.gitkeep" in tracked
    assert all(f.endswith((".pt", "/.gitkeep")) for f in tracked), tracked
    assert (REPO / "results/analysis_gpu/.gitkeep").read_bytes() == b""


def test_no_stage_depends_on_a_hand_written_file(stages):
    """Every file a stage reads is code, data, params or some command's output: no README, nor
    a folder that holds only one. datasets/<name>/ is where a user's own files go (download
    reads them), so it is data, even while a built-in's holds only its README."""
    def hand_written(path: Path) -> bool:
        files = [f for f in path.rglob("*") if f.is_file()] if path.is_dir() else [path]
        return bool(files) and all(f.suffix == ".md" for f in files)
    outs = {o.def_path for s in stages.values() for o in s.outs}
    deps = {d.def_path for s in stages.values() for d in s.deps if not isinstance(d, ParamsDependency)}
    made = {d for d in deps if any(d == o or d.startswith(f"{o}/") for o in outs)}
    assert not [d for d in deps - made if not d.startswith("datasets/") and ("README" in d or hand_written(REPO / d))]
