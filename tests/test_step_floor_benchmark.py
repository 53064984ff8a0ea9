"""benchmarks/step_floor.py stays runnable, and its floor is what it says: every matmul of the
step, forward and backward, and every softmax/GELU, replayed on tensors like the step's own."""
import re

import torch
import yaml

from benchmarks import step_floor
from benchmarks.attention_kernels import REPO
from benchmarks.step_floor import GEMMS, RecordOps, _TensorSpec, replayer

DEPTH = yaml.safe_load((REPO / "params.yaml").read_text())["recipes"]["digits"]["model"]["depth"]


def test_a_spec_remakes_shape_strides_and_dtype_even_of_an_expanded_view():
    t = torch.randn(3, 1, 5, dtype=torch.bfloat16).expand(3, 4, 5).transpose(0, 2)
    made = _TensorSpec(t).make()
    assert (made.shape, made.stride(), made.dtype) == (t.shape, t.stride(), t.dtype)


def test_the_recorder_sees_backward_matmuls_and_the_replay_runs_them_again():
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(2, 6, 4)
    with RecordOps(GEMMS) as rec:
        torch.autograd.grad((x @ w).sum(), w)
    assert len(rec.calls) == 2                    # forward, and the weight's gradient
    with RecordOps(GEMMS) as again:
        replayer(rec.calls)()
    assert [c[0] for c in again.calls] == [c[0] for c in rec.calls]


def test_step_floor_runs_tiny_and_its_floor_is_the_steps_own_work(capsys):
    threads = torch.get_num_threads()
    r = step_floor.main(["--repeats", "1", "--steps", "1", "--models", "2", "--batch", "4", "--no-compile",
                         "--trainer-speedup", "1.5"])
    assert torch.get_num_threads() == threads                       # restored
    out = capsys.readouterr().out
    # per block: qkv, q@k.T, attn@v, proj, fc1, fc2 forward, two gradients each backward; plus
    # the patch embedding (conv, one backward call) and the head (forward, two gradients)
    assert r["gemm_calls"] == 18 * DEPTH + 5
    assert r["exp_erf_calls"] == 4 * DEPTH                         # softmax, GELU: forward, backward
    for row in ("today (eager,", "floor: GEMMs alone", "floor: GEMMs + softmax/GELU"):
        assert re.search(rf"^\| {re.escape(row)}.*\| +\d+\.\d +\|", out, re.M)
    assert r["medians_s"]["floor: GEMMs + softmax/GELU"] < r["medians_s"][next(iter(r["medians_s"]))]
    assert r["ceiling"] > 1 and r["ceiling_vs_baseline"] == 1.5 * r["ceiling"]
    assert re.search(r"^ceiling against the baseline: 1\.50 \(trainer_speed\) x \d+\.\d\d = ", out, re.M)
