"""Which rows of a dataset the early pass reads."""

from __future__ import annotations

import numpy as np

from pipeline.errors import DataValidationError

__all__ = ["allocate", "anchor_rows", "stratified_rows"]


def allocate(counts: np.ndarray, size: int, minimum: int = 2) -> np.ndarray:
    """Rows per stratum: ``size`` shared in proportion to ``counts`` (largest remainders),
    each stratum given at least ``min(minimum, its count)`` and at most its count.

    Parameters
    ----------
    counts : array of int
        Rows in each stratum.
    size : int
        Rows wanted in all (raised to the strata's minimums, capped at their total).
    minimum : int
        Rows each stratum keeps at least.

    Returns
    -------
    numpy.ndarray
        int64 rows per stratum, summing to ``max(size, sum of minimums)`` capped at the total.
    """
    counts = np.asarray(counts, dtype=np.int64)
    if counts.ndim != 1 or np.any(counts < 0):
        raise DataValidationError(f"counts must be one count >= 0 per stratum, got {counts.tolist()[:10]}")
    floor = np.minimum(counts, int(minimum))
    size = int(min(max(int(size), int(floor.sum())), int(counts.sum())))
    out = floor.copy()
    left = size - int(out.sum())
    while left > 0:
        room = counts - out
        share = counts * (size / max(int(counts.sum()), 1)) - out  # what each stratum lacks of its share
        share = np.where(room > 0, share, -np.inf)
        take = np.clip(np.floor(share), 0, room).astype(np.int64)
        if take.sum() == 0 or take.sum() > left:  # hand out one row, to the stratum lacking most
            take = np.zeros_like(out)
            take[int(np.argmax(share))] = 1
        out += take
        left -= int(take.sum())
    return out


def _strata(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim == 2:  # multi-label: one stratum (an image belongs to several classes)
        return np.zeros(labels.shape[0], dtype=np.int64)
    if labels.ndim != 1:
        raise DataValidationError(f"labels must be (n,) class indices or (n, C) indicators, got shape {labels.shape}")
    return labels.astype(np.int64)


def _check_size(size: object, n: int) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise DataValidationError(f"size must be a whole number of rows >= 1, got {size!r}")
    if n < 1:
        raise DataValidationError("there are no rows to choose from")
    return int(size)


def stratified_rows(labels: np.ndarray, size: int, seed: int, minimum: int = 2) -> np.ndarray:
    """A seeded random sample of about ``size`` rows, stratified by class.

    Parameters
    ----------
    labels : numpy.ndarray
        (n,) class indices, or (n, C) multi-label indicators (sampled as one stratum).
    size : int
        Rows wanted (see :func:`allocate` for the per-class minimum).
    seed : int
        Seeds the draw.
    minimum : int
        Rows each class keeps at least, where it has that many.

    Returns
    -------
    numpy.ndarray
        Sorted int64 row indices.
    """
    strata = _strata(labels)
    size = _check_size(size, strata.shape[0])
    classes, counts = np.unique(strata, return_counts=True)
    take = allocate(counts, size, minimum)
    rng = np.random.default_rng(seed)
    rows = [rng.choice(np.flatnonzero(strata == c), k, replace=False) for c, k in zip(classes, take) if k]
    return np.sort(np.concatenate(rows)).astype(np.int64)


def _clusters(profiles: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Cluster index of each row: k-means on the profiles, or one cluster per distinct
    profile when there are no more of those than ``k``."""
    distinct, inverse = np.unique(profiles, axis=0, return_inverse=True)
    inverse = np.asarray(inverse).reshape(-1)
    if len(distinct) <= k:
        return inverse
    from sklearn.cluster import KMeans  # deferred: the early-pass registry loads without scikit-learn

    return KMeans(n_clusters=k, n_init=4, random_state=seed).fit(profiles).labels_


def anchor_rows(profiles: np.ndarray, labels: np.ndarray, size: int, seed: int,
                minimum: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """About ``size`` anchor rows, stratified by class, and the rows each stands for.

    Within a class given ``k`` rows, its rows are clustered into at most ``k`` groups by
    their profiles (k-means; identical profiles are one group), the rows are shared among
    the groups in proportion to their sizes (at least one each), and a group's first row is
    the member nearest its mean profile, the others drawn at random. Each anchor's weight is
    its group's size over the rows drawn from it, so the weights of a class sum to its rows
    and the weighted mean of any 0/1 result over the anchors estimates its mean over the split.

    Parameters
    ----------
    profiles : numpy.ndarray
        (n, m) results of earlier encoders on each row (for example 1 = classified
        correctly by one earlier readout, 0 = not).
    labels : numpy.ndarray
        (n,) class indices.
    size : int
        Rows wanted.
    seed : int
        Seeds k-means and the draws.
    minimum : int
        Rows each class keeps at least, where it has that many.

    Returns
    -------
    rows : numpy.ndarray
        Sorted int64 row indices.
    weights : numpy.ndarray
        float64, the rows each anchor stands for (summing to n).
    """
    profiles = np.asarray(profiles, dtype=np.float64)
    strata = _strata(labels)
    if profiles.ndim != 2 or profiles.shape[0] != strata.shape[0]:
        raise DataValidationError(f"profiles must be (n, m) with n = {strata.shape[0]} rows, got shape {profiles.shape}")
    if not np.all(np.isfinite(profiles)):
        raise DataValidationError("profiles hold non-finite values")
    size = _check_size(size, strata.shape[0])
    classes, counts = np.unique(strata, return_counts=True)
    take = allocate(counts, size, minimum)
    rng = np.random.default_rng(seed)
    rows, weights = [], []
    for c, k in zip(classes, take):
        if not k:
            continue
        members = np.flatnonzero(strata == c)
        groups = _clusters(profiles[members], int(k), seed)
        ids, sizes = np.unique(groups, return_counts=True)
        per_group = allocate(sizes, int(k), minimum=1)
        for g, n_g, a in zip(ids, sizes, per_group):
            inside = members[groups == g]
            centre = profiles[inside].mean(axis=0)
            first = inside[int(np.argmin(((profiles[inside] - centre) ** 2).sum(axis=1)))]
            others = rng.choice(inside[inside != first], int(a) - 1, replace=False) if a > 1 else []
            chosen = np.concatenate([[first], others]).astype(np.int64)
            rows.append(chosen)
            weights.append(np.full(len(chosen), n_g / len(chosen)))
    rows_all, weights_all = np.concatenate(rows), np.concatenate(weights)
    order = np.argsort(rows_all)
    return rows_all[order], weights_all[order]
