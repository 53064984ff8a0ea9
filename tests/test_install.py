"""The library installs and works without the pipeline (issue 33, item 5):

- pyproject.toml's core dependencies are what the library's modules import, and the
  pipeline's packages are in the `pipeline` extra, which covers everything the stages,
  the pipeline and reporting modules and the benchmarks import;
- in a process where the pipeline's packages cannot be imported (as after a plain
  `pip install .`), structinit builds a timm ViT, initializes it with every method, builds
  the pipeline's own cell model, analyses and trains a model, and imports none of them;
- the library raises exceptions and never exits the process: exiting is the stages' and the
  command-line `main()`s'.
"""
import ast
import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# import name -> distribution, for the packages only the pipeline needs
PIPELINE_ONLY = {"dvc": "dvc", "dvclive": "dvclive", "pandas": "pandas", "pydantic": "pydantic",
                 "matplotlib": "matplotlib", "sklearn": "scikit-learn", "tabulate": "tabulate", "scipy": "scipy"}
# the library proper: what `pip install .` promises to run
CORE = ["structinit/__init__.py", "structinit/config.py", "structinit/distributed.py", "structinit/errors.py",
        "structinit/io.py", "structinit/memory.py", "structinit/numerics.py", "structinit/analysis", "structinit/data",
        "structinit/init", "structinit/models", "structinit/training"]
# imported by a core module, yet in the pipeline extra: only the digits dataset's loader reads
# it (data/tensors.py, inside the function), and pyproject.toml says so
CORE_EXCEPTIONS = {"sklearn"}
PIPELINE_CODE = ["stages", "structinit/pipeline", "structinit/reporting", "structinit/evidence",
                 "structinit/records.py", "benchmarks", "tools"]


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower()


def python_files(paths):
    for rel in paths:
        path = REPO / rel
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def third_party_imports(paths) -> dict[str, set[str]]:
    """Top-level import name -> the files importing it (at module level or inside a function)."""
    local = {"structinit", "stages", "benchmarks", "tools", "scale", "tests"}
    found: dict[str, set[str]] = {}
    for path in python_files(paths):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in (n.split(".")[0] for n in names):
                if name not in sys.stdlib_module_names and name not in local and name != "__future__":
                    found.setdefault(name, set()).add(str(path.relative_to(REPO)))
    return found


def distributions(import_name: str) -> set[str]:
    """The distributions that provide an import name (PIL -> pillow, yaml -> pyyaml)."""
    return {d.lower() for d in importlib.metadata.packages_distributions().get(import_name, [import_name])}


def test_core_dependencies_leave_the_pipeline_out():
    core = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    pipeline = {requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["pipeline"]}
    assert {"torch", "timm"} <= core
    assert not core & set(PIPELINE_ONLY.values()), core & set(PIPELINE_ONLY.values())
    assert set(PIPELINE_ONLY.values()) <= pipeline
    # ./run.sh installs the pipeline with the tests, both times it installs the project
    run_sh = (REPO / "run.sh").read_text()
    installs = re.findall(r"pip\" install .*-e '\.\[([a-z,]+)\]'", run_sh)
    assert len(installs) == 2 and all({"pipeline", "test"} <= set(extras.split(",")) for extras in installs), installs


def test_every_import_is_declared_where_it_belongs():
    core = {requirement_name(r) for r in PYPROJECT["project"]["dependencies"]}
    pipeline = {requirement_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["pipeline"]}
    undeclared = {name: sorted(files) for name, files in third_party_imports(CORE).items()
                  if name not in CORE_EXCEPTIONS and not distributions(name) & core}
    assert not undeclared, f"imported by the library but not a core dependency: {undeclared}"
    pipeline_only = {name: sorted(files) for name, files in third_party_imports(CORE).items()
                     if distributions(name) & set(PIPELINE_ONLY.values()) and name not in CORE_EXCEPTIONS}
    assert not pipeline_only, pipeline_only
    # what the stages, reports and benchmarks import comes with the library or the pipeline extra
    undeclared = {name: sorted(files) for name, files in third_party_imports(PIPELINE_CODE).items()
                  if not distributions(name) & (core | pipeline)}
    assert not undeclared, f"imported by the pipeline but in neither install: {undeclared}"


LIBRARY_ONLY_SCRIPT = r"""
import json
import sys

BLOCKED = set(json.loads(sys.argv[1]))


class NotInstalled:
    # wraps each finder of sys.meta_path so that it does not see the pipeline's packages: an
    # import of one fails and importlib.util.find_spec says None, as after a plain `pip install .`
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):          # invalidate_caches, find_distributions, ...
        return getattr(self.finder, attr)


sys.meta_path[:] = [NotInstalled(f) for f in sys.meta_path]
try:
    import pandas  # noqa: F401
    raise AssertionError("the blocker let pandas through")
except ModuleNotFoundError:
    pass

import timm
import torch

import structinit as si
from structinit.data.specs import get_spec
from structinit.data.tensors import ImageData
from structinit.pipeline.build import CellModel, build_cell_model
from structinit.pipeline.cells import impulse_init

params = json.loads(sys.argv[2])
done = {}
# a ViT made with timm itself, not by structinit
for method in ("trunc_normal", "kaiming_uniform", "mimetic", "impulse"):
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16, patch_size=4, depth=2,
                              class_token=False, no_embed_class=True, global_pool="avg", num_classes=10)
    before = model.blocks[0].attn.qkv.weight.clone()
    record = si.initialize(model, method, seed=0, **({"kernel": 3} if method == "impulse" else {}))
    assert record.method == method and not torch.equal(before, model.blocks[0].attn.qkv.weight), method
    assert torch.isfinite(model(torch.randn(2, 3, 16, 16))).all(), method
    done[method] = True
# the pipeline's own model of a main-grid cell, as its training stage builds it
spec = get_spec("digits")
model, record = build_cell_model(CellModel("digits", init=impulse_init(params["init"]["kernel"])), params, spec, 0)
assert record["model"] == "vit" and record["offsets"], record
maps = si.attention_maps(model, torch.rand(2, spec.channels, spec.image_size, spec.image_size))
# a few steps of training on stand-in images
small = si.create_vit(img_size=8, patch_size=2, embed_dim=16, depth=1, num_heads=2, num_classes=10, in_chans=1)
si.initialize(small, "trunc_normal", seed=0)
g = torch.Generator().manual_seed(0)
images = lambda n: torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=g)  # noqa: E731
labels = lambda n: torch.arange(n) % 10  # noqa: E731
data = ImageData(spec, images(64), labels(64), images(20), labels(20))
history = si.train_model(small, data, si.TrainConfig(epochs=1, batch_size=32, warmup_epochs=0), device="cpu",
                         progress=False)
assert len(history) == 1
print(json.dumps({"done": sorted(done), "loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)}))
"""


def test_the_library_runs_without_the_pipeline_packages():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    run = subprocess.run([sys.executable, "-c", LIBRARY_ONLY_SCRIPT, json.dumps(sorted(PIPELINE_ONLY)),
                          json.dumps(params)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"done": ["impulse", "kaiming_uniform", "mimetic", "trunc_normal"], "loaded": []}


def _exits(node) -> bool:
    """`raise SystemExit(...)`, `sys.exit(...)`, `exit(...)`, `quit(...)`, `os._exit(...)`."""
    if isinstance(node, ast.Raise) and node.exc is not None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return isinstance(exc, ast.Name) and exc.id == "SystemExit"
    if isinstance(node, ast.Call):
        f = node.func
        return ((isinstance(f, ast.Attribute) and (f.attr, getattr(f.value, "id", None)) in
                 {("exit", "sys"), ("_exit", "os")})
                or (isinstance(f, ast.Name) and f.id in {"exit", "quit"}))
    return False


def test_the_library_raises_and_only_command_line_mains_exit():
    """Inside structinit/, a process exit is allowed only in a module's command-line `main()`
    or its `if __name__ == "__main__":` block; a library function raises (StructinitError and
    its kinds, structinit/errors.py), which a stage turns into an exit (stages/common.run_stage)."""
    offenders = []
    for path in python_files(["structinit"]):
        tree = ast.parse(path.read_text())
        allowed = set()
        for node in tree.body:
            is_main_block = (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                             and getattr(node.test.left, "id", None) == "__name__")
            if is_main_block or (isinstance(node, ast.FunctionDef) and node.name == "main"):
                allowed |= {id(n) for n in ast.walk(node)}
        offenders += [f"{path.relative_to(REPO)}:{n.lineno}" for n in ast.walk(tree)
                      if _exits(n) and id(n) not in allowed]
    assert not offenders, f"the library exits the process here (raise an exception instead): {offenders}"
