"""Test loss and accuracy of every model of a stack, on the device.

    evaluate_stack(stack, images, labels, ...)   -> one {"test_loss", "test_acc"} per model

The sums stay on the device until the loop ends (evaluation_sums): a read per batch would be a
host sync per batch on a GPU.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from structinit.training.batches import BatchAugmentation
from structinit.training.common import autocast
from structinit.training.stacked import StackedModels


@torch.no_grad()
def evaluate_stack(stack: StackedModels, images: torch.Tensor, labels: torch.Tensor, *,
                   augmentation: BatchAugmentation, device: torch.device, dtype: str,
                   batch_size: int = 1024) -> list[dict]:
    """Each stacked model's {"test_loss", "test_acc"}."""
    loss_sum, correct = evaluation_sums(stack, images, labels, augmentation=augmentation, device=device,
                                        dtype=dtype, batch_size=batch_size)
    n = len(labels)
    return [{"test_loss": loss / n, "test_acc": c / n}          # the one host read, after the loop
            for loss, c in zip(loss_sum.tolist(), correct.tolist())]


@torch.no_grad()
def evaluation_sums(stack: StackedModels, images: torch.Tensor, labels: torch.Tensor, *,
                    augmentation: BatchAugmentation, device: torch.device, dtype: str,
                    batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Each model's summed test loss (N,) and correct count (N,), on the device."""
    stack.eval()
    loss_sum = torch.zeros(stack.n, device=device)
    correct = torch.zeros(stack.n, device=device, dtype=torch.long)
    for i in range(0, len(labels), batch_size):
        x, y = augmentation.normalize(images[i:i + batch_size]), labels[i:i + batch_size]
        with autocast(device, dtype):
            logits = stack(x, shared_input=True)                   # (N, B, classes)
        y = y.expand(stack.n, -1)
        loss_sum += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(),
                                    reduction="none").view(y.shape).sum(1)
        correct += (logits.argmax(-1) == y).sum(1)
    stack.train()
    return loss_sum, correct
