"""Peak host memory of one dense cell, from its shapes (a map of h x w cells is ``n_tokens``).

A dense cell holds every split's maps as stored and their targets, the test predictions
at the targets' resolution (kept as the cell's maps), the metric's work (per-image
confusion matrices; every valid pixel's angular error in float64 for the median), the
channel statistics' block, and one minibatch's activations with their gradients (the
standardised maps, the head's outputs on the grid and upsampled to the targets, the
softmax or normalisation). The model is a little high rather than low, for scheduling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.protocols.cell import CellShape

__all__ = ["normals_memory", "segmentation_memory"]

_F4, _F8 = 4, 8
_RUNTIME = 64 << 20  # torch's allocator and library slack of one run
_STAT_ROWS = 64  # as in training.channel_stats


def _common(c: CellShape, s: Mapping[str, Any], target_bytes: int, out_channels: int, hidden: int) -> int:
    rows = c.n_train + c.n_val + c.n_test
    held = rows * c.n_tokens * c.dim * c.itemsize + rows * c.target_pixels * target_bytes
    predictions = c.n_test * c.target_pixels * target_bytes
    B = int(s.get("batch_size", 16))
    per_image = (c.n_tokens * (3 * c.dim + 3 * hidden + 2 * out_channels) + 5 * out_channels * c.target_pixels
                 + 2 * c.target_pixels) * _F4
    stats = min(_STAT_ROWS, max(c.n_train, 1)) * c.n_tokens * c.dim * _F8 * 3
    params = (c.dim * (9 if hidden else 1) * max(hidden, out_channels) + hidden * out_channels) * _F4 * 4
    return held + predictions + B * per_image + stats + params + _RUNTIME


def segmentation_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The linear segmentation head: uint8 targets and predictions, per-image counts.

    Parameters
    ----------
    c : CellShape
    s : mapping
        Full settings.

    Returns
    -------
    int
    """
    K = c.n_classes
    metric = c.target_pixels * _F8 * 4 + c.n_test * K * 3 * _F8 + K * K * _F8 * 2
    return _common(c, s, 1, K, 0) + metric


def normals_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The normals head: float16 unit-vector targets and predictions, every valid test
    pixel's angular error (float64) for the median.

    Parameters
    ----------
    c : CellShape
    s : mapping
        Full settings.

    Returns
    -------
    int
    """
    hidden = int(s.get("hidden_units", 256)) if s.get("head", "conv") == "conv" else 0
    errors = c.n_test * c.target_pixels * _F8 * 2 + c.target_pixels * 3 * _F8 * 4
    return _common(c, s, 6, 3, hidden) + errors
