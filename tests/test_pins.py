"""constraints.txt pins every package the project needs, transitive ones included, and the
environment the tests run in is the one it pins: "same machine, same bytes" rests on timm,
numpy, scikit-learn, scipy, DVC... as much as on torch. ./run.sh installs with it; `./run.sh
pins` rewrites it."""
import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
EXTRAS = ("pipeline", "test", "scale")          # what ./run.sh test installs
DISTRIBUTION = "structinit-vit"                 # pyproject.toml's name (the import name is structinit)
LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def pins() -> dict[str, str]:
    out = {}
    for raw in (REPO / "constraints.txt").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        assert m, f"constraints.txt: {line!r} is not `name==version`"
        out[canonicalize_name(m[1])] = m[2]
    return out


def requirement_closure(root: str, extras: tuple[str, ...]) -> set[str]:
    """Every distribution `root[extras]` needs on this platform, transitively (markers evaluated
    as pip would: with each requiring distribution's own extras)."""
    seen, todo = set(), [(canonicalize_name(root), set(extras))]
    while todo:
        name, wanted = todo.pop()
        key = (name, frozenset(wanted))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue                                  # reported by the test as not installed
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (wanted or {""})):
                continue
            todo.append((canonicalize_name(req.name), set(req.extras)))
    return {name for name, _ in seen} - {canonicalize_name(root)}


def _release(version: str) -> Version:
    """The version without a local label: torch 2.14.1+cpu and +cu130 are one pin."""
    v = Version(version)
    return Version(v.public)


def test_every_needed_package_is_pinned_and_installed_at_its_pin():
    pinned = pins()
    needed = requirement_closure(DISTRIBUTION, EXTRAS)
    assert {"torch", "timm", "numpy", "scikit-learn", "scipy", "pydantic", "dvc", "networkx"} <= needed
    unpinned = sorted(needed - pinned.keys())
    assert not unpinned, f"needed but not in constraints.txt: {unpinned} (refresh: ./run.sh pins)"
    moved = []
    for name in sorted(needed):
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            moved.append(f"{name}: pinned {pinned[name]}, not installed")
            continue
        if _release(installed) != _release(pinned[name]):
            moved.append(f"{name}: pinned {pinned[name]}, installed {installed}")
    assert not moved, "the environment is not constraints.txt's (rebuild .venv, or ./run.sh pins):\n" + "\n".join(moved)


def test_the_scale_extra_declares_what_fanout_imports():
    """scale/fanout.py imports networkx: the scale extra must bring it, not Ray by accident."""
    source = (REPO / "scale/fanout.py").read_text()
    assert re.search(r"^\s*(import networkx|from networkx)", source, re.M)
    scale = [Requirement(r) for r in metadata.requires(DISTRIBUTION) or []
             if Requirement(r).marker is not None and Requirement(r).marker.evaluate({"extra": "scale"})]
    assert "networkx" in {canonicalize_name(r.name) for r in scale}


def test_run_sh_installs_with_the_constraints():
    text = (REPO / "run.sh").read_text()
    # torch, the project, the scale extra; an empty PIN (STRUCTINIT_CONSTRAINTS=) must not trip `set -u`
    assert text.count('${PIN[@]+"${PIN[@]}"}') >= 3
    assert 'PIN=(-c "$CONSTRAINTS")' in text and "CONSTRAINTS=${STRUCTINIT_CONSTRAINTS-constraints.txt}" in text


def test_run_sh_rebuilds_when_the_files_content_changes_not_their_dates(tmp_path):
    """.venv's stamp holds the hash of pyproject.toml and constraints.txt: a copy of the project
    whose stamp matches is up to date, whatever the files' dates; an edited pin (or a missing
    stamp) rebuilds. Asked with `./run.sh setup-state`, which builds nothing."""
    import os
    import shutil
    import subprocess
    import time

    project = tmp_path / "p"
    project.mkdir()
    for name in ("run.sh", "pyproject.toml", "constraints.txt"):
        shutil.copy2(REPO / name, project / name)
    venv = project / ".venv"

    def state():
        return subprocess.run(["bash", "run.sh", "setup-state"], cwd=project, capture_output=True, text=True,
                              check=True, env=dict(os.environ, VENV=str(venv))).stdout.strip()
    assert state() == "would rebuild"                                   # no .venv yet
    venv.mkdir()
    import hashlib
    key = hashlib.sha256((project / "pyproject.toml").read_bytes() + (project / "constraints.txt").read_bytes())
    (venv / ".structinit-installed").write_text(key.hexdigest() + "\n")
    assert state() == "up to date"
    later = time.time() + 3600
    os.utime(project / "constraints.txt", (later, later))                # newer, same content
    assert state() == "up to date"
    pinned = (project / "constraints.txt").read_text().replace("timm==", "timm==0.0.1\n# was timm==", 1)
    (project / "constraints.txt").write_text(pinned)
    os.utime(project / "constraints.txt", (0, 0))                        # older, other content
    assert state() == "would rebuild"
    assert not (venv / "bin").exists()                                   # nothing was built


def test_the_distribution_is_named_structinit_vit_not_structinit():
    """"structinit" on PyPI is an unrelated project (1.0.1, newer than ours): `pip install -U
    structinit` would replace this library. structinit-vit was free there on 2026-11-26 (the
    index answered 404); this checks pyproject.toml keeps that name, not the index."""
    import tomllib

    assert tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["name"] == DISTRIBUTION

