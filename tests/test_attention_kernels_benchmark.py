"""benchmarks/attention_kernels.py stays runnable: a tiny run prints its four rows, the two
ratios, and the choice the trainer makes on this machine, which is StackedModels' own."""
import re

import torch

from benchmarks import attention_kernels


def test_attention_kernels_runs_tiny_and_reports_the_trainers_choice(capsys):
    threads = torch.get_num_threads()
    result = attention_kernels.main(["--repeats", "1", "--steps", "1", "--models", "2", "--batch", "4"])
    assert torch.get_num_threads() == threads                      # restored
    out = capsys.readouterr().out
    for dtype in ("fp32", "bf16"):
        for kernel in ("fused", "explicit"):
            assert re.search(rf"^\| {dtype} +\| {kernel} +\| +\d", out, re.M)
        assert re.search(rf"^{dtype}: fused / explicit time = \d+\.\d\d", out, re.M)
    assert result["picked"] == {"fp32": "fused attention", "bf16": "explicit attention"}
    assert set(result["ratios"]) == {"fp32", "bf16"} and all(r > 0 for r in result["ratios"].values())
