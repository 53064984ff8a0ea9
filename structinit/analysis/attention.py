"""Attention maps of a timm ViT: how much mass sits on each head's impulse offset, and how far
(in patches) each head looks on average.

Used by the tests to prove the structured init does what it claims, and by reports.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from structinit.models.vit import check_structured_vit, check_vit, patch_grid_of, position_tokens


@dataclass
class AttentionMaps:
    """maps[l, h] is the patch-to-patch block of the attention map: queries and keys are the N
    grid tokens. A model with prefix tokens (class, register) attends to them as well, so there
    a row sums to 1 minus the mass its query puts on the prefix tokens (`prefix_mass`)."""
    maps: torch.Tensor          # (L, H, N, N), averaged over images when images were given
    patch_grid: tuple[int, int]
    offsets: list | None        # offsets[l][h] = (m, n), or None when unknown
    prefix_mass: torch.Tensor | None = None   # (L, H) mean mass a patch query puts on the prefix
                                              # tokens; None for a model without them

    def offset_mass(self) -> torch.Tensor:
        """(L, H, 2*gh-1, 2*gw-1): mean mass a query puts on the key at offset (m, n).

        Index [.., m + gh - 1, n + gw - 1]; averaged over queries whose shifted key is on
        the grid, so every offset is compared on equal terms.
        """
        gh, gw = self.patch_grid
        # index tensors on the maps' device: a CPU index into CUDA maps is a device mismatch
        i, j = _grid_positions(gh, gw, self.maps.device)       # (N,) each
        m = torch.arange(-gh + 1, gh, device=i.device)[:, None, None]   # (2gh-1, 1, 1)
        n = torch.arange(-gw + 1, gw, device=i.device)[None, :, None]   # (1, 2gw-1, 1)
        i2, j2 = i + m, j + n                                  # (2gh-1, 2gw-1, N)
        inside = (i2 >= 0) & (i2 < gh) & (j2 >= 0) & (j2 < gw)
        cols = (i2.clamp(0, gh - 1) * gw + j2.clamp(0, gw - 1))
        rows = (i * gw + j).expand_as(cols)
        picked = self.maps[..., rows, cols] * inside           # (L, H, 2gh-1, 2gw-1, N)
        return picked.sum(-1) / inside.sum(-1)

    def mean_distance(self) -> torch.Tensor:
        """(L, H): mean attention distance in patches, sum_j a_ij * ||p_i - p_j|| averaged over
        queries i (p = (row, col) on the patch grid). 0 = every query attends to itself; a
        head that is a pure shift by (m, n) gives sqrt(m^2 + n^2)."""
        i, j = _grid_positions(*self.patch_grid, self.maps.device)
        pos = torch.stack([i, j], -1).float()                               # (N, 2)
        dist = torch.cdist(pos, pos)                                        # (N, N)
        return (self.maps * dist).sum(-1).mean(-1)

    def target_mass(self) -> torch.Tensor:
        """(L, H): mass on each head's own offset (needs offsets)."""
        if self.offsets is None:
            raise ValueError("no offsets known for this model: pass offsets= to attention_maps")
        gh, gw = self.patch_grid
        prof = self.offset_mass()                               # (L, H, 2gh-1, 2gw-1)
        # one gather on the maps' device (no host read per head); offsets are host data
        rows = [[m + gh - 1 for m, _ in layer] for layer in self.offsets]
        cols = [[n + gw - 1 for _, n in layer] for layer in self.offsets]
        at = lambda idx: torch.tensor(idx, device=prof.device)  # noqa: E731
        L, H = prof.shape[:2]
        return prof[torch.arange(L, device=prof.device)[:, None], torch.arange(H, device=prof.device)[None, :],
                    at(rows), at(cols)]


@torch.no_grad()
def attention_maps(model, images: torch.Tensor | None = None, offsets=None) -> AttentionMaps:
    """Per-layer, per-head N x N attention maps.

    images=None: each block's attention on the pseudo-input, i.e. block.norm1 applied to the
    model's position encoding (what the structured init was solved on), with the prefix tokens
    in front when the model has them (models.vit.position_tokens). With images, the maps each
    block computes in a real forward pass, averaged over the batch.
    offsets: offsets[l][h] = (m, n) of each head's impulse (InitRecord.offsets), for target_mass().
    """
    if images is None:
        check_structured_vit(model)        # the pseudo-input is the model's position encoding
        tokens = position_tokens(model)                         # (1, P + N, C)
        full = [_block_attention(block.attn, block.norm1(tokens))[0] for block in model.blocks]
    else:
        check_vit(model)
        inputs = []
        eval_forward_with_hooks(model, images, lambda block: block.attn.register_forward_pre_hook(
            lambda m, args: inputs.append(args[0])))
        full = [_block_attention(b.attn, x).mean(0) for b, x in zip(model.blocks, inputs)]
    full = torch.stack(full).float()                            # (L, H, P + N, P + N)
    P = model.num_prefix_tokens
    # The prefix tokens have no place on the grid: keep the patch-to-patch block, and say how
    # much of each patch query's attention went to the prefix tokens instead.
    prefix_mass = full[..., P:, :P].sum(-1).mean(-1) if P else None
    return AttentionMaps(full[..., P:, P:], patch_grid_of(model), offsets, prefix_mass)


def eval_forward_with_hooks(model, images: torch.Tensor, register) -> None:
    """model(images) in eval mode with the hook register(block) adds to every block; the
    hooks are removed and the train/eval mode restored afterwards, even on error."""
    handles = [register(block) for block in model.blocks]
    was_training = model.training
    try:
        model.eval()
        model(images)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()


def _grid_positions(gh: int, gw: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of each of the gh*gw tokens in raster order, on `device`: (N,), (N,)."""
    i, j = torch.meshgrid(torch.arange(gh, device=device), torch.arange(gw, device=device), indexing="ij")
    return i.flatten(), j.flatten()


def _block_attention(attn, x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, N) softmax(q k^T * scale) of one timm Attention on its input x (B, N, C)."""
    B, N, C = x.shape
    qkv = attn.qkv(x).reshape(B, N, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    return (q @ k.transpose(-2, -1) * attn.scale).softmax(-1)
