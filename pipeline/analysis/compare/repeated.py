"""Paired comparison of two encoders scored by several fits on the same test examples."""

from __future__ import annotations

import numpy as np

from pipeline.analysis.compare.paired import PairedComparison
from pipeline.analysis.compare.resampling import bootstrap_weight_blocks
from pipeline.analysis.compare.stats import check_probability, paired_t_test, percentile_interval
from pipeline.errors import DataValidationError

__all__ = ["compare_repeated"]

METRIC = "top1_mean_over_fits"


def _fits(values: object, name: str, n: int) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 2 or arr.shape[0] < 2 or arr.shape[1] != n:
        raise DataValidationError(
            f"{name} must be (fits, test examples) predictions with at least 2 fits and {n} examples, "
            f"got shape {arr.shape}; a single fit is compared with compare_predictions (McNemar)"
        )
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise DataValidationError(f"{name} must hold integer class indices, got dtype {arr.dtype}")
    return arr


def compare_repeated(
    y_true: object,
    predictions_a: object,
    predictions_b: object,
    *,
    n_resamples: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedComparison:
    """Compare two encoders' predictions from several paired fits on the same test examples."""
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise DataValidationError(f"n_resamples must be an integer >= 1, got {n_resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataValidationError(f"seed must be an integer >= 0, got {seed!r}")
    confidence = check_probability(confidence, "confidence")
    y = np.asarray(y_true)
    if y.ndim != 1 or y.size < 2 or y.dtype == bool or not np.issubdtype(y.dtype, np.integer):
        raise DataValidationError(f"y_true must be at least 2 integer class indices, got {y.dtype} {y.shape}")
    a = _fits(predictions_a, "predictions_a", y.size)
    b = _fits(predictions_b, "predictions_b", y.size)
    if a.shape != b.shape:
        raise DataValidationError(
            f"predictions_a has {a.shape[0]} fits but predictions_b {b.shape[0]}: the fits are paired one to one"
        )
    frac_a, frac_b = (a == y).mean(axis=0), (b == y).mean(axis=0)
    diff = frac_a - frac_b
    n = y.size
    replicates = np.concatenate([w @ diff / n for w in bootstrap_weight_blocks(n, int(n_resamples), int(seed))])
    _, p_value = paired_t_test(diff)
    ci_low, ci_high = percentile_interval(replicates, confidence)
    score_a, score_b = float(frac_a.mean()), float(frac_b.mean())
    return PairedComparison(
        METRIC, "paired-t", score_a, score_b, score_a - score_b, ci_low, ci_high, confidence, float(p_value),
        n, int(n_resamples), 0, int(seed), int(np.count_nonzero(diff > 0)), int(np.count_nonzero(diff < 0)),
        replicates,
    )
