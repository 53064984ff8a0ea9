"""Atomic file writes: write a sibling temp file, then rename over the target.

A run killed mid-write leaves the previous file (or none), never half a file; every
artifact, checkpoint and report in the project is written through here.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """Call write(tmp_path), then move tmp_path to `path` (parent folders are created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def save_torch(path: str | Path, obj) -> None:
    import torch

    write_atomic(path, lambda tmp: torch.save(obj, tmp))
