"""Nearest class mean (Mensink et al. 2013): each query takes the class of the nearest train mean."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pipeline.errors import DataValidationError, unknown_name
from pipeline.protocols.blocks import FeatureRows, block_rows, predict_from_scores
from pipeline.protocols.transforms.transformers import l2_normalize_block

__all__ = ["NCM_METRICS", "class_means", "ncm_predict", "ncm_score_blocks"]

#: The ``metric`` setting's choices.
NCM_METRICS = ("cosine", "euclidean")


def _check_metric(metric: str) -> None:
    if metric not in NCM_METRICS:
        raise unknown_name("metric", metric, NCM_METRICS)


def class_means(rows: FeatureRows, y: np.ndarray, n_classes: int, metric: str = "euclidean",
                device: Any = None) -> torch.Tensor:
    """The mean of each class's train rows (L2-normalised rows for ``cosine``), in float64."""
    _check_metric(metric)
    y = np.asarray(y, dtype=np.int64)
    if len(y) != len(rows):
        raise DataValidationError(f"{len(y)} labels for {len(rows)} train rows")
    sums = torch.zeros((n_classes, rows.n_features), dtype=torch.float64, device=device)
    for H, start in rows.blocks(device, torch.float64):
        if metric == "cosine":
            H = l2_normalize_block(H, start, "train features")
        sums.index_add_(0, torch.as_tensor(y[start:start + H.shape[0]], device=sums.device), H)
    counts = np.bincount(y, minlength=n_classes).astype(np.float64)
    counts[counts == 0] = np.nan  # no rows: no mean
    return sums / torch.as_tensor(counts, device=sums.device)[:, None]


def ncm_score_blocks(rows: FeatureRows, means: torch.Tensor, metric: str = "euclidean",
                     device: Any = None):
    """Yield (scores, start): larger is nearer, ``-inf`` for a class without a mean."""
    _check_metric(metric)
    absent = torch.isnan(means[:, 0])
    means = torch.nan_to_num(means, nan=0.0)
    if metric == "cosine":
        norms = torch.linalg.vector_norm(means, dim=1)
        means = means / torch.where(norms > 0, norms, 1.0)[:, None]
        offset = torch.zeros(len(means), dtype=torch.float64, device=means.device)
    else:
        offset = (means * means).sum(dim=1)
    offset = torch.where(absent, torch.inf, offset)
    scale = 1.0 if metric == "cosine" else 2.0
    step = block_rows(max(rows.n_features, len(means)), device)
    for Q, start in rows.blocks(device, torch.float64, rows=step):
        if metric == "cosine":
            Q = l2_normalize_block(Q, start, "query")
        yield scale * (Q @ means.T) - offset, start


def ncm_predict(rows: FeatureRows, means: torch.Tensor, metric: str = "euclidean",
                device: Any = None) -> np.ndarray:
    """The class index of the nearest mean for every query row, ties to the smallest index."""
    return predict_from_scores(ncm_score_blocks(rows, means, metric, device), len(rows), np.arange(len(means)))
