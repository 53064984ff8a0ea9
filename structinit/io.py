"""Files: atomic writes, safe reads, and what must stay out of hashed outputs.

Writes go to a sibling temp file, then rename over the target: a run killed mid-write leaves
the previous file (or none), never half a file; every artifact, checkpoint and report in the
project is written through here. Reads of torch files never run code (load_torch).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from structinit.errors import StructinitError


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


CHECKSUM_KEY = "structinit_sha256"


def save_checked(path: str | Path, obj) -> None:
    """save_torch with a SHA-256 of the content inside the file, so that load_checked detects
    a flipped byte anywhere in it (torch's zip format checks no tensor data on load)."""
    save_torch(path, {CHECKSUM_KEY: content_digest(obj), "content": obj})


def load_checked(path: str | Path, what: str, map_location="cpu"):
    """The content of a save_checked file; CorruptFileError when it is truncated, corrupted,
    holds a pickled object, or its content does not match its checksum."""
    d = load_torch(path, what, map_location=map_location)
    if not isinstance(d, dict) or set(d) != {CHECKSUM_KEY, "content"}:
        raise CorruptFileError(f"{path} ({what}) is not a checksummed structinit file "
                               "(written by another program or an older version)")
    if content_digest(d["content"]) != d[CHECKSUM_KEY]:
        raise CorruptFileError(f"{path} ({what}) is corrupted: its content does not match the "
                               "checksum written with it")
    return d["content"]


def content_digest(obj) -> str:
    """SHA-256 of a nest of dicts, lists, tuples, tensors and plain values (order-sensitive)."""
    import hashlib

    import torch

    h = hashlib.sha256()

    def feed(x):
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, dict):
            h.update(f"D{len(x)}".encode())
            for k, v in x.items():
                feed(k)
                feed(v)
        elif isinstance(x, (list, tuple)):
            h.update(f"{type(x).__name__[0]}{len(x)}".encode())
            for v in x:
                feed(v)
        else:
            h.update(f"{type(x).__name__}:{x!r};".encode())
    feed(obj)
    return h.hexdigest()


class CorruptFileError(StructinitError, RuntimeError):
    """A file on disk is truncated, corrupted or not what it should be."""


class MissingFileError(StructinitError, FileNotFoundError):
    """A file the pipeline needs is not there."""


def load_torch(path: str | Path, what: str, map_location="cpu"):
    """torch.load that never runs code: plain tensors, numbers, strings, lists and dicts only
    (weights_only=True). Anything else (a pickled object, a truncated or corrupted file) is a
    CorruptFileError naming the file and `what` it should have been. map_location: where the
    tensors go, the CPU by default, so a file written from a GPU loads on a machine without
    one (torch would otherwise restore them on the device they were saved from)."""
    import pickle

    import torch

    path = Path(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise MissingFileError(f"{path} ({what}) does not exist") from None
    except pickle.UnpicklingError as e:
        # weights_only's refusal: the file holds a Python object, which could run code
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "Weights only load failed" in first or "Unsupported" in str(e):
            raise CorruptFileError(
                f"refusing to load {path} ({what}): it holds a pickled Python object, which could "
                "run code on load; only plain tensors, numbers, strings, lists and dicts are read") from None
        raise CorruptFileError(f"{path} ({what}) is corrupted: {first}") from None
    except (RuntimeError, EOFError, ValueError, OSError, AttributeError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CorruptFileError(f"{path} ({what}) is truncated or corrupted: {first}") from None


def without_timings(obj):
    """A copy of a record without its wall-clock fields (any key ending in "seconds"): what goes
    into a DVC output must be the same bytes on every run; timings go to a log beside it."""
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items() if not str(k).endswith("seconds")}
    if isinstance(obj, (list, tuple)):
        return type(obj)(without_timings(v) for v in obj)
    return obj
