"""Average precision as the PASCAL VOC 2007 devkit computes it for classification.

Per class, the images are ranked by decreasing score (ties keep their order, as a stable
sort does); precision and recall are accumulated down the ranking, and the 11-point
average precision is the mean, over recall thresholds t = 0, 0.1, ..., 1, of the
largest precision reached at a recall of at least t (0 when no such point exists).
Images whose only objects of the class are marked "difficult" are neither positives nor
negatives: they are left out of the ranking for that class.

Label encoding (the store's multi-label arrays): 1 present, 0 absent, -1 difficult.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import DataValidationError

#: Recall thresholds 0, 0.1, ..., 1 as the decimal values (k / 10), not as a running sum
#: of 0.1 (whose third value, 0.30000000000000004, would miss a recall of exactly 0.3).
RECALL_POINTS = np.arange(11) / 10.0


def check_multilabel(labels: np.ndarray, name: str = "labels") -> np.ndarray:
    """``labels`` as int64 (n, C) with values in {-1, 0, 1}, else DataValidationError.

    Parameters
    ----------
    labels : numpy.ndarray
        Multi-label rows: 1 present, 0 absent, -1 difficult.
    name : str
        The array's name in messages.

    Returns
    -------
    numpy.ndarray
    """
    arr = np.asarray(labels)
    if arr.ndim != 2 or arr.dtype.kind not in "iub":
        raise DataValidationError(f"{name} must be an integer (n, C) multi-label array, got {arr.dtype} {arr.shape}")
    arr = arr.astype(np.int64)
    bad = ~np.isin(arr, (-1, 0, 1))
    if bad.any():
        i, c = np.argwhere(bad)[0]
        raise DataValidationError(f"{name}[{i}, {c}] = {arr[i, c]}; multi-label entries are 1 (present), "
                                  "0 (absent) or -1 (difficult)")
    return arr


def voc07_average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """11-point average precision of one class.

    Parameters
    ----------
    scores : (n,) float, higher means more confident the class is present.
    labels : (n,) int, 1 present, 0 absent, -1 difficult (left out).

    Returns
    -------
    float
        The devkit's 11-point AP; NaN when no image is a positive (the devkit would
        report 0, which says nothing about the classifier).
    """
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels)
    if scores.shape != labels.shape or scores.ndim != 1:
        raise DataValidationError(f"scores {scores.shape} and labels {labels.shape} must be equal 1-D shapes")
    keep = labels >= 0
    positive = labels[keep] == 1
    n_pos = int(positive.sum())
    if n_pos == 0:
        return float("nan")
    ranked = positive[np.argsort(-scores[keep], kind="stable")]
    tp = np.cumsum(ranked)
    precision = tp / np.arange(1, ranked.size + 1)
    recall = tp / n_pos
    # the best precision at recall >= t: a running maximum from the end of the ranking
    best_from = np.maximum.accumulate(precision[::-1])[::-1]
    first = np.searchsorted(recall, RECALL_POINTS, side="left")  # recall is non-decreasing
    reached = first < ranked.size
    return float(np.where(reached, best_from[np.minimum(first, ranked.size - 1)], 0.0).mean())


def voc07_mean_average_precision(scores: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean of the per-class 11-point APs over the classes with a positive image.

    Parameters
    ----------
    scores : (n, C) float.
    labels : (n, C) int, 1 / 0 / -1 as above.

    Returns
    -------
    (float, ndarray)
        The mAP and the (C,) per-class APs (NaN for a class without positives).
    """
    labels = check_multilabel(labels)
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != labels.shape:
        raise DataValidationError(f"scores {scores.shape} and labels {labels.shape} must have the same shape")
    per_class = np.array([voc07_average_precision(scores[:, c], labels[:, c]) for c in range(labels.shape[1])])
    scored = per_class[~np.isnan(per_class)]
    if scored.size == 0:
        raise DataValidationError("no class has a positive image: mean average precision is undefined")
    return float(scored.mean()), per_class
