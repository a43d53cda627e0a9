"""PASCAL VOC 2007 11-point average precision, in the conventions that are in use.

Each averages, over 11 recall thresholds t (0, 0.1, ..., 1 as its reference code computes
them in floating point), the largest precision reached at a recall of at least t (0 when
none is). They differ in the precision-recall points, in "difficult" images and in those
thresholds:

- ``seed`` (metric ``map11``): Ericsson et al.'s code (linusericsson/ssl-transfer,
  ``voc_eval_cls``), the number the seed paper reports. The points are scikit-learn's
  ``precision_recall_curve`` of the scores: one point per distinct score (tied scores
  enter together), plus the final recall-0 / precision-1 point, so t = 0 always finds
  precision 1. Their VOC loader turns every label but "present" into 0, so a
  "difficult" image counts as a negative. A class without a positive test image gets
  what that code gives it, 1/11 (only the appended point reaches any threshold).
  Thresholds: ``numpy.linspace(0, 1, 11)`` (``NUMPY_THRESHOLDS``).
- ``devkit`` (metric ``map11_devkit``): the VOC devkit's own MATLAB evaluation
  (``VOCevalcls.m``). Images are ranked one by one (a stable sort: tied scores keep their
  stored order), no point is appended, "difficult" images are left out of the class's
  ranking, and a class without a positive has no AP (left out of the mean). Thresholds:
  MATLAB's ``0:0.1:1`` (``DEVKIT_THRESHOLDS``), which counts its second half back from the
  end, so 0.6 and 0.7 are the doubles nearest to them.
- ``devkit_numpy``: the devkit's points with ``numpy.arange(0, 1.1, 0.1)`` as thresholds,
  as the Python ports (py-faster-rcnn's ``voc_eval.py``) write it: 0.6000000000000001
  and 0.7000000000000001, so a recall of exactly 0.6 or 0.7 misses the threshold of that
  name where MATLAB's reaches it.

Label encoding (the store's multi-label arrays): 1 present, 0 absent, -1 difficult.
"""

from __future__ import annotations

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.inputs.labels import check_multilabel

__all__ = ["CONVENTIONS", "DEVKIT_THRESHOLDS", "NUMPY_THRESHOLDS", "devkit_average_precision",
           "matlab_colon", "mean_average_precision_11", "seed_average_precision"]


def matlab_colon(start: float, step: float, stop: float) -> np.ndarray:
    """MATLAB's ``start:step:stop`` bit for bit: the first half counted from ``start``, the
    second half back from the last element, and (an even number of steps) the middle element
    the midpoint of the two ends."""
    tol = 2 * np.finfo(float).eps * max(abs(start), abs(stop))
    n = int(np.floor((stop - start) / step + tol))
    reached = start + n * step
    last = stop if abs(reached - stop) <= tol else reached  # the end the steps reach
    k = np.arange(n // 2 + 1)
    out = np.empty(n + 1)
    out[k] = start + k * step
    out[n - k] = last - k * step
    if n % 2 == 0:
        out[n // 2] = (start + last) / 2
    return out


#: The seed's thresholds, ``numpy.linspace(0, 1, 11)`` (equal bit for bit to ``numpy.arange(0, 1.1, 0.1)``).
NUMPY_THRESHOLDS = np.linspace(0.0, 1.0, 11)
#: The VOC devkit's thresholds, MATLAB's ``0:0.1:1``.
DEVKIT_THRESHOLDS = matlab_colon(0.0, 0.1, 1.0)
CONVENTIONS = ("seed", "devkit", "devkit_numpy")


def _check_1d(scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels)
    if scores.shape != labels.shape or scores.ndim != 1:
        raise DataValidationError(f"scores {scores.shape} and labels {labels.shape} must be equal 1-D shapes")
    if not np.all(np.isfinite(scores)):
        raise DataValidationError("scores contain NaN or inf; average precision needs finite scores")
    return scores, labels


def _eleven_point(precision: np.ndarray, recall: np.ndarray, thresholds: np.ndarray) -> float:
    """Mean over the 11 thresholds of max precision at recall >= t (0 when none)."""
    total = 0.0
    for t in thresholds:
        reached = recall >= t
        total += (float(np.max(precision[reached])) if reached.any() else 0.0) / 11.0
    return total


def seed_average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """11-point AP of one class as Ericsson et al.'s code computes it (the ``seed`` convention)."""
    # The precision-recall points are those of scikit-learn's ``precision_recall_curve``:
    # the images sorted by decreasing score, one point at the last image of each distinct
    # score, precision = true positives / images so far, recall = true positives / all
    # positives, and the appended point (recall 0, precision 1).
    scores, labels = _check_1d(scores, labels)
    if scores.size == 0:
        raise DataValidationError("no image to rank: average precision needs at least one")
    order = np.argsort(scores, kind="mergesort")[::-1]
    ranked, positive = scores[order], (labels[order] == 1).astype(np.float64)
    last = np.r_[np.flatnonzero(np.diff(ranked)), ranked.size - 1]  # last image of each distinct score
    tps = np.cumsum(positive)[last]
    seen = last + 1.0
    precision = tps / seen
    # no positive: scikit-learn sets every recall to 1
    recall = tps / tps[-1] if tps[-1] > 0 else np.ones_like(tps)
    return _eleven_point(np.r_[precision, 1.0], np.r_[recall, 0.0], NUMPY_THRESHOLDS)


def devkit_average_precision(scores: np.ndarray, labels: np.ndarray, thresholds: str = "matlab") -> float:
    """11-point AP of one class as the VOC devkit computes it (the ``devkit`` convention)."""
    scores, labels = _check_1d(scores, labels)
    keep = labels >= 0
    positive = labels[keep] == 1
    n_pos = int(positive.sum())
    if n_pos == 0:
        return float("nan")
    ranked = positive[np.argsort(-scores[keep], kind="stable")]
    tp = np.cumsum(ranked)
    return _eleven_point(tp / np.arange(1, ranked.size + 1), tp / n_pos,
                         DEVKIT_THRESHOLDS if thresholds == "matlab" else NUMPY_THRESHOLDS)


def mean_average_precision_11(scores: np.ndarray, labels: np.ndarray,
                              convention: str = "seed") -> tuple[float, np.ndarray]:
    """Mean of the per-class 11-point APs in one ``convention`` (see the module docstring)."""
    if convention not in CONVENTIONS:
        raise DataValidationError(f"convention {convention!r} is not one of {', '.join(CONVENTIONS)}")
    labels = check_multilabel(labels, name="labels", difficult=True)
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != labels.shape:
        raise DataValidationError(f"scores {scores.shape} and labels {labels.shape} must have the same shape")
    def ap(column: int) -> float:
        if convention == "seed":
            return seed_average_precision(scores[:, column], labels[:, column])
        return devkit_average_precision(scores[:, column], labels[:, column],
                                        "matlab" if convention == "devkit" else "numpy")

    per_class = np.array([ap(c) for c in range(labels.shape[1])])
    scored = per_class[~np.isnan(per_class)]
    if scored.size == 0:
        raise DataValidationError("no class has a positive image: mean average precision is undefined")
    return float(scored.mean()), per_class
