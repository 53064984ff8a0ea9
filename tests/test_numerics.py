"""CPU numerics (structinit/numerics.py): the CPU's own kernels, bf16 where the CPU has it,
the same bytes from the same clone on the same machine, and a library that leaves the
process it is imported into alone."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import structinit as si
import structinit.training.stacked as train_module
from stages.common import REMOVED_NUMERICS_VAR as REMOVED_VAR, refuse_removed_setting
from structinit.numerics import numerics_record

REPO = Path(__file__).resolve().parents[1]

CELL = """
import hashlib, json, sys
import torch, yaml
import structinit as si
from structinit.pipeline.build import build_model
rec = yaml.safe_load(open("params.yaml"))["recipes"]["digits"]
data = si.prepare_dataset("digits")
cfg = si.TrainConfig(**{**rec["train"], "epochs": 1, "eval_every": 1}, seed=0)
models = []
for seed in (0, 1):
    models.append(build_model(rec["model"], data.spec))
    si.initialize(models[-1], "impulse", seed=seed, kernel=3)    # the closed-form solve included
hists = si.train_models(models, data, [cfg, si.TrainConfig(**{**rec["train"], "epochs": 1, "eval_every": 1}, seed=1)],
                        device="cpu", train_indices=torch.arange(512), progress=False)
digest = hashlib.sha256()
for m in models:
    for name, t in m.state_dict().items():
        digest.update(name.encode() + t.contiguous().numpy().tobytes())
digest.update(repr([h["train_loss"] for hist in hists for h in hist]).encode())
from structinit.training.stacked import compute_dtype
print(json.dumps({"digest": digest.hexdigest(), "dtype": compute_dtype(cfg, torch.device("cpu"))}))
"""


def _cell_digest() -> dict:
    # the CPU's promise (its kernels, its thread count): the GPU hidden as well as not asked for
    env = {**{k: v for k, v in os.environ.items() if k != REMOVED_VAR}, "CUDA_VISIBLE_DEVICES": ""}
    r = subprocess.run([sys.executable, "-c", CELL], cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_same_cell_in_two_fresh_processes_gives_the_same_bytes():
    """The promise that holds everywhere: same clone, same CPU, same thread count -> same bytes
    (here in the dtype this CPU's amp=auto picks, with the structured init's solve)."""
    first, second = _cell_digest(), _cell_digest()
    assert first == second


def test_importing_the_library_changes_nothing_process_wide():
    """import structinit, build and initialize models (the structured init's solve included):
    os.environ and torch's thread count are as the caller left them."""
    code = """
import os, torch
import timm   # noqa: F401  timm's own import sets TORCHINDUCTOR_CACHE_DIR (torch inductor's config): not ours
torch.set_num_threads(1)
before = dict(os.environ)
import structinit as si
from structinit.pipeline.build import build_model
from structinit.data.specs import get_spec
for method, kw in (("trunc_normal", {}), ("mimetic", {}), ("impulse", {"kernel": 3})):
    m = build_model({"patch_size": 1, "embed_dim": 48, "depth": 1, "num_heads": 3}, get_spec("digits"))
    si.initialize(m, method, seed=0, **kw)
changed = {k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k)}
assert not changed, changed
assert torch.get_num_threads() == 1, torch.get_num_threads()
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k != REMOVED_VAR}
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


@pytest.mark.parametrize("amp, native_bf16, device, expected", [
    ("auto", True, "cpu", "bf16"), ("auto", False, "cpu", "fp32"), ("auto", False, "cuda", "bf16"),
    ("auto", True, "cuda-sm70", "fp32"), ("auto", True, "cuda-sm75", "fp32"), ("auto", True, "cuda-sm80", "bf16"),
    ("off", True, "cpu", "fp32"), ("off", True, "cuda", "fp32"), ("bf16", False, "cpu", "bf16")])
def test_amp_auto_uses_bf16_where_the_hardware_has_it(monkeypatch, amp, native_bf16, device, expected):
    """cuda: an H100 (9.0); cuda-smXY: a card of compute capability X.Y (V100 7.0, T4 7.5:
    no native bf16, so fp32; A100 8.0: bf16)."""
    monkeypatch.setattr(train_module, "cpu_has_native_bf16", lambda: native_bf16)
    device, _, sm = device.partition("-sm")
    capability = (int(sm[0]), int(sm[1])) if sm else (9, 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "a test card")
    cfg = si.TrainConfig(amp=amp)
    assert train_module.compute_dtype(cfg, torch.device(device)) == expected
    note = train_module.precision_note(cfg, torch.device(device), expected)
    # an older card's fp32 is said in the log and the run's record; nothing to say otherwise
    assert (f"compute capability {capability[0]}.{capability[1]}) has no native bf16" in note) == (
        device == "cuda" and expected == "fp32" and amp == "auto"), note
    if device == "cpu":                          # the context the step runs in agrees
        with train_module.autocast(torch.device("cpu"), expected):
            y = torch.nn.functional.linear(torch.randn(2, 3), torch.randn(4, 3))
        assert y.dtype == (torch.bfloat16 if expected == "bf16" else torch.float32)


def test_amp_auto_keeps_batchnorm_models_in_fp32_on_cpu(monkeypatch):
    """CPU batch norm takes no bf16 input with fp32 running statistics: such models (ConvMixer)
    train in fp32 there; on CUDA they keep bf16."""
    monkeypatch.setattr(train_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    convmixer = si.create_convmixer(dim=16, depth=1, kernel_size=3, patch_size=2, num_classes=10, in_chans=1,
                                    filter_mode="learned", seed=0)
    cfg = si.TrainConfig()
    assert train_module.compute_dtype(cfg, torch.device("cpu"), convmixer) == "fp32"
    assert train_module.compute_dtype(cfg, torch.device("cuda"), convmixer) == "bf16"


def test_the_removed_pin_setting_is_refused_not_ignored():
    with pytest.raises(SystemExit, match=f"{REMOVED_VAR}='pinned' is no longer read"):
        refuse_removed_setting({REMOVED_VAR: "pinned"})
    refuse_removed_setting({})


def test_numerics_record_names_what_ran():
    rec = numerics_record()
    assert rec["threads"] == torch.get_num_threads() and rec["cpu"]
    assert rec["aten_capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(rec["native_bf16"], bool)
