"""The commands the README and the pages under docs/ show still work:

- every `dvc exp run -S ...` passes params.yaml's checks (check_params would otherwise refuse
  it before any stage runs), with the initializers a page adds (docs/library.md's
  `# structinit/init/methods/<name>.py` snippet) registered first;
- every `python -m <module>` names a module that exists, and every repository path they name
  exists (module paths moved in issue 25: CHANGELOG.md's "Module paths moved" section maps old to new).
"""
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import yaml

from structinit.pipeline.params import validate_params

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
REGISTRY_SNIPPET = "# structinit/init/methods/"     # first line of a block that is a method file


def page_name(page: Path) -> str:
    return str(page.relative_to(REPO))


def page_text(page: Path) -> str:
    return page.read_text().replace("\\\n", " ")      # join continued lines


def exp_runs(page: Path) -> list[str]:
    """Each `dvc exp run` with a parameter to set (prose that only names the command is skipped),
    but one that trains a page's own dataset: it needs that dataset's block and files, with which
    tests/test_own_dataset.py checks it."""
    commands = (m.group(0).strip() for m in re.finditer(r"dvc exp run[^\n`#]*", page_text(page)))
    own = documented_own_datasets()
    return [c for c in commands if "=" in c and not own & set(re.findall(r"\w+", c))]


def documented_own_datasets() -> set[str]:
    """The names a page declares in its `<!-- own-dataset-params -->` block of params.yaml."""
    blocks = (re.findall(r"<!-- own-dataset-params:.*?-->\n```yaml\n(.*?)```", page.read_text(), flags=re.S)
              for page in PAGES)
    return {name for found in blocks for block in found for name in yaml.safe_load(block)["own_datasets"]}


def all_exp_runs() -> list:
    return [pytest.param(command, id=f"{page_name(page)}: {command}")
            for page in PAGES for command in exp_runs(page)]


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def registry_snippets() -> list[str]:
    return [block for page in PAGES for block in python_blocks(page) if block.startswith(REGISTRY_SNIPPET)]


def apply_overrides(params: dict, command: str) -> dict:
    words = shlex.split(command)
    for flag, value in zip(words, words[1:]):
        if flag == "-S":
            key, raw = value.split("=", 1)
            *path, last = key.split(".")
            node = params
            for part in path:
                node = node[part]
            node[last] = yaml.safe_load(raw)
    return params


@pytest.fixture
def page_initializers():
    """Run each page's method-file snippet as that file would run; unregister after."""
    from structinit.init import registry

    before = set(registry.load_all())        # the method files' own, which stay registered
    try:
        for block in registry_snippets():
            exec(compile(block, block.split("\n", 1)[0].lstrip("# "), "exec"), {})
        yield sorted(set(registry.INITIALIZERS) - before)
    finally:
        for name in set(registry.INITIALIZERS) - before:
            del registry.INITIALIZERS[name]


def test_pages_show_experiments():
    assert (REPO / "docs").is_dir()
    assert len(exp_runs(REPO / "README.md")) >= 3
    assert len(all_exp_runs()) >= 8


@pytest.mark.parametrize("command", all_exp_runs())
def test_every_shown_experiment_is_a_valid_params_file(command, page_initializers):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    validate_params(apply_overrides(params, command))


def test_registry_snippets_register_a_working_initializer(page_initializers):
    import structinit as si

    assert registry_snippets() and page_initializers, "docs/library.md shows no initializer registration"
    for name in page_initializers:
        model = si.create_vit(img_size=8, patch_size=1, embed_dim=48, depth=1, num_heads=3, num_classes=10,
                              in_chans=1)
        assert si.initialize(model, name, seed=0).method == name


# ---- module and file paths -------------------------------------------------------------------

def module_exists(module: str) -> bool:
    top, *rest = module.split(".")
    if not (REPO / top).is_dir():                     # not the repository's: an installed one
        return importlib.util.find_spec(module) is not None
    base = REPO.joinpath(top, *rest)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def run_modules() -> list:
    return [pytest.param(m, id=f"{page_name(page)}: {m}") for page in PAGES
            for m in sorted(set(re.findall(r"python -m ([\w.]+)", page_text(page))))]


@pytest.mark.parametrize("module", run_modules())
def test_every_python_m_names_a_module(module):
    assert module_exists(module), f"python -m {module}: no such module (moved? see CHANGELOG.md)"


def moved_modules() -> list[tuple[str, str]]:
    """CHANGELOG.md's "Module paths moved" section: `old` → `new` pairs."""
    return re.findall(r"`([\w.]+)`\s*→\s*`([\w.]+)`", (REPO / "CHANGELOG.md").read_text())


def test_the_changes_line_maps_old_module_paths_to_existing_ones():
    pairs = moved_modules()
    assert len(pairs) >= 5
    for old, new in pairs:
        assert not module_exists(old), f"{old} still exists: not moved"
        assert module_exists(new), f"{old} → {new}: {new} does not exist"


def repo_paths() -> list:
    """Every repository path a page names, but the files its snippets tell you to create."""
    pattern = r"(?<![\w./])((?:structinit|stages|scale|benchmarks|tools|tests)/[\w./-]*[\w/])"
    yours = {block.split("\n", 1)[0].removeprefix("# ").strip() for block in registry_snippets()}
    return [pytest.param(p, id=f"{page_name(page)}: {p}") for page in PAGES
            for p in sorted(set(re.findall(pattern, page.read_text())) - yours)]


@pytest.mark.parametrize("path", repo_paths())
def test_every_repository_path_shown_exists(path):
    assert (REPO / path).exists(), f"{path}: not in the repository"


def params_file_suggestions() -> list:
    """Each `-S '<key>=<value>'` that a comment in params.yaml suggests."""
    comments = [line.split("#", 1)[1] for line in (REPO / "params.yaml").read_text().splitlines() if "#" in line]
    found = [m for c in comments for m in re.findall(r"-S '([^']+)'", c)]
    return [pytest.param(f"-S '{s}'", id=s) for s in found]


def test_params_yaml_suggests_commands():
    assert len(params_file_suggestions()) >= 4


@pytest.mark.parametrize("option", params_file_suggestions())
def test_every_option_params_yaml_suggests_is_valid(option):
    """A comment's suggestion, applied alone to the default, passes check_params (the ImageNet
    one once suggested grid.datasets, which refuses a streamed dataset); its folder, which the
    comment asks you to set, is given."""
    params = apply_overrides(yaml.safe_load((REPO / "params.yaml").read_text()), option)
    if params["grid"]["streamed_datasets"]:
        params["local_datasets"]["imagenet"] = "/data/ILSVRC"
    validate_params(params)
