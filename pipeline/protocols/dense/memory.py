"""Peak host memory of one dense cell, from its shapes (a map of h x w cells is ``n_tokens``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.protocols.cell import CellShape
from pipeline.protocols.dense.codebook import CODEBOOK_SAMPLE
from pipeline.protocols.memory import F4, F8, SGD_COPIES, TRAINING_RUNTIME, features, matrix, parameters, peak, work

__all__ = ["normals_memory", "segmentation_memory"]

_STAT_ROWS = 64  # as in training.channel_stats


def _common(c: CellShape, s: Mapping[str, Any], target_bytes: int, out_channels: int, hidden: int,
            pyramid: bool = False) -> int:
    rows = c.n_train + c.n_val + c.n_test
    B = int(s.get("batch_size", 16))
    if pyramid:  # the branches upsampled, their concatenation with the map, the fuse's conv/norm/ReLU/dropout,
        # each with its gradient
        grid = 3 * c.dim + 2 * (c.dim + 4 * hidden) + 2 * 4 * hidden * 2 + 2 * 4 * hidden
        params = 4 * c.dim * hidden + 9 * (c.dim + 4 * hidden) * hidden + hidden * out_channels
    else:
        grid = 3 * c.dim + 3 * hidden
        params = c.dim * (9 if hidden else 1) * max(hidden, out_channels) + hidden * out_channels
    per_image = c.n_tokens * (grid + 2 * out_channels) + 5 * out_channels * c.target_pixels + 2 * c.target_pixels
    return peak(features=features(c, streams=False), targets=matrix(rows, c.target_pixels, itemsize=target_bytes),
                predictions=matrix(c.n_test, c.target_pixels, itemsize=target_bytes),
                minibatch=work(B * per_image),  # one batch's activations with their gradients, in float32
                channel_stats=matrix(min(_STAT_ROWS, max(c.n_train, 1)), c.n_tokens * c.dim, copies=3),
                parameters=parameters(params, SGD_COPIES), runtime=TRAINING_RUNTIME)


def segmentation_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The linear segmentation head: uint8 targets and predictions, per-image counts."""
    K = c.n_classes
    return peak(cell=_common(c, s, 1, K, 0), pixel_work=matrix(c.target_pixels, 4),
                per_image_counts=matrix(c.n_test, K, copies=3), confusion=matrix(K, K, copies=2))


def normals_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The normals head: float16 unit-vector targets and predictions, every valid test
    pixel's angular error (float64) for the median; in the classification formulation K
    logits per pixel, the codebook's fit and each batch's label assignment."""
    head = s.get("head", "pspnet")
    hidden = int(s.get("hidden_units", 512)) if head != "linear" else 0
    # every valid test pixel's angular error (float64, and its sorted copy for the median), one image's normals
    errors = matrix(c.n_test, c.target_pixels, copies=2) + matrix(c.target_pixels, 3, copies=4)
    if s.get("formulation", "classification") != "classification":
        return peak(cell=_common(c, s, 6, 3, hidden, head == "pspnet"), angular_errors=errors)
    K = int(s.get("clusters", 40))
    # the codebook's pixel sample and k-means' distances; per batch image the labels'
    # distances to every centre, the softmax and the weighted centres of the predictions
    return peak(cell=_common(c, s, 6, K, hidden, head == "pspnet"), angular_errors=errors,
                codebook=matrix(CODEBOOK_SAMPLE, 3 + 2 * K, copies=2),
                label_assignment=matrix(int(s.get("batch_size", 16)) * c.target_pixels, K + 3, copies=2, itemsize=F4))
