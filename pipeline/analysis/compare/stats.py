"""Significance tests for paired comparisons, vectorised over cells where that makes sense."""

from __future__ import annotations

import numpy as np

from pipeline.errors import DataValidationError

__all__ = ["benjamini_hochberg", "mcnemar_exact", "paired_t_test", "percentile_interval"]


def _counts(values: object, name: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise DataValidationError(f"{name} must be integer counts, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise DataValidationError(f"{name} must be whole counts, got {arr.reshape(-1)[:5].tolist()}")
    if np.any(arr < 0):
        raise DataValidationError(f"{name} must be counts >= 0, got {arr.reshape(-1)[:5].tolist()}")
    return arr.astype(np.int64)


def mcnemar_exact(a_only: object, b_only: object, mid_p: bool = False) -> np.ndarray | float:
    """Two-sided exact McNemar test on the discordant pairs of two paired classifiers.

    Parameters
    ----------
    a_only : int or array of int
        Examples encoder A classifies correctly and encoder B does not.
    b_only : int or array of int
        Examples encoder B classifies correctly and encoder A does not (same shape).
    mid_p : bool
        Return the mid-p value ``2 P(X <= k) - P(X = k)`` instead of the exact
        (conservative) ``2 P(X <= k)``, with ``k = min(a_only, b_only)`` and
        ``X ~ Binomial(a_only + b_only, 1/2)``.

    Returns
    -------
    float or numpy.ndarray
        The p-value(s), capped at 1; 1 where there is no discordant pair.
    """
    b, c = _counts(a_only, "a_only"), _counts(b_only, "b_only")
    if b.shape != c.shape:
        raise DataValidationError(f"a_only has shape {b.shape} but b_only has shape {c.shape}")
    n, k = b + c, np.minimum(b, c)
    from scipy import stats  # here: importing the comparison modules stays cheap (fast CLI)

    p = 2.0 * stats.binom.cdf(k, n, 0.5)
    if mid_p:
        p = p - stats.binom.pmf(k, n, 0.5)
    p = np.where(n == 0, 1.0, np.minimum(p, 1.0))
    return float(p) if p.ndim == 0 else p


def paired_t_test(differences: object) -> tuple[float, float]:
    """Two-sided one-sample t test of paired differences against a zero mean.

    Equal to ``scipy.stats.ttest_rel(a, b)`` with ``differences = a - b``, except in the
    degenerate case of zero spread, which scipy reports as NaN: identical differences give
    p = 1 when they are all zero and p = 0 otherwise (a constant non-zero difference).

    Parameters
    ----------
    differences : array-like of float, shape (n,)
        Per-pair differences (e.g. per-episode accuracy of A minus that of B), n >= 2.

    Returns
    -------
    tuple of float
        The t statistic (ddof = 1 standard error) and its two-sided p-value with n - 1
        degrees of freedom.
    """
    from scipy import stats

    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or d.size < 2:
        raise DataValidationError(f"paired_t_test needs a 1-D array of at least 2 differences, got shape {d.shape}")
    if not np.all(np.isfinite(d)):
        raise DataValidationError(f"differences contain {int(np.sum(~np.isfinite(d)))} NaN/inf value(s)")
    mean = float(d.mean())
    sd = float(d.std(ddof=1))
    # Rounding leaves a tiny spread on a constant array; compare with the mean's scale.
    if sd <= 1e-14 * max(1.0, abs(mean)):
        if np.all(d == 0.0):
            return 0.0, 1.0
        return float(np.copysign(np.inf, mean)), 0.0
    t = mean / (sd / np.sqrt(d.size))
    return float(t), float(2.0 * stats.t.sf(abs(t), d.size - 1))


def benjamini_hochberg(p_values: object) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (false discovery rate over one family).

    ``adjusted_(i) = min_{j >= i} min(1, m p_(j) / j)`` over the sorted p-values
    ``p_(1) <= ... <= p_(m)``, returned in the input order. Rejecting the cells with
    ``adjusted <= alpha`` controls the FDR at ``alpha`` for independent (or positively
    dependent) tests.

    Parameters
    ----------
    p_values : array-like of float, shape (m,)
        Raw p-values in [0, 1], one per cell.

    Returns
    -------
    numpy.ndarray
        Adjusted p-values, float64, same order and length.
    """
    p = check_fractions(p_values, "p_values", "cell", minimum_size=0)
    m = p.size
    if m == 0:
        return p.copy()
    order = np.argsort(p, kind="stable")
    scaled = p[order] * m / np.arange(1, m + 1)
    adjusted_sorted = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 1.0)
    adjusted = np.empty(m)
    adjusted[order] = adjusted_sorted
    return adjusted


def percentile_interval(replicates: object, confidence: float) -> tuple[float, float]:
    """Percentile bootstrap interval: the (1 - c) / 2 and (1 + c) / 2 quantiles.

    Parameters
    ----------
    replicates : array-like of float
        Bootstrap replicates of a statistic.
    confidence : float
        Coverage in (0, 1), e.g. 0.95.

    Returns
    -------
    tuple of float
        Lower and upper end (numpy's default linear quantile interpolation).
    """
    check_probability(confidence, "confidence")
    r = np.asarray(replicates, dtype=np.float64)
    if r.size == 0:
        raise DataValidationError("percentile_interval needs at least one replicate")
    lo, hi = np.quantile(r, [(1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0])
    return float(lo), float(hi)


def check_fractions(values: object, name: str, unit: str, minimum_size: int) -> np.ndarray:
    """Return ``values`` as a 1-D float64 array of finite fractions in [0, 1], else raise."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size < minimum_size:
        raise DataValidationError(
            f"{name} must be 1-D (one value per {unit}) with at least {minimum_size} entries, got shape {arr.shape}"
        )
    bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0.0) | (arr > 1.0))
    if bad.size:
        raise DataValidationError(
            f"{name} must be finite fractions in [0, 1]; {bad.size} value(s) are not, at {unit}(s) "
            f"{bad[:10].tolist()}: {arr[bad[:5]].tolist()}"
        )
    return arr


def check_probability(value: object, name: str) -> float:
    """Return ``value`` as a float strictly between 0 and 1, else raise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise DataValidationError(f"{name} must be a number in (0, 1), got {value!r}")
    if not 0.0 < float(value) < 1.0:
        raise DataValidationError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return float(value)
