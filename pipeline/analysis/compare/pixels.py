"""Paired comparison of two encoders' dense cells from their per-image pixel counts."""

from __future__ import annotations

import numpy as np

from pipeline.analysis.compare.paired import DEFAULT_PERMUTATIONS, DEFAULT_RESAMPLES, PairedComparison
from pipeline.analysis.compare.resampling import MAX_BLOCK_ELEMENTS, bootstrap_weight_blocks, swap_mask_blocks
from pipeline.analysis.compare.stats import check_probability, percentile_interval
from pipeline.errors import DataValidationError
from pipeline.protocols.dense.metrics import score_from_counts

__all__ = ["compare_pixel_counts"]

_TIE_TOLERANCE = 1e-12


def _counts(values: object, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim < 2 or arr.shape[0] == 0 or arr.dtype.kind not in "iu":
        raise DataValidationError(f"{name} must be integer counts with one row per test image, got {arr.dtype} "
                                  f"{arr.shape}")
    return arr.astype(np.float64)


def compare_pixel_counts(counts_a: object, counts_b: object, metric: str, *, n_resamples: int = DEFAULT_RESAMPLES,
                         n_permutations: int = DEFAULT_PERMUTATIONS, confidence: float = 0.95,
                         seed: int = 0) -> PairedComparison:
    """Compare two encoders' dense cells on the same test images by ``metric``."""
    for name, value, low in (("n_resamples", n_resamples, 1), ("n_permutations", n_permutations, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise DataValidationError(f"{name} must be an integer >= {low}, got {value!r}")
    confidence = check_probability(confidence, "confidence")
    a, b = _counts(counts_a, "counts_a"), _counts(counts_b, "counts_b")
    if a.shape != b.shape:
        raise DataValidationError(f"counts_b has shape {b.shape} but counts_a has shape {a.shape}: a paired "
                                  "comparison needs both encoders' counts on the same test images, in the same order")
    n, rest = a.shape[0], a.shape[1:]
    flat_a, flat_b = a.reshape(n, -1), b.reshape(n, -1)
    width = flat_a.shape[1]

    def scores(summed: np.ndarray) -> np.ndarray:
        return score_from_counts(metric, summed.reshape(-1, *rest))

    score_a, score_b = float(scores(flat_a.sum(axis=0))[0]), float(scores(flat_b.sum(axis=0))[0])
    block = max(1, MAX_BLOCK_ELEMENTS // max(width, 1))
    replicates = np.concatenate([scores(w @ flat_a) - scores(w @ flat_b)
                                 for w in bootstrap_weight_blocks(n, int(n_resamples), int(seed), block * n)])
    diff, total_b = flat_b - flat_a, flat_b.sum(axis=0)
    swapped = []
    for swap in swap_mask_blocks(n, int(n_permutations), int(seed), block * n):
        s = swap.astype(np.float64)
        taken_a = flat_a.sum(axis=0) + s @ diff  # A's counts where not swapped, B's where swapped
        swapped.append(scores(taken_a) - scores(total_b - s @ diff))
    swapped_all = np.concatenate(swapped)
    observed = score_a - score_b
    p_value = float((1 + np.count_nonzero(np.abs(swapped_all) >= abs(observed) - _TIE_TOLERANCE))
                    / (1 + swapped_all.size))
    ci_low, ci_high = percentile_interval(replicates, confidence)
    return PairedComparison(metric, "randomization", score_a, score_b, observed, ci_low, ci_high, confidence, p_value,
                            n, int(n_resamples), int(n_permutations), int(seed), None, None, replicates)
