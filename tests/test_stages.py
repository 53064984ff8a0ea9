"""Stage scripts: what DVC must know about them, and what they hand the trainer."""
import ast
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml

from stages.common import load_params, recipe
from stages.train import build, cell_fingerprint

REPO = Path(__file__).resolve().parents[1]


def _local_imports(path: Path) -> set[str]:
    """Modules of this repo (stages.*, structinit.*) a script imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] in ("stages", "structinit")}


def _module_file(module: str) -> Path | None:
    p = REPO / module.replace(".", "/")
    if p.with_suffix(".py").exists():
        return p.with_suffix(".py")
    if (p / "__init__.py").exists():
        return p / "__init__.py"
    return None                                           # a name inside a module, not a module


def test_every_stage_depends_on_the_code_it_imports():
    """A stage's deps cover its script, every repo module the script imports, and what the
    stages.* modules it uses import in turn (preoptimize read structinit/data.py and the
    report stages stages/common.py without declaring them)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    problems = []
    for name, stage in stages.items():
        spec = stage.get("do", stage)
        script = spec["cmd"].split("python -m ")[1].split()[0]
        scripts = [REPO / (script.replace(".", "/") + ".py")]
        modules = _local_imports(scripts[0])
        for m in list(modules):
            if m.startswith("stages.") and (f := _module_file(m)):
                modules |= _local_imports(f)
        files = {scripts[0]} | {f for m in modules if (f := _module_file(m))}
        deps = [REPO / d for d in spec["deps"]]
        for f in sorted(files):
            if not any(f == d or d in f.parents for d in deps):
                problems.append(f"{name}: {f.relative_to(REPO)}")
    assert not problems, f"undeclared deps: {problems}"


def test_a_cell_solved_in_process_can_resume(digits):
    """The checkpoint fingerprint of an impulse cell that solves its own Q/K (pseudo-input and
    heads/width studies) is the same on every run: configuration only. It used to contain
    the solve's seconds, so such cells never resumed."""
    params = load_params(REPO / "params.yaml")
    a = SimpleNamespace(convmixer=None, init="impulse", kernel=3, solutions=None, pseudo="UU", shape=None)
    records = [build(a, params, recipe(params, "digits"), digits.spec, seed=0)[1] for _ in range(2)]
    assert records[0]["solve_seconds"] != records[1]["solve_seconds"]   # timings do differ
    subset = torch.arange(20)
    assert cell_fingerprint(records[0], subset) == cell_fingerprint(records[1], subset)
    assert "solve_seconds" not in str(cell_fingerprint(records[0], subset))


def test_timing_logs_stay_out_of_outputs(tmp_path, monkeypatch):
    """Timings go to logs/timings/<output>.json, never into (or beside, inside) an output
    folder, whether the output is given relative or absolute."""
    from stages.common import TIMINGS_DIR, log_timings

    monkeypatch.chdir(tmp_path)
    log_timings("results/train/c/seed0", {"s": 1.0})
    log_timings(tmp_path / "results/train/c/seed1", {"s": 2.0})
    logged = sorted(p.name for p in (tmp_path / TIMINGS_DIR / "results/train/c").iterdir())
    assert logged == ["seed0.json", "seed1.json"]
    assert not (tmp_path / "results").exists()
