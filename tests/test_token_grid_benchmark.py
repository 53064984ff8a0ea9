"""benchmarks/token_grid.py stays runnable, and its larger grid is the token count it names."""
import re

import torch

from benchmarks import token_grid
from benchmarks.attention_kernels import make_stack


def test_the_resampled_model_has_side_squared_tokens():
    stack, _ = make_stack(1, image_size=16)
    x = torch.randn(1, 2, 1, 16, 16)
    assert stack.batched.patch_embed(x.flatten(0, 1)).shape[1] == 256
    assert stack(x).shape == (1, 2, 10)


def test_token_grid_runs_tiny_and_scales_the_cells_by_its_ratio(capsys):
    threads = torch.get_num_threads()
    r = token_grid.main(["--side", "12", "--models", "2", "--batch", "2", "--steps", "1", "--repeats", "1",
                         "--cell-minutes", "2"])
    assert torch.get_num_threads() == threads
    out = capsys.readouterr().out
    assert re.search(r"^8x8 \(64 tokens\): \d+\.\d ms per step median, \d+\.\d ms min", out, re.M)
    assert re.search(r"^12x12 \(144 tokens\): \d+\.\d ms per step median, \d+\.\d ms min", out, re.M)
    assert r["ratio"] > 0 and abs(r["minutes"] - 6 * 2 * r["ratio"]) < 1e-9
    assert f"about {r['minutes']:.0f} min of training (6 cells x 2 min x {r['ratio']:.2f})" in out
