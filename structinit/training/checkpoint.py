"""Checkpoints: fingerprints, the resume rule both trainers share, and the stacked trainer's one-file format.

    checkpoint_fingerprint(cfg, dtype, extra)               what a checkpoint must match to be resumed
    code_fingerprint()                                      the loaded structinit/stages sources, hashed
    restore_checkpoint(path, key, fingerprint, load, ...)   both trainers' resume rule
    restore_stack(models, fingerprints, path, ...)          the stacked trainer's: each model's (history, AdamW state)
    save_stack(path, fingerprints, epoch, histories, stack, opt)

AdamW state is saved in each model's own layout, like its weights (a stack holds the batched Linear weights, and so
their moments, transposed): a checkpoint does not depend on stacking, and a plain run resumes a stacked one's.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

import torch

from structinit.io import CorruptFileError, load_checked, save_checked
from structinit.training.config import TrainConfig

if TYPE_CHECKING:              # the streamed trainer imports this module, never the stack's code
    from structinit.training.stacked import StackedModels

T = TypeVar("T")

# One format number for both trainers: bump it when what either writes changes, so an older file is ignored (its run
# starts afresh), not misread. Layouts differ (stacked: every model under "fingerprints"; streamed.py: one model under
# "fingerprint") and each trainer reads only its own. Files live in .ckpt/, outside DVC's outputs; CHANGELOG.md says
# what each format changed.
CHECKPOINT_FORMAT = 4
CHECKPOINT_FORMAT_KEY = "checkpoint_format"


def checkpoint_fingerprint(cfg: TrainConfig, dtype: str, extra: dict | None) -> dict:
    """The recipe as given (amp unresolved), compute dtype, format and the caller's extras (e.g. the init),
    JSON-normalized so that it equals the copy read back from the file."""
    return json.loads(json.dumps({"config": dataclasses.asdict(cfg), "compute_dtype": dtype,
                                  CHECKPOINT_FORMAT_KEY: CHECKPOINT_FORMAT, **(extra or {})}, default=str))


def code_fingerprint(packages: tuple[str, ...] = ("structinit", "stages")) -> str:
    """SHA-256 (16 hex digits) of the sources of the loaded modules of `packages`, by name. Called once a cell's models
    are built, that is every module the stage imported plus the initializer's file, imported by name.
    In the fingerprint it makes a cell whose code changed start afresh, not resume epochs that other code trained while
    dvc.lock records the new code's hash."""
    import hashlib
    import sys

    h = hashlib.sha256()
    loaded = {}
    for name, module in list(sys.modules.items()):
        # the script run with `python -m stages.train` is __main__, its name in its __spec__
        spec = getattr(module, "__spec__", None)
        real = spec.name if name == "__main__" and spec is not None else name
        file = getattr(module, "__file__", None)
        if file and real.split(".")[0] in packages and file.endswith(".py"):
            loaded[real] = file
    for name in sorted(loaded):
        h.update(f"{name}\0".encode())
        h.update(Path(loaded[name]).read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _first_difference(written, wanted) -> str:
    """For the log: the top-level fields (e.g. "code, config") in which two fingerprints, or per-model lists, differ."""
    if isinstance(written, list) and isinstance(wanted, list) and len(written) == len(wanted):
        return next((d for d in map(_first_difference, written, wanted) if d), "")
    if isinstance(written, dict) and isinstance(wanted, dict):
        return ", ".join(sorted(k for k in set(written) | set(wanted) if written.get(k) != wanted.get(k)))
    return "the number of models" if isinstance(written, list) and isinstance(wanted, list) else "its layout"


def _code_of(fingerprint) -> str | None:
    first = fingerprint[0] if isinstance(fingerprint, list) and fingerprint else fingerprint
    return first.get("code") if isinstance(first, dict) else None


def restore_checkpoint(path: str | Path | None, fingerprint_key: str, fingerprint, load: Callable[[dict], T], *,
                       modules: list[torch.nn.Module], device: torch.device, announce: bool,
                       epochs_done: Callable[[T], int], epochs: int) -> T | None:
    """Resume from `path` if it is a sound checkpoint of exactly this run: load(state) puts the state into the run and
    returns what the caller keeps. None (start afresh) when:
    - there is no file (silently);
    - state[fingerprint_key] != fingerprint (another recipe, init or format): the file is ignored, later overwritten;
    - it is damaged (checksum, truncation, a pickled object) or load raises KeyError, RuntimeError, TypeError,
      ValueError or AttributeError: `modules` get their weights back and the file moves to *.corrupt for good.
    announce: say which (rank 0; the others read what it left, silently)."""
    say = print if announce else (lambda *_: None)
    if path is None or not Path(path).exists():
        return None
    path = Path(path)
    try:
        state = load_checked(path, "a training checkpoint", map_location=device)
        if not isinstance(state, dict) or state.get(fingerprint_key) != fingerprint:
            written = state.get(fingerprint_key) if isinstance(state, dict) else None
            say(f"ignoring {path}: it was written for a different configuration (differs in: "
                f"{_first_difference(written, fingerprint) or 'its layout'}); training starts from the first epoch")
            return None
        backups = [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]
        try:
            restored = load(state)
        except (KeyError, RuntimeError, TypeError, ValueError, AttributeError) as e:
            for m, backup in zip(modules, backups):
                m.load_state_dict(backup)
            raise CorruptFileError(f"{path} (a training checkpoint) is not a sound checkpoint of "
                                   f"this run: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    except CorruptFileError as e:
        bad = path.with_name(path.name + ".corrupt")
        path.replace(bad)
        say(f"discarding an unusable checkpoint ({e}); moved to {bad}; training starts from the first epoch")
        return None
    code = _code_of(fingerprint)
    say(f"resuming from {path} after epoch {epochs_done(restored)}/{epochs}" + (f" (code {code})" if code else ""))
    return restored


# ---- the stacked trainer's file ------------------------------------------------------------
def save_stack(path: Path, fingerprints: list[dict], epoch: int, histories: list[list[dict]],
               stack: StackedModels, opt: torch.optim.Optimizer) -> None:
    """Every model's state after `epoch` (0-based), atomically in one file: a kill between per-model files would leave
    models at different epochs, and no model catching up alone is bitwise the stacked step."""
    save_checked(path, {
        "fingerprints": fingerprints, "epoch": epoch,
        "models": [{"history": history, "model": stack.state_dict_of(i),
                    "optimizer": optimizer_state_of(opt, stack, i)}
                   for i, history in enumerate(histories)]})


def restore_stack(models: list[torch.nn.Module], fingerprints: list[dict], path: Path | None,
                  device: torch.device, epochs: int, announce: bool) -> list[tuple[list, dict]] | None:
    """Each model's (history, optimizer state), weights loaded, if `path` is sound and for exactly these fingerprints
    (restore_checkpoint); None: every model starts afresh. announce: say which (rank 0)."""
    def load(state: dict) -> list[tuple[list, dict]]:
        restored = []
        for model, saved in zip(models, state["models"], strict=True):
            model.load_state_dict(saved["model"])
            if len(saved["history"]) != state["epoch"] + 1 or not isinstance(saved["optimizer"], dict):
                raise KeyError("history/epoch/optimizer")
            restored.append((saved["history"], saved["optimizer"]))
        return restored

    return restore_checkpoint(path, "fingerprints", fingerprints, load, modules=models, device=device,
                              announce=announce, epochs_done=lambda restored: len(restored[0][0]), epochs=epochs)


def optimizer_state_of(opt: torch.optim.Optimizer, stack: StackedModels, i: int) -> dict | None:
    """Model i's AdamW state ({"step", "exp_avg": {name: ...}, "exp_avg_sq": ...}) in its layout; None before step 1."""
    named = stack.trainable()
    first = opt.state.get(next(iter(named.values())))
    if not first:
        return None
    return {"step": float(first["step"]),
            **{k: {name: stack.in_model_layout(name, stack.model_slice(opt.state[p][k], i))
                   .detach().clone(memory_format=torch.contiguous_format) for name, p in named.items()}
               for k in ("exp_avg", "exp_avg_sq")}}
