"""Seeded resampling streams and metrics evaluated on many resamples at once."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = [
    "RankedClass",
    "average_precision_rows",
    "bootstrap_indices",
    "bootstrap_weight_blocks",
    "mean_per_class_rows",
    "swap_mask_blocks",
    "swap_masks",
]

# Upper bound on the elements of one (resamples x examples) block.
MAX_BLOCK_ELEMENTS = 1 << 22
_BOOTSTRAP_STREAM, _SWAP_STREAM = 0, 1


def _generator(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[stream])


def _block_rows(n: int, max_elements: int) -> int:
    return max(1, max_elements // max(n, 1))


def _uniform_blocks(n: int, n_resamples: int, seed: int, stream: int, max_elements: int) -> Iterator[np.ndarray]:
    rng = _generator(seed, stream)
    rows = _block_rows(n, max_elements)
    for start in range(0, n_resamples, rows):
        yield rng.random((min(rows, n_resamples - start), n))


def _indices_from_uniform(u: np.ndarray, n: int) -> np.ndarray:
    return np.minimum((u * n).astype(np.int64), n - 1)


def bootstrap_indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """All bootstrap resamples as index arrays (what the blocked computations consume)."""
    return np.concatenate(
        [_indices_from_uniform(u, n) for u in _uniform_blocks(n, n_resamples, seed, _BOOTSTRAP_STREAM, 1 << 62)]
    ) if n_resamples else np.empty((0, n), dtype=np.int64)


def bootstrap_weight_blocks(
    n: int, n_resamples: int, seed: int, max_elements: int = MAX_BLOCK_ELEMENTS
) -> Iterator[np.ndarray]:
    """Bootstrap resamples as count vectors, in blocks of rows."""
    for u in _uniform_blocks(n, n_resamples, seed, _BOOTSTRAP_STREAM, max_elements):
        rows = u.shape[0]
        flat = (_indices_from_uniform(u, n) + (np.arange(rows) * n)[:, None]).reshape(-1)
        yield np.bincount(flat, minlength=rows * n).reshape(rows, n).astype(np.float64)


def swap_masks(n: int, n_resamples: int, seed: int) -> np.ndarray:
    """All randomization resamples as boolean swap masks (what the blocked code consumes)."""
    if not n_resamples:
        return np.empty((0, n), dtype=bool)
    return np.concatenate(list(swap_mask_blocks(n, n_resamples, seed, 1 << 62)))


def swap_mask_blocks(n: int, n_resamples: int, seed: int, max_elements: int = MAX_BLOCK_ELEMENTS) -> Iterator[np.ndarray]:
    """The rows of :func:`swap_masks` in blocks of bounded size."""
    for u in _uniform_blocks(n, n_resamples, seed, _SWAP_STREAM, max_elements):
        yield u < 0.5


def mean_per_class_rows(correct: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted mean per-class accuracy of each row of weights."""
    # The recall of class k is ``sum_i w_i c_i [y_i = k] / sum_i w_i [y_i = k]``; the mean runs
    # over the classes with positive weight in the row (those present in the resample).
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.flatnonzero(np.r_[True, sorted_labels[1:] != sorted_labels[:-1]])
    w = weights[:, order]
    c = correct[..., order]
    hits = np.add.reduceat(w * c, starts, axis=1)
    totals = np.add.reduceat(w, starts, axis=1)
    present = totals > 0
    recall = np.divide(hits, totals, out=np.zeros_like(hits), where=present)
    return recall.sum(axis=1) / present.sum(axis=1)


class RankedClass:
    """One class's candidate scores sorted once, ready to score many weightings by AP."""
    # Average precision follows ``sklearn.metrics.average_precision_score`` with
    # ``sample_weight``: ``AP = sum_t (R_t - R_(t-1)) P_t`` over the distinct score
    # thresholds t, so tied scores enter together. Only the positive candidates' precisions
    # matter, each taken at the end of its tie group.

    def __init__(self, scores: np.ndarray, positive: np.ndarray, candidates: np.ndarray | None = None) -> None:
        if candidates is None:
            self.order = np.argsort(-scores, kind="stable")
        else:
            self.order = candidates[np.argsort(-scores[candidates], kind="stable")]
        sorted_scores = scores[self.order]
        m = sorted_scores.size
        is_end = np.r_[sorted_scores[1:] != sorted_scores[:-1], True]
        # Last sorted position of each position's tie group.
        group_end = np.minimum.accumulate(np.where(is_end, np.arange(m), m)[::-1])[::-1]
        self.positive_at = np.flatnonzero(positive[self.order])
        self.end_of_positive = group_end[self.positive_at]
        # Positives up to (and including) each positive's group end, minus one: an index.
        self.positives_before_end = np.searchsorted(self.positive_at, self.end_of_positive, side="right") - 1

    def _parts(self, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w = weights[:, self.order]
        counted = np.cumsum(w, axis=1)[:, self.end_of_positive]
        gained = w[:, self.positive_at]
        tp = np.cumsum(gained, axis=1)[:, self.positives_before_end]
        return counted, tp, gained

    @staticmethod
    def _ap(counted: np.ndarray, tp: np.ndarray, gained: np.ndarray) -> np.ndarray:
        precision = np.divide(tp, counted, out=np.zeros_like(tp), where=counted > 0)
        total = gained.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, (gained * precision).sum(axis=1) / total, np.nan)

    def average_precision(self, weights: np.ndarray) -> np.ndarray:
        """AP of each row of candidate weights."""
        return self._ap(*self._parts(weights))

    def complementary_average_precision(self, selected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """AP of 0/1 selections and of their complements, from one pass."""
        # With both encoders' scores as the 2n candidates, a swap mask selects one candidate
        # per example for A and the other for B: B's counts are the complement of A's.
        counted, tp, gained = self._parts(selected)
        ap_selected = self._ap(counted, tp, gained)
        ap_rest = self._ap(
            (self.end_of_positive + 1) - counted, (self.positives_before_end + 1) - tp, 1.0 - gained
        )
        return ap_selected, ap_rest


def average_precision_rows(scores: np.ndarray, positive: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Weighted average precision of one class for many weightings of its candidates."""
    return RankedClass(scores, positive).average_precision(weights)
