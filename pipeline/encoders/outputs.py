"""How one block's output becomes stored features: a pooled vector, tokens, or a map."""

from __future__ import annotations

import torch
from torch import Tensor

from pipeline.errors import DataValidationError

__all__ = ["grid_map", "pooled", "tokens_of"]


def pooled(t: Tensor) -> Tensor:
    """One vector per image: spatial mean of NCHW maps, token mean of NLC, as-is for (n, d)."""
    if t.ndim == 4:
        return t.mean(dim=(2, 3))
    if t.ndim == 3:
        return t.mean(dim=1)
    return t


def tokens_of(spatial: Tensor, prefix: Tensor | None) -> Tensor:
    """(n, T, d) tokens: the prefix tokens, then NCHW maps as H*W tokens (row-major), NLC as is."""
    if spatial.ndim == 4:
        spatial = spatial.flatten(2).transpose(1, 2)
    elif spatial.ndim == 2:
        spatial = spatial[:, None]
    return spatial if prefix is None else torch.cat([prefix, spatial], dim=1)


def grid_map(spatial: Tensor, layer: str) -> Tensor:
    """(n, h, w, d) channels-last map of an NCHW output (a ViT's patch tokens come as NCHW too)."""
    if spatial.ndim != 4:
        raise DataValidationError(f"layer {layer!r}: the model's output there has shape {tuple(spatial.shape)}, "
                                  "not a spatial (n, d, h, w) map; use a block whose output is a feature map")
    return spatial.permute(0, 2, 3, 1)
