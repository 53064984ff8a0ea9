"""How many kernels one training step launches, counted on the CPU.

What is counted: every aten op that reaches the dispatcher (a TorchDispatchMode), except views
(view, transpose, expand, slice, ...: metadata only, no kernel). On a GPU each such op is about
one kernel launch, and a small model is host-bound: the GPU waits on Python and the launch,
about 25 us per op on an H100, whatever the op computes. So the op count per step is the
step's time floor for the small models this project trains (a ViT-T/2 at batch 512, the
digits ViT), and it can be gated here, without a GPU.

How: `structinit.train_models` (the public API) runs 2 epochs, then the same afresh for 1
epoch; the difference divided by the steps per epoch is one step's ops (set-up, the first
step's lazy state and the final evaluation cancel). fp32 (amp="off"), no augmentation
(randaugment=None, hflip=False), batch 8, cpu_chunks=1, on the CPU, synthetic images of the
dataset's spec. The reference is a plain timm step on the same model: cross-entropy with label
smoothing 0.1, backward, clip_grad_norm_(foreach=True), fused AdamW, zero_grad(set_to_none=True).

The ViT-T/2 gate counts the recipe's model itself (depth 12); ours and the plain step on that
same model. (At 4b9c2f7: 1011 vs 407 ops, 2.5x; a depth-2 ViT-T/2, 251 vs 107, 2.3x: a step's
fixed costs, its data gather and metrics, weigh more on a shallow model.)

These gates state what the trainer's rework aims at (a step as lean as the plain one; a stack
whose ops do not grow with the number of models); a failure prints the counts (ours, plain).
"""
import collections
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

import structinit as si
from structinit.data.specs import get_spec
from structinit.data.tensors import ImageData
from structinit.pipeline.build import build_model

ROOT = Path(__file__).resolve().parents[1]
RECIPES = yaml.safe_load((ROOT / "params.yaml").read_text())["recipes"]
BATCH = 8
STEPS = 2                          # steps per epoch
VIT_T2_DEPTH = 12                  # the recipe's

# aten ops that only make a new view of a tensor (or answer a question about it): no kernel
VIEWS = frozenset({
    "view", "_unsafe_view", "t", "transpose", "expand", "permute", "unsqueeze", "squeeze", "select",
    "slice", "alias", "as_strided", "detach", "split", "unbind", "split_with_sizes", "chunk",
    "_reshape_alias", "lift_fresh", "view_as", "expand_as", "diagonal", "unfold", "reshape", "flatten",
    "unflatten", "contiguous", "is_same_size", "_has_compatible_shallow_copy_type"})


class CountOps(TorchDispatchMode):
    """Counts the non-view aten ops run inside it: n in all, names by op."""

    def __init__(self):
        super().__init__()
        self.names = collections.Counter()

    @property
    def n(self) -> int:
        return sum(self.names.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in VIEWS:
            self.names[name] += 1
        return func(*args, **(kwargs or {}))


def synthetic(dataset: str, n_train: int) -> ImageData:
    """Random uint8 images and labels of the dataset's spec (8 test images)."""
    spec = get_spec(dataset)
    g = torch.Generator().manual_seed(0)
    shape = (spec.channels, spec.image_size, spec.image_size)
    return ImageData(spec, torch.randint(0, 256, (n_train, *shape), dtype=torch.uint8, generator=g),
                     torch.randint(0, spec.num_classes, (n_train,), generator=g),
                     torch.randint(0, 256, (8, *shape), dtype=torch.uint8, generator=g),
                     torch.randint(0, spec.num_classes, (8,), generator=g))


def model_cfg(dataset: str, **override) -> dict:
    return {**RECIPES[dataset]["model"], **override}


def train_cfg(dataset: str, epochs: int, seed: int) -> si.TrainConfig:
    t = dict(RECIPES[dataset]["train"])
    t.update(epochs=epochs, batch_size=BATCH, warmup_epochs=0, eval_every=1000, randaugment=None, hflip=False,
             amp="off", cpu_chunks=1, seed=seed)
    return si.TrainConfig(**t)


@functools.lru_cache(maxsize=None)       # the stack of 2 is counted once for two gates
def ours_per_step(dataset: str, n_models: int, **model_override) -> float:
    """Ops of one step of train_models on a stack of n_models: (2 epochs - 1 epoch) / steps."""
    data = synthetic(dataset, BATCH * STEPS)
    counts = []
    for epochs in (1, 2):
        torch.manual_seed(0)
        models = [build_model(model_cfg(dataset, **model_override), data.spec) for _ in range(n_models)]
        cfgs = [train_cfg(dataset, epochs, seed) for seed in range(n_models)]
        with CountOps() as c:
            si.train_models(models, data, cfgs, device="cpu", progress=False)
        counts.append(c.n)
    return (counts[1] - counts[0]) / STEPS


def plain_per_step(dataset: str, steps: int = 2, **model_override) -> float:
    """Ops of one plain timm step (after a first step, which creates the optimizer's state)."""
    data = synthetic(dataset, BATCH)
    torch.manual_seed(0)
    model = build_model(model_cfg(dataset, **model_override), data.spec)
    t = RECIPES[dataset]["train"]
    opt = torch.optim.AdamW(model.parameters(), lr=t["lr"], eps=t["adam_eps"], weight_decay=t["weight_decay"],
                            fused=True)
    x, y = data.train_images.float() / 255, data.train_labels

    def step():
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"], foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with CountOps() as c:
        for _ in range(steps):
            step()
    return c.n / steps


# ---- the counter counts ----

def test_the_counter_sees_a_linear_layers_kernels_and_not_its_views():
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with CountOps() as c:
        layer(x).sum().backward()
    # forward: addmm (the weight's transpose is a view), sum; backward: the ones of the sum's
    # gradient (expanded: a view), mm for the weight's gradient, sum for the bias's
    assert c.names["addmm"] == 1, dict(c.names)
    assert c.names["mm"] >= 1 and c.names["sum"] >= 2, dict(c.names)
    assert not VIEWS & set(c.names), dict(c.names)
    assert 4 <= c.n <= 12, dict(c.names)
    with CountOps() as c:
        x.view(4, 2).t().unsqueeze(0).expand(3, 2, 4)[1:, :, ::2]
    assert c.n == 0, dict(c.names)


# ---- the gates: what the trainer's rework aims at (they may fail until it lands) ----

def test_one_vit_t2_step_launches_at_most_15_percent_more_kernels_than_a_plain_step():
    ours = ours_per_step("cifar10", 1, depth=VIT_T2_DEPTH)
    plain = plain_per_step("cifar10", depth=VIT_T2_DEPTH)
    assert ours <= 1.15 * plain, (ours, plain)


def test_a_stack_of_30_digits_models_launches_at_most_30_more_kernels_than_a_stack_of_2():
    two = ours_per_step("digits", 2)
    thirty = ours_per_step("digits", 30)
    assert thirty <= two + 30, (thirty, two)


def test_a_stack_of_2_digits_models_launches_at_most_twice_a_plain_step():
    two = ours_per_step("digits", 2)
    plain = plain_per_step("digits")
    assert two <= 2 * plain, (two, plain)
