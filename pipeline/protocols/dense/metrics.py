"""Dense metrics, as the benchmarks compute them, over every scored pixel of a test set."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from pipeline.errors import DataValidationError

__all__ = ["ANGLE_THRESHOLDS", "NORMAL_METRICS", "SEGMENTATION_METRICS", "angular_errors", "check_scores",
           "confusion_matrix", "normals_metrics", "score_from_counts", "segmentation_metrics"]

#: The thresholds of the "within" fractions, in degrees.
ANGLE_THRESHOLDS = (11.25, 22.5, 30.0)
#: Metric names of the normals protocol, and whether each is a fraction (logit before
#: correlating) or an angle where lower is better (negated, not transformed).
NORMAL_METRICS = {"mean_angle_error": "lower", "median_angle_error": "lower", "within_11_25": "fraction",
                  "within_22_5": "fraction", "within_30": "fraction"}
SEGMENTATION_METRICS = {"miou": "fraction", "pixel_accuracy": "fraction"}
_WITHIN = ("within_11_25", "within_22_5", "within_30")


def angular_errors(pred: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Angle in degrees between predicted and true normals at every valid pixel, in order."""
    p = np.asarray(pred, dtype=np.float64).reshape(-1, 3)
    g = np.asarray(target, dtype=np.float64).reshape(-1, 3)
    g_norm = np.linalg.norm(g, axis=1)
    valid = g_norm > 0
    p, g = p[valid], g[valid] / g_norm[valid, None]
    p = p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), np.finfo(np.float64).tiny)
    return np.degrees(np.arccos(np.clip(np.einsum("ij,ij->i", p, g), -1.0, 1.0)))


def normals_metrics(errors: np.ndarray) -> dict[str, float]:
    """Mean and median angular error (degrees) and the fractions within each threshold."""
    e = np.asarray(errors, dtype=np.float64)
    if e.size == 0:
        raise DataValidationError("the test targets have no valid normal: no angular error can be computed")
    out = {"mean_angle_error": float(e.mean()), "median_angle_error": float(np.median(e))}
    out.update({name: float(np.mean(e < t)) for name, t in zip(_WITHIN, ANGLE_THRESHOLDS)})
    out["valid_pixels"] = int(e.size)
    return out


def confusion_matrix(pred: np.ndarray, target: np.ndarray, n_classes: int, ignore_index: int) -> np.ndarray:
    """Counts ``C[t, p]`` of pixels with true class t predicted as p, ignored pixels left out."""
    t = np.asarray(target).ravel().astype(np.int64)
    p = np.asarray(pred).ravel().astype(np.int64)
    keep = t != ignore_index
    t, p = t[keep], p[keep]
    if p.size and (p.min() < 0 or p.max() >= n_classes):
        raise DataValidationError(f"predictions hold class {int(p.max())}; classes are 0 to {n_classes - 1}")
    return np.bincount(t * n_classes + p, minlength=n_classes * n_classes).reshape(n_classes, n_classes)


def segmentation_metrics(conf: np.ndarray) -> dict[str, float | int | list]:
    """mIoU over the classes present in the ground truth or the predictions, and pixel accuracy."""
    conf = np.asarray(conf, dtype=np.int64)
    tp = np.diag(conf)
    union = conf.sum(axis=0) + conf.sum(axis=1) - tp
    total = int(conf.sum())
    if total == 0:
        raise DataValidationError("the test targets have no labelled pixel: mIoU and pixel accuracy are undefined")
    present = union > 0
    iou = np.where(present, tp / np.maximum(union, 1), np.nan)
    return {"miou": float(np.mean(iou[present])), "pixel_accuracy": float(tp.sum() / total),
            "iou": [None if not ok else float(v) for v, ok in zip(iou, present)],
            "classes_scored": int(present.sum()), "labelled_pixels": total}


def score_from_counts(metric: str, summed: np.ndarray) -> np.ndarray:
    """A metric of summed per-image counts, for many weightings at once (bootstrap rows)."""
    s = np.asarray(summed, dtype=np.float64)
    if metric == "miou":
        tp, fp, fn = s[..., 0], s[..., 1], s[..., 2]
        union = tp + fp + fn
        present = union > 0
        iou = np.where(present, tp / np.where(present, union, 1.0), 0.0)
        return iou.sum(axis=-1) / np.maximum(present.sum(axis=-1), 1)
    if metric == "pixel_accuracy":
        tp, fn = s[..., 0].sum(axis=-1), s[..., 2].sum(axis=-1)
        return tp / np.maximum(tp + fn, 1.0)
    if metric in _WITHIN:
        return s[..., 1 + _WITHIN.index(metric)] / np.maximum(s[..., 0], 1.0)
    raise DataValidationError(f"no per-image counts give metric {metric!r}; metrics: miou, pixel_accuracy, "
                              f"{', '.join(_WITHIN)}")


def check_scores(metrics: Mapping[str, float], names: Iterable[str]) -> None:
    """Refuse a metric that is not a finite number (nothing uncomputable is recorded as a score)."""
    for name in names:
        value = metrics.get(name)
        if not isinstance(value, float) or not np.isfinite(value):
            raise DataValidationError(f"metric {name!r} is {value!r}, not a finite number")
