"""Scores shared by the protocols."""

from __future__ import annotations

import numpy as np


def top1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred))) if len(y_true) else float("nan")


def mean_per_class_accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    """Average over the classes present in ``y_true`` of their recall."""
    y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
    classes = np.unique(y_true)
    return float(np.mean([np.mean(y_pred[y_true == c] == c) for c in classes]))


def accuracy_metrics(y_true: np.ndarray, y_pred: np.ndarray, mean_per_class: bool) -> dict[str, float]:
    """``top1``, ``mean_per_class`` and ``score``: the dataset's declared headline metric."""
    out = {"top1": top1(y_true, y_pred), "mean_per_class": mean_per_class_accuracy(y_true, y_pred)}
    out["score"] = out["mean_per_class"] if mean_per_class else out["top1"]
    return out
