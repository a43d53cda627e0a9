"""Paired comparison of two encoders on the same test examples or the same episodes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from pipeline.analysis.compare.resampling import (
    MAX_BLOCK_ELEMENTS,
    RankedClass,
    bootstrap_weight_blocks,
    mean_per_class_rows,
    swap_mask_blocks,
)
from pipeline.analysis.compare.stats import check_fractions, check_probability, mcnemar_exact, paired_t_test, percentile_interval
from pipeline.errors import DataValidationError

__all__ = ["CLASSIFICATION_METRICS", "PairedComparison", "compare_episodes", "compare_predictions", "compare_scores",
           "compare_values"]

CLASSIFICATION_METRICS = ("top1", "mean_per_class")
DEFAULT_RESAMPLES = 1000
DEFAULT_PERMUTATIONS = 9999
# Swapped statistics equal to the observed one up to rounding count as "at least as extreme".
_TIE_TOLERANCE = 1e-12


@dataclass(frozen=True)
class PairedComparison:
    """Encoder A against encoder B on one cell; ``difference`` = ``score_a - score_b``.

    ``test`` names the p-value's test (``mcnemar-exact``, ``mcnemar-mid-p``,
    ``randomization`` or ``paired-t``); ``n`` counts the paired units (examples or
    episodes). ``a_only`` / ``b_only`` count the examples only A / only B gets right
    (classification only). ``replicates`` holds the bootstrap differences.

    Parameters
    ----------
    metric : str
        The compared metric.
    test : str
        The test behind ``p_value``.
    score_a, score_b : float
        The two encoders' scores.
    difference : float
        ``score_a - score_b``.
    ci_low, ci_high : float
        Bootstrap confidence interval of the difference.
    confidence : float
        Its level (e.g. 0.95).
    p_value : float
        Two-sided p-value of "no difference".
    n : int
        Paired units (examples or episodes).
    n_resamples, n_permutations : int
        Bootstrap resamples and permutations used.
    seed : int
        Seed of the resampling.
    a_only, b_only : int or None
        Examples only A / only B gets right (classification only).
    replicates : numpy.ndarray
        The bootstrap differences.
    """

    metric: str
    test: str
    score_a: float
    score_b: float
    difference: float
    ci_low: float
    ci_high: float
    confidence: float
    p_value: float
    n: int
    n_resamples: int
    n_permutations: int
    seed: int
    a_only: int | None = None
    b_only: int | None = None
    replicates: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)

    def to_dict(self) -> dict[str, object]:
        """Plain dictionary for JSON (without the bootstrap replicates).

        Not ``to_plain``: that would add the replicates (``n_resamples`` numbers) to every
        verdict that ``repeval compare --json`` prints.

        Returns
        -------
        dict
            Every field except ``replicates``.
        """
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "replicates"}


def _check_count(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DataValidationError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_run(n_resamples: object, confidence: object, seed: object) -> tuple[int, float, int]:
    return (
        _check_count(n_resamples, "n_resamples", 1),
        check_probability(confidence, "confidence"),
        _check_count(seed, "seed", 0),
    )


def _class_indices(values: object, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise DataValidationError(f"{name} must be 1-D (one class index per test example), got shape {arr.shape}")
    if arr.size == 0:
        raise DataValidationError(f"{name} is empty; a comparison needs at least one test example")
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise DataValidationError(f"{name} must hold integer class indices, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _same_length(reference: np.ndarray, other: np.ndarray, name: str, what: str) -> None:
    if other.shape != reference.shape:
        raise DataValidationError(
            f"{name} has shape {other.shape} but {what} has shape {reference.shape}: a paired "
            "comparison needs both encoders' outputs on the same test examples, in the same order"
        )


def _bootstrap(weight_blocks: Iterable[np.ndarray], statistic) -> np.ndarray:
    return np.concatenate([statistic(w) for w in weight_blocks])


def _nanmean_rows(values: np.ndarray) -> np.ndarray:
    # Mean over the classes with an AP in each row (a class may lack positives in a resample).
    present = ~np.isnan(values)
    return np.where(present, values, 0.0).sum(axis=1) / np.maximum(present.sum(axis=1), 1)


def _randomization_p(swapped: np.ndarray, observed: float) -> float:
    extreme = np.abs(swapped) >= abs(observed) - _TIE_TOLERANCE
    return float((1 + np.count_nonzero(extreme)) / (1 + swapped.size))


def compare_predictions(
    y_true: object,
    pred_a: object,
    pred_b: object,
    metric: str = "top1",
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    n_permutations: int = DEFAULT_PERMUTATIONS,
    confidence: float = 0.95,
    seed: int = 0,
    mid_p: bool = False,
) -> PairedComparison:
    """Compare two encoders' class predictions on the same test examples.

    Parameters
    ----------
    y_true : array-like of int, shape (n,)
        True class of each test example.
    pred_a, pred_b : array-like of int, shape (n,)
        Predicted classes of encoders A and B for the same examples, in the same order.
    metric : {"top1", "mean_per_class"}
        The cell's score: top-1 accuracy (tested with McNemar) or mean per-class accuracy
        (tested by randomization).
    n_resamples : int
        Bootstrap resamples for the interval.
    n_permutations : int
        Random swaps for the randomization test (``mean_per_class`` only).
    confidence : float
        Coverage of the interval.
    seed : int
        Seed of the resampling streams (>= 0).
    mid_p : bool
        Use the mid-p McNemar test (``top1`` only).

    Returns
    -------
    PairedComparison
        Scores, difference A - B, interval, p-value and discordant counts.
    """
    if metric not in CLASSIFICATION_METRICS:
        raise DataValidationError(f"Unknown metric {metric!r}; valid choices: {', '.join(CLASSIFICATION_METRICS)}")
    n_resamples, confidence, seed = _check_run(n_resamples, confidence, seed)
    y = _class_indices(y_true, "y_true")
    a, b = _class_indices(pred_a, "pred_a"), _class_indices(pred_b, "pred_b")
    _same_length(y, a, "pred_a", "y_true")
    _same_length(y, b, "pred_b", "y_true")
    correct_a, correct_b = (a == y), (b == y)
    a_only = int(np.count_nonzero(correct_a & ~correct_b))
    b_only = int(np.count_nonzero(correct_b & ~correct_a))
    diff = correct_a.astype(np.float64) - correct_b
    n = y.size
    blocks = bootstrap_weight_blocks(n, n_resamples, seed)

    if metric == "top1":
        score_a, score_b = float(correct_a.mean()), float(correct_b.mean())
        replicates = _bootstrap(blocks, lambda w: w @ diff / n)
        p_value = mcnemar_exact(a_only, b_only, mid_p=mid_p)
        test, n_permutations = ("mcnemar-mid-p" if mid_p else "mcnemar-exact"), 0
    else:
        n_permutations = _check_count(n_permutations, "n_permutations", 1)
        ones = np.ones((1, n))
        score_a = float(mean_per_class_rows(correct_a.astype(np.float64), y, ones)[0])
        score_b = float(mean_per_class_rows(correct_b.astype(np.float64), y, ones)[0])
        # With the class counts fixed the metric is linear in correctness: the difference of
        # the two recalls averages equals the average of the recall differences.
        replicates = _bootstrap(blocks, lambda w: mean_per_class_rows(diff, y, w))
        _, inverse, counts = np.unique(y, return_inverse=True, return_counts=True)
        contribution = diff / (counts.size * counts[inverse])
        swapped = _bootstrap(
            swap_mask_blocks(n, n_permutations, seed), lambda s: np.where(s, -contribution, contribution).sum(axis=1)
        )
        p_value = _randomization_p(swapped, score_a - score_b)
        test = "randomization"
    ci_low, ci_high = percentile_interval(replicates, confidence)
    return PairedComparison(
        metric, test, score_a, score_b, score_a - score_b, ci_low, ci_high, confidence, float(p_value),
        n, n_resamples, n_permutations, seed, a_only, b_only, replicates,
    )


def _multilabel(y_true: object, scores_a: object, scores_b: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = np.asarray(y_true)
    if y.ndim != 2 or y.shape[0] == 0 or y.shape[1] == 0:
        raise DataValidationError(f"y_true must be a 2-D (examples x classes) 0/1 indicator matrix, got shape {y.shape}")
    if not (y.dtype == bool or np.issubdtype(y.dtype, np.number)) or not np.all((y == 0) | (y == 1) | (y == -1)):
        raise DataValidationError("y_true must hold only 0/1 (or booleans), or -1 for a difficult example: one "
                                  "column per class")
    out = []
    for name, s in (("scores_a", scores_a), ("scores_b", scores_b)):
        s = np.asarray(s)
        if s.dtype == bool or not np.issubdtype(s.dtype, np.number):
            raise DataValidationError(f"{name} must hold numeric per-class scores, got dtype {s.dtype}")
        s = s.astype(np.float64)
        _same_length(y, s, name, "y_true")
        bad = np.argwhere(~np.isfinite(s))
        if bad.size:
            raise DataValidationError(
                f"{name} contains {len(bad)} NaN/inf score(s), first at (example, class) {bad[:5].tolist()}"
            )
        out.append(s)
    return y.astype(np.int8), out[0], out[1]


def compare_scores(
    y_true: object,
    scores_a: object,
    scores_b: object,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    n_permutations: int = DEFAULT_PERMUTATIONS,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedComparison:
    """Compare two encoders' multi-label scores by mean average precision (mAP).

    mAP is the mean over classes of ``sklearn.metrics.average_precision_score``; a class
    without a positive example in the test set (or in a bootstrap resample) has no AP and
    is left out of that mean.

    Parameters
    ----------
    y_true : array-like of 0/1, shape (n, n_classes)
        Label indicator matrix of the test examples; -1 marks an example as "difficult" for
        a class (PASCAL VOC): it is left out of that class's ranking, neither positive nor
        negative.
    scores_a, scores_b : array-like of float, shape (n, n_classes)
        Per-class scores of encoders A and B for the same examples (any monotone scale:
        logits, probabilities, float16 copies).
    n_resamples : int
        Bootstrap resamples for the interval.
    n_permutations : int
        Random swaps for the randomization test.
    confidence : float
        Coverage of the interval.
    seed : int
        Seed of the resampling streams (>= 0).

    Returns
    -------
    PairedComparison
        With ``metric="mAP"`` and ``test="randomization"``.
    """
    n_resamples, confidence, seed = _check_run(n_resamples, confidence, seed)
    n_permutations = _check_count(n_permutations, "n_permutations", 1)
    y, s_a, s_b = _multilabel(y_true, scores_a, scores_b)
    positive = y == 1
    classes = np.flatnonzero(positive.any(axis=0))
    if classes.size == 0:
        raise DataValidationError("y_true has no positive label in any class; mAP is undefined")
    n = y.shape[0]
    kept = [np.flatnonzero(y[:, k] >= 0) for k in classes]  # difficult examples left out per class
    # Bootstrap: each encoder's n scores sorted once per class, weighted by the resample
    # counts. Randomization: both encoders' scores as 2n candidates sorted once per class;
    # a swap mask picks one candidate of each example for A and the other for B.
    ranked_a = [RankedClass(s_a[:, k], positive[:, k], c) for k, c in zip(classes, kept)]
    ranked_b = [RankedClass(s_b[:, k], positive[:, k], c) for k, c in zip(classes, kept)]
    ranked_pairs = [RankedClass(np.concatenate([s_a[:, k], s_b[:, k]]), np.tile(positive[:, k], 2),
                                np.concatenate([c, c + n])) for k, c in zip(classes, kept)]

    def mean_ap(ranked: list[RankedClass], weights: np.ndarray) -> np.ndarray:
        return _nanmean_rows(np.stack([r.average_precision(weights) for r in ranked], axis=1))

    def swapped_difference(swap: np.ndarray) -> np.ndarray:
        taken_by_a = np.hstack([~swap, swap]).astype(np.float64)
        pairs = [r.complementary_average_precision(taken_by_a) for r in ranked_pairs]
        return _nanmean_rows(np.stack([p[0] for p in pairs], axis=1)) - _nanmean_rows(np.stack([p[1] for p in pairs], axis=1))

    ones = np.ones((1, n))
    score_a, score_b = float(mean_ap(ranked_a, ones)[0]), float(mean_ap(ranked_b, ones)[0])
    small = MAX_BLOCK_ELEMENTS // 4  # several (rows x n) arrays live per class: keep blocks small
    replicates = _bootstrap(
        bootstrap_weight_blocks(n, n_resamples, seed, small), lambda w: mean_ap(ranked_a, w) - mean_ap(ranked_b, w)
    )
    swapped = _bootstrap(swap_mask_blocks(n, n_permutations, seed, small), swapped_difference)
    ci_low, ci_high = percentile_interval(replicates, confidence)
    return PairedComparison(
        "mAP", "randomization", score_a, score_b, score_a - score_b, ci_low, ci_high, confidence,
        _randomization_p(swapped, score_a - score_b), n, n_resamples, n_permutations, seed, None, None, replicates,
    )


def compare_episodes(
    accuracies_a: object,
    accuracies_b: object,
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedComparison:
    """Compare two encoders' per-episode few-shot accuracies on the same episodes.

    Parameters
    ----------
    accuracies_a, accuracies_b : array-like of float, shape (n_episodes,)
        Accuracy (a fraction) of each encoder on each episode; episode e must be the same
        support and query images for both (same seed, same labels).
    n_resamples : int
        Bootstrap resamples of episodes for the interval.
    confidence : float
        Coverage of the interval.
    seed : int
        Seed of the resampling stream (>= 0).

    Returns
    -------
    PairedComparison
        With ``metric="episode_accuracy"`` and ``test="paired-t"``; scores are mean
        episode accuracies.
    """
    n_resamples, confidence, seed = _check_run(n_resamples, confidence, seed)
    acc_a = check_fractions(accuracies_a, "accuracies_a", "episode", minimum_size=2)
    acc_b = check_fractions(accuracies_b, "accuracies_b", "episode", minimum_size=2)
    _same_length(acc_a, acc_b, "accuracies_b", "accuracies_a")
    diff = acc_a - acc_b
    n = diff.size
    replicates = _bootstrap(bootstrap_weight_blocks(n, n_resamples, seed), lambda w: w @ diff / n)
    _, p_value = paired_t_test(diff)
    ci_low, ci_high = percentile_interval(replicates, confidence)
    score_a, score_b = float(acc_a.mean()), float(acc_b.mean())
    return PairedComparison(
        "episode_accuracy", "paired-t", score_a, score_b, score_a - score_b, ci_low, ci_high, confidence,
        p_value, n, n_resamples, 0, seed, None, None, replicates,
    )


def compare_values(values_a: object, values_b: object, metric: str, *, n_resamples: int = DEFAULT_RESAMPLES,
                   confidence: float = 0.95, seed: int = 0) -> PairedComparison:
    """Compare two encoders' per-unit values (``values`` evidence: a query's AP@R) on the same units.

    The headline is the mean over the units with a value (NaN marks a unit without one,
    the same units for both encoders since the fingerprints agree); the test is a paired t
    test on the differences and the interval a paired bootstrap of their mean, as for
    few-shot episodes: the units are independent and the differences bounded.

    Parameters
    ----------
    values_a, values_b : array-like of float, shape (n,)
        Each encoder's value per unit, in stored order.
    metric : str
        The headline whose per-unit values these are.
    n_resamples, confidence, seed
        As for :func:`compare_episodes`.

    Returns
    -------
    PairedComparison
        With ``test="paired-t"``; ``n`` counts the units with a value.
    """
    n_resamples, confidence, seed = _check_run(n_resamples, confidence, seed)
    a, b = np.asarray(values_a, dtype=np.float64), np.asarray(values_b, dtype=np.float64)
    _same_length(a, b, "values_b", "values_a")
    kept = ~(np.isnan(a) | np.isnan(b))
    a = check_fractions(a[kept], "values_a", "unit", minimum_size=2)
    b = check_fractions(b[kept], "values_b", "unit", minimum_size=2)
    diff = a - b
    n = diff.size
    replicates = _bootstrap(bootstrap_weight_blocks(n, n_resamples, seed), lambda w: w @ diff / n)
    _, p_value = paired_t_test(diff)
    ci_low, ci_high = percentile_interval(replicates, confidence)
    score_a, score_b = float(a.mean()), float(b.mean())
    return PairedComparison(str(metric), "paired-t", score_a, score_b, score_a - score_b, ci_low, ci_high,
                            confidence, p_value, n, n_resamples, 0, seed, None, None, replicates)
