"""params.yaml, loaded once per process and read through views of its sections.

    params = load_params()                   # the one function that reads params.yaml
    params.recipe("digits").model            # create_vit's shape arguments
    params.recipe("digits").train            # TrainConfig's fields (the seed comes from a seed list)
    params.seeds_at("grid.seeds")            # a stage's --seeds-from

The schema (pipeline/params.py) checks the whole file in the check_params stage, upstream of
every other stage. This module imports nothing of the project but its error type: a stage's
code dependencies are its imports, and every stage loads params.yaml, so an edit of the schema,
of cell names or of the trainer must not reach the stages that cannot change with it. "ours"
(the structured init's arm) is resolved by cells.ours, beside the other cell names.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from structinit.errors import StructinitError


class ParamsError(StructinitError, ValueError):
    """params.yaml is not valid; the message has one line per problem."""


@dataclass(frozen=True)
class Recipe:
    """recipes.<dataset>: the model's shape (create_vit's arguments) and the training recipe
    (TrainConfig's fields but the seed)."""
    dataset: str
    model: dict
    train: dict


class Params(dict):
    """params.yaml as a mapping (sections by name), with typed views of what stages read."""

    def recipe(self, dataset: str) -> Recipe:
        recipes = self["recipes"]
        if dataset not in recipes:
            raise ParamsError(f"no recipe for dataset {dataset!r} in params.yaml (recipes: {sorted(recipes)})")
        return Recipe(dataset, dict(recipes[dataset]["model"]), dict(recipes[dataset]["train"]))

    def seeds_at(self, dotted: str) -> list[int]:
        """The seed list at a dotted key, e.g. "grid.seeds" (a stage's --seeds-from)."""
        node = self
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                raise ParamsError(f"--seeds-from {dotted}: params.yaml has no key {key!r} there")
            node = node[key]
        if (not isinstance(node, list) or not node
                or not all(isinstance(s, int) and not isinstance(s, bool) for s in node)):
            raise ParamsError(f"{dotted}={node!r}: expected a non-empty list of integer seeds")
        if len(set(node)) != len(node):
            raise ParamsError(f"{dotted}={node!r}: a seed is listed twice")
        return list(node)

    @property
    def own_datasets(self) -> dict:
        return self.get("own_datasets") or {}


def load_params(path: str | Path = "params.yaml") -> Params:
    """The file as it is (unchecked: check_params has checked it before any other stage runs);
    a missing file or invalid YAML is a ParamsError naming the file and line."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ParamsError(f"{path}: no such file (run from the project's root)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path}:{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return Params(raw)
