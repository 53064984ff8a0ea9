"""What a ViT's attention and representations look like: the numbers behind reports/attention.md.

    analyze_model(model, images, offsets) -> ModelAnalysis   one model (at init or trained)
    test_batch(data, count)      -> (B, C, H, W)     the first `count` test images, normalized

A ModelAnalysis keeps, per block and head, the *offset profile* (mean attention a query puts on
the key at each relative offset (m, n): the translation-averaged attention map, where an
impulse head is one bright pixel at its offset), the mean attention distance, and the mass on
the head's impulse offset when the model has one; each on the pseudo-input (what the structured
init was solved on) and averaged over real images. It also keeps each block's token-mean
output on the images, for CKA between models, and each block's Q and K weight norms (a sharper
attention map at init comes from larger Q/K weights: the regime study sets them side by side).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from structinit.analysis.attention import attention_maps
from structinit.analysis.cka import layer_representations


@dataclass
class ModelAnalysis:
    profile_pseudo: torch.Tensor      # (L, H, 2gh-1, 2gw-1) offset profile on the pseudo-input
    profile_images: torch.Tensor      # (L, H, 2gh-1, 2gw-1) ... averaged over the images
    distance_pseudo: torch.Tensor     # (L, H) mean attention distance in patches
    distance_images: torch.Tensor     # (L, H)
    target_pseudo: torch.Tensor | None   # (L, H) mass on the head's impulse offset (None: no offsets)
    target_images: torch.Tensor | None
    offsets: list | None              # offsets[l][h] = (m, n) of the structured init, else None
    representations: torch.Tensor     # (L, B, C) each block's output, mean over tokens
    qk_norm: torch.Tensor | None = None   # (L, 2) Frobenius norms of W_q, W_k (None: analyses before it)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelAnalysis":
        d = dict(d)
        if d["offsets"] is not None:
            d["offsets"] = [[tuple(o) for o in layer] for layer in d["offsets"]]
        return cls(**d)


def test_batch(data, count: int | None) -> torch.Tensor:
    """The first `count` test images (all when None), normalized as the trainer normalizes them."""
    x = data.test_images[:count].float()
    mean = torch.tensor(data.spec.mean).view(1, -1, 1, 1) * 255
    std = torch.tensor(data.spec.std).view(1, -1, 1, 1) * 255
    return (x - mean) / std


@torch.no_grad()
def analyze_model(model, images: torch.Tensor, offsets: list | None = None,
                  batch_size: int = 256) -> ModelAnalysis:
    """Attention statistics of `model` on the pseudo-input and on `images` (B, C, H, W), in
    batches of `batch_size` (maps are averaged over all images, weighting every image alike).
    offsets: the structured init's (InitRecord.offsets), for the mass on each head's offset."""
    pseudo = attention_maps(model, offsets=offsets)
    chunks = images.split(batch_size)
    on_images = [attention_maps(model, x, offsets=pseudo.offsets) for x in chunks]
    weights = [len(x) / len(images) for x in chunks]
    real = on_images[0]
    real.maps = sum(w * a.maps for w, a in zip(weights, on_images))
    reps = [torch.cat(layer) for layer in zip(*(layer_representations(model, x) for x in chunks))]
    has_offsets = pseudo.offsets is not None
    return ModelAnalysis(
        profile_pseudo=pseudo.offset_mass(), profile_images=real.offset_mass(),
        distance_pseudo=pseudo.mean_distance(), distance_images=real.mean_distance(),
        target_pseudo=pseudo.target_mass() if has_offsets else None,
        target_images=real.target_mass() if has_offsets else None,
        offsets=pseudo.offsets, representations=torch.stack(reps), qk_norm=qk_weight_norms(model))


def qk_weight_norms(model) -> torch.Tensor:
    """(L, 2): the Frobenius norm of each block's query and key projection, W_q and W_k (timm's
    fused qkv weight (3C, C) holds them as its first two C-row slices)."""
    rows = []
    for block in model.blocks:
        w = block.attn.qkv.weight.detach().float()
        c = w.shape[1]
        rows.append(torch.stack([w[:c].norm(), w[c:2 * c].norm()]))
    return torch.stack(rows).cpu()
