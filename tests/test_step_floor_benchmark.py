"""benchmarks/step_floor.py stays runnable, and its floor is what it says: every matmul of the
step, forward and backward, and every softmax/GELU, replayed on tensors like the step's own."""
import re

import pytest
import torch
import yaml

from benchmarks import step_floor
from benchmarks.step_floor import REPO
from benchmarks.step_floor import EXP_ERF, GEMMS, RecordOps, _TensorSpec, hot_timer, replayer

DEPTH = yaml.safe_load((REPO / "params.yaml").read_text())["recipes"]["digits"]["model"]["depth"]


def test_a_spec_remakes_shape_strides_and_dtype_even_of_an_expanded_view():
    t = torch.randn(3, 1, 5, dtype=torch.bfloat16).expand(3, 4, 5).transpose(0, 2)
    made = _TensorSpec(t).make()
    assert (made.shape, made.stride(), made.dtype) == (t.shape, t.stride(), t.dtype)


def _specs(calls):
    return [(func, [(a.shape, a.stride, a.dtype) for a in args if isinstance(a, _TensorSpec)])
            for func, args, _ in calls]


def test_the_recorder_sees_backward_matmuls_in_autocasts_dtype_and_the_replay_runs_them_again():
    w = torch.randn(4, 3, requires_grad=True)
    x = torch.randn(2, 6, 4)
    with RecordOps(GEMMS) as rec:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
        torch.autograd.grad(y.float().sum(), w)
    assert len(rec.calls) == 2                    # forward, and the weight's gradient
    assert {d for _, specs in _specs(rec.calls) for *_, d in specs} == {torch.bfloat16}
    with RecordOps(GEMMS) as again:
        replayer(rec.calls)()
    assert _specs(again.calls) == _specs(rec.calls)                # same ops, shapes, strides, dtypes
    assert hot_timer(rec.calls, 2)() > 0


def test_the_heavy_floor_holds_the_fused_attention_where_the_step_runs_it():
    q = torch.randn(2, 3, 8, 4, requires_grad=True)
    with RecordOps(GEMMS | EXP_ERF) as rec:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        torch.autograd.grad(out.sum(), q)
    names = {str(func.overloadpacket) for func, *_ in rec.calls}
    assert names == {"aten._scaled_dot_product_flash_attention_for_cpu",
                     "aten._scaled_dot_product_flash_attention_for_cpu_backward"}


def test_step_floor_runs_tiny_and_its_floor_is_the_steps_own_work(capsys):
    threads = torch.get_num_threads()
    r = step_floor.main(["--repeats", "1", "--steps", "1", "--models", "2", "--batch", "4", "--no-compile",
                         "--trainer-speedup", "1.5"])
    assert torch.get_num_threads() == threads                       # restored
    out = capsys.readouterr().out
    # bf16 here: the trainer's explicit attention. Per block: qkv, q@k.T, attn@v, proj, fc1, fc2
    # forward, two gradients each backward; plus the patch embedding (conv, one backward call)
    # and the head (forward, two gradients)
    assert r["gemm_calls"] == 18 * DEPTH + 5 and r["gemm_dtypes"] == ["bfloat16"]
    assert r["heavy_calls"] == 4 * DEPTH                           # softmax, GELU: forward, backward
    for row in ("today (eager)", "floor: GEMMs, in sequence", "floor: heavy, in sequence", "floor: GEMMs, hot",
                "floor: heavy, hot"):
        assert re.search(rf"^\| {re.escape(row)} +\| +\d+(\.\d)? +\|", out, re.M)
    assert re.search(r"^the GEMMs: \d+\.\d\d GFLOP per step, \d+ GFLOP/s in sequence, \d+ hot$", out, re.M)
    m = r["medians_s"]
    # No order of times is asserted: at 4 images and one repeat, which of two sub-10-ms timings
    # comes first is the machine's noise (CI once saw the GEMMs alone outlast GEMMs + softmax/GELU).
    # What the ceiling is, is asserted: with one repeat, today's step over its hot heavy floor.
    assert all(seconds > 0 for seconds in m.values())
    assert r["ceiling"] == pytest.approx(m["today (eager)"] / m["floor: heavy, hot"])
    assert r["ceiling_vs_baseline"] == pytest.approx(1.5 * r["ceiling"])
    assert re.search(r"^ceiling against the baseline: 1\.50 \(trainer_speed\) x \d+\.\d\d = \d", out, re.M)


def test_in_fp32_the_floor_replays_the_fused_attention_the_trainer_runs():
    r = step_floor.main(["--dtype", "fp32", "--repeats", "1", "--steps", "1", "--models", "2", "--batch", "4",
                         "--no-compile"])
    # fused attention: no q@k.T / attn@v matmuls (4 GEMMs fewer forward+backward... per block:
    # qkv, proj, fc1, fc2 forward and two gradients each), its kernel and backward among the heavy
    assert r["gemm_calls"] == 12 * DEPTH + 5 and r["gemm_dtypes"] == ["float32"]
    assert r["heavy_calls"] == 4 * DEPTH                           # attention, GELU: forward, backward
