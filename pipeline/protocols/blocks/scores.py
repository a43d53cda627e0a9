"""Block-wise predictions from class scores, and the ``predict_rows`` mixin of linear probes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from pipeline.protocols.blocks.feature_rows import FeatureRows

__all__ = ["RowsPredictMixin", "predict_from_scores"]


def predict_from_scores(score_blocks: Iterable[tuple[Any, int]], n_rows: int, classes: np.ndarray,
                        multilabel: bool = False) -> np.ndarray:
    """Predictions from blocks of class scores: the best class, or scores > 0 for multi-label.

    Parameters
    ----------
    score_blocks : iterable of (torch.Tensor, int)
        (scores (b, K), start) covering rows 0 .. n_rows - 1.
    n_rows : int
        Rows in all.
    classes : numpy.ndarray
        Label of each score column.
    multilabel : bool
        Return (n_rows, K) 0/1 indicators instead of labels.

    Returns
    -------
    numpy.ndarray
        (n_rows,) labels (the first class on exact ties) or (n_rows, K) indicators.
    """
    import torch

    out = np.empty((n_rows, len(classes)) if multilabel else n_rows,
                   dtype=np.int64 if multilabel else np.intp)
    for scores, start in score_blocks:
        best = (scores > 0).to(torch.int64) if multilabel else torch.argmax(scores, dim=1)
        out[start:start + scores.shape[0]] = best.cpu().numpy()
    return out if multilabel else classes[out]


class RowsPredictMixin:
    """``predict_rows`` for a fitted linear probe with ``score_blocks``, ``classes_``, ``multilabel_``."""

    def predict_rows(self, rows: FeatureRows) -> np.ndarray:
        """``predict`` over ``FeatureRows``, block by block.

        Parameters
        ----------
        rows : FeatureRows

        Returns
        -------
        numpy.ndarray
            (n,) labels, or (n, K) indicators for multi-label.
        """
        return predict_from_scores(self.score_blocks(rows), len(rows), self.classes_, self.multilabel_)
