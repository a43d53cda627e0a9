"""Scores shared by the protocols."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CLASS_METRICS", "MULTILABEL_METRICS", "accuracy_metrics", "average_precision", "mean_average_precision",
           "mean_per_class_accuracy", "multilabel_metrics", "top1"]

#: Scalar metrics of a single-label classifier's record, and of a multi-label probe's.
CLASS_METRICS = ("score", "top1", "mean_per_class")
MULTILABEL_METRICS = ("map11", "map11_devkit", "map")


def top1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Fraction of equal entries (NaN for no samples)."""
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred))) if len(y_true) else float("nan")


def mean_per_class_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Average over the classes present in ``y_true`` of their recall."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    classes, index = np.unique(y_true, return_inverse=True)
    hits = np.bincount(index, weights=(y_pred == y_true), minlength=classes.size)
    return float(np.mean(hits / np.bincount(index, minlength=classes.size)))


def accuracy_metrics(y_true: np.ndarray, y_pred: np.ndarray, mean_per_class: bool) -> dict[str, float]:
    """``top1``, ``mean_per_class`` and ``score``: the dataset's declared headline metric."""
    out = {"top1": top1(y_true, y_pred), "mean_per_class": mean_per_class_accuracy(y_true, y_pred)}
    out["score"] = out["mean_per_class"] if mean_per_class else out["top1"]
    return out


def average_precision(y_true: np.ndarray, scores: np.ndarray) -> float:
    """Average precision of one class: sum over thresholds of (R_n - R_(n-1)) P_n."""
    # Thresholds are the distinct scores, highest first (scikit-learn's
    # ``average_precision_score``, no interpolation).
    y_true = np.asarray(y_true).astype(bool)
    if not y_true.any():
        return float("nan")
    order = np.argsort(-np.asarray(scores), kind="stable")
    s, y = np.asarray(scores)[order], y_true[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), y.size - 1]  # last row of each threshold
    tps = np.cumsum(y)[last]
    precision = tps / (last + 1)
    recall = tps / tps[-1]
    return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def mean_average_precision(Y_true: np.ndarray, scores: np.ndarray) -> float:
    """Mean over classes (columns) with at least one relevant sample of ``average_precision``."""
    aps = [average_precision(Y_true[:, k], scores[:, k]) for k in range(Y_true.shape[1])]
    kept = [a for a in aps if a == a]
    return float(np.mean(kept)) if kept else float("nan")


def multilabel_metrics(Y_true: np.ndarray, scores: np.ndarray) -> dict[str, Any]:
    """VOC 2007's 11-point mean average precision of multi-label scores, both conventions."""
    # deferred: scikit-learn; the protocol families and the report import this module without it
    from pipeline.protocols.linear.average_precision import mean_average_precision_11
    from pipeline.protocols.inputs.labels import check_multilabel

    scores = np.asarray(scores, dtype=np.float64)
    labels = check_multilabel(Y_true, name="Y_true", difficult=True)
    value, per_class = mean_average_precision_11(scores, labels, "seed")
    devkit, _ = mean_average_precision_11(scores, labels, "devkit")
    aps = [average_precision(labels[keep, k] == 1, scores[keep, k])
           for k in range(labels.shape[1]) for keep in [labels[:, k] >= 0]]
    kept = [a for a in aps if a == a]
    return {"map11": value, "score": value, "map11_devkit": devkit,
            "map": float(np.mean(kept)) if kept else float("nan"),
            "ap11_per_class": [float(a) for a in per_class]}
