"""From a score on the early rows to an estimate of the full figure, with an interval."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from pipeline.analysis.early.coverage import coverage_state
from pipeline.errors import DataValidationError

__all__ = ["LOGIT_EPS", "MIN_HISTORY", "Estimate", "HistoryModel", "LineTrial", "PairedHistoryModel", "jackknife_plus",
           "conformal_half_width", "line_trial", "min_history", "stratified_change", "stratified_estimate",
           "weighted_accuracy"]

#: Earlier encoders a history-backed estimate needs by default: jackknife+ at 90 % needs 9
#: (``min_history(0.9)``), one more keeps a leave-one-out fit from resting on 8 points.
MIN_HISTORY = 10
#: Bounded scores are clipped to [eps, 1 - eps] before the logit: a subset score of 100 %
#: would otherwise have infinite leverage.
LOGIT_EPS = 1e-3


@dataclass(frozen=True)
class Estimate:
    """An early estimate of one full figure.

    Parameters
    ----------
    value : float
        The estimate.
    low, high : float or None
        The interval at ``level`` (None: no interval can be stated).
    level : float
        Its nominal coverage.
    method : str
        ``paired`` or ``history`` (calibrated on earlier encoders), ``change`` (the previous
        checkpoint's exact figure plus the early rows' own change since it) or ``sampling``
        (the early fit over the whole test split; sampling theory).
    n : int
        Earlier encoders (``paired``, ``history``) or early test rows (``change``,
        ``sampling``) behind it.
    covers : str
        What the interval is an interval for, in words.
    """

    value: float
    low: float | None
    high: float | None
    level: float
    method: str
    n: int
    covers: str

    @property
    def has_interval(self) -> bool:
        """Whether an interval is stated."""
        return self.low is not None and self.high is not None

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies in the interval (False without one).

        Parameters
        ----------
        value : float

        Returns
        -------
        bool
        """
        return self.has_interval and self.low <= value <= self.high


def _check_level(level: object) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.5 <= float(level) < 1:
        raise DataValidationError(f"level must be a fraction in [0.5, 1), got {level!r}")
    return float(level)


def min_history(level: float) -> int:
    """The fewest earlier encoders for which jackknife+ states a finite interval at ``level``.

    Parameters
    ----------
    level : float

    Returns
    -------
    int
    """
    level = _check_level(level)
    n = 1
    while _rank_high(level, n) > n or _rank_low(level, n) < 1:
        n += 1
    return n


def conformal_half_width(misses: object, level: float) -> float | None:
    """The split-conformal half-width of earlier misses: of ``n`` misses, the
    ``ceil((n + 1) * level)``-th smallest size, which a new miss exchangeable with them
    exceeds with probability at most ``1 - level``.

    Parameters
    ----------
    misses : array-like
        (n,) earlier misses (signed; their sizes are used).
    level : float
        Nominal coverage.

    Returns
    -------
    float or None
        None where ``n`` is too small for a finite half-width at ``level``.
    """
    sizes = np.sort(np.abs(np.asarray(misses, dtype=np.float64).ravel()))
    k = _rank_high(_check_level(level), sizes.size)
    return float(sizes[k - 1]) if 1 <= k <= sizes.size else None


# The order statistics of jackknife+ (a tolerance, so that 0.9 * 10 is 9, not 9.000000000000002)
def _rank_high(level: float, n: int) -> int:
    return math.ceil(level * (n + 1) - 1e-9)


def _rank_low(level: float, n: int) -> int:
    return math.floor((1 - level) * (n + 1) + 1e-9)


def weighted_accuracy(correct: np.ndarray, weights: np.ndarray | None = None) -> float:
    """The weighted mean of 0/1 results (each anchor weighed by the rows it stands for).

    Parameters
    ----------
    correct : numpy.ndarray
        (m,) 1 where right, 0 where wrong.
    weights : numpy.ndarray, optional
        (m,) positive weights (None: all equal).

    Returns
    -------
    float
    """
    correct = np.asarray(correct, dtype=np.float64)
    w = np.ones_like(correct) if weights is None else np.asarray(weights, dtype=np.float64)
    if correct.ndim != 1 or w.shape != correct.shape or correct.size == 0:
        raise DataValidationError(f"correct and weights must be two non-empty (m,) arrays, got {correct.shape}, "
                                  f"{w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise DataValidationError("weights must be finite and > 0")
    return float(np.sum(w * correct) / np.sum(w))


def _wilson(p: float, n_eff: float, z: float) -> tuple[float, float]:
    denom = 1 + z * z / n_eff
    centre = (p + z * z / (2 * n_eff)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n_eff + z * z / (4 * n_eff * n_eff))
    return max(0.0, centre - half), min(1.0, centre + half)


def stratified_estimate(correct: np.ndarray, strata: np.ndarray, population: Mapping[int, int], level: float = 0.9,
                        mean_per_class: bool = False) -> Estimate:
    """Accuracy over a whole test split from a stratified random sample of its rows.

    Parameters
    ----------
    correct : numpy.ndarray
        (m,) 1 where the readout classified a sampled row correctly, 0 where not.
    strata : numpy.ndarray
        (m,) the class (stratum) of each sampled row.
    population : mapping
        Class -> rows of that class in the whole split (every class of the split).
    level : float
        The interval's nominal coverage.
    mean_per_class : bool
        Estimate the mean per-class accuracy (each class weighs the same) instead of top-1.

    Returns
    -------
    Estimate
        ``method='sampling'``; a census (every row drawn) gives a zero-width interval.
    """
    level = _check_level(level)
    correct = np.asarray(correct, dtype=np.float64)
    strata = np.asarray(strata).astype(np.int64)
    if correct.ndim != 1 or strata.shape != correct.shape or correct.size == 0:
        raise DataValidationError(f"correct and strata must be two non-empty (m,) arrays, got {correct.shape}, "
                                  f"{strata.shape}")
    if not np.all((correct == 0) | (correct == 1)):
        raise DataValidationError("correct must hold 0 or 1 per row")
    sizes = {int(c): int(n) for c, n in population.items() if int(n) > 0}
    missing = sorted(set(np.unique(strata).tolist()) - set(sizes))
    if missing:
        raise DataValidationError(f"sampled classes {missing[:10]} have no rows in the population")
    total = sum(sizes.values())
    estimate, variance = 0.0, 0.0
    for c, n_pop in sizes.items():
        inside = correct[strata == c]
        share = (1.0 / len(sizes)) if mean_per_class else n_pop / total
        if inside.size == 0:
            raise DataValidationError(f"class {c} has {n_pop} rows in the split and none in the sample: "
                                      "a stratified estimate needs every class")
        if inside.size > n_pop:
            raise DataValidationError(f"class {c}: {inside.size} sampled rows of only {n_pop}")
        p = float(inside.mean())
        # unbiased within-stratum variance; one row says nothing of its spread: the largest, 1/4
        s2 = p * (1 - p) * inside.size / (inside.size - 1) if inside.size > 1 else 0.25
        estimate += share * p
        variance += share * share * (1 - inside.size / n_pop) * s2 / inside.size
    z = _normal_quantile(level)
    if variance <= 0:
        census = all(np.sum(strata == c) == n for c, n in sizes.items())
        if census:
            return Estimate(estimate, estimate, estimate, level, "sampling", int(correct.size), _SAMPLING_COVERS)
        n_eff = float(correct.size)  # every stratum all right or all wrong: the plain sample size
    else:
        n_eff = max(estimate * (1 - estimate) / variance, 1.0) if 0 < estimate < 1 else float(correct.size)
    low, high = _wilson(estimate, n_eff, z)
    return Estimate(estimate, low, high, level, "sampling", int(correct.size), _SAMPLING_COVERS)


def stratified_change(correct: np.ndarray, correct_other: np.ndarray, strata: np.ndarray,
                      population: Mapping[int, int], level: float = 0.9,
                      mean_per_class: bool = False) -> tuple[float, float, float]:
    """The change of accuracy between two readouts over a whole test split, from their results
    on the same stratified sample of its rows: the paired difference, with its normal
    interval (each row's difference varies far less than either result where the two agree).

    Parameters
    ----------
    correct, correct_other : numpy.ndarray
        (m,) 1 where each readout classified a sampled row correctly, 0 where not.
    strata : numpy.ndarray
        (m,) the class (stratum) of each sampled row.
    population : mapping
        Class -> rows of that class in the whole split.
    level : float
        The interval's nominal coverage.
    mean_per_class : bool
        The change of the mean per-class accuracy instead of top-1.

    Returns
    -------
    tuple of float
        (``correct`` minus ``correct_other``, low, high).
    """
    level = _check_level(level)
    a, b = (np.asarray(v, dtype=np.float64) for v in (correct, correct_other))
    strata = np.asarray(strata).astype(np.int64)
    if a.ndim != 1 or a.shape != b.shape or strata.shape != a.shape or a.size == 0:
        raise DataValidationError(f"correct, correct_other and strata must be three non-empty (m,) arrays, got "
                                  f"{a.shape}, {b.shape}, {strata.shape}")
    if not np.all(np.isin(a, (0, 1)) & np.isin(b, (0, 1))):
        raise DataValidationError("correct and correct_other must hold 0 or 1 per row")
    sizes = {int(c): int(n) for c, n in population.items() if int(n) > 0}
    total = sum(sizes.values())
    change, variance = 0.0, 0.0
    for c, n_pop in sizes.items():
        inside = (a - b)[strata == c]
        if inside.size == 0 or inside.size > n_pop:
            raise DataValidationError(f"class {c}: {inside.size} sampled rows of {n_pop} in the split")
        share = (1.0 / len(sizes)) if mean_per_class else n_pop / total
        # one row says nothing of its spread: the largest a difference of 0/1 results has, 1
        s2 = float(inside.var(ddof=1)) if inside.size > 1 else 1.0
        change += share * float(inside.mean())
        variance += share * share * (1 - inside.size / n_pop) * s2 / inside.size
    half = _normal_quantile(level) * math.sqrt(variance)
    return change, change - half, change + half


_SAMPLING_COVERS = ("the readout fitted on the early train rows, scored on the whole test split "
                    "(sampling of the test rows only; the full fit on every train row usually scores higher)")
_HISTORY_COVERS = "the full figure, if the encoder is like the earlier ones"


def _normal_quantile(level: float) -> float:
    from scipy import stats  # deferred: importing the early-pass modules stays cheap

    return float(stats.norm.ppf(0.5 + level / 2))


@dataclass(frozen=True)
class HistoryModel:
    """A line from early score to full score over earlier encoders, with jackknife+ intervals.

    Build it with :meth:`fit`; :meth:`predict` gives the estimate for a new early score.

    Parameters
    ----------
    early, full : numpy.ndarray
        (n,) the earlier encoders' early scores and exact full figures.
    bounded : bool
        Scores are fractions in [0, 1]: fitted on the logit scale.
    level : float
        Nominal coverage of the intervals.
    """

    early: np.ndarray
    full: np.ndarray
    bounded: bool
    level: float

    @classmethod
    def fit(cls, early: object, full: object, bounded: bool = True, level: float = 0.9,
            minimum: int = MIN_HISTORY) -> "HistoryModel":
        """Check the history and keep it (the line is refitted per left-out encoder).

        Parameters
        ----------
        early, full : array-like
            One early score and one exact figure per earlier encoder.
        bounded : bool
            Fractions in [0, 1] (logit scale).
        level : float
            Nominal coverage.
        minimum : int
            Earlier encoders needed (at least ``min_history(level)``).

        Returns
        -------
        HistoryModel
        """
        level = _check_level(level)
        x, y = (np.asarray(v, dtype=np.float64) for v in (early, full))
        if x.ndim != 1 or x.shape != y.shape:
            raise DataValidationError(f"early and full must be two (n,) arrays, got {x.shape} and {y.shape}")
        _check_scores([x, y], bounded)
        need = max(int(minimum), min_history(level))
        if x.size < need:
            raise DataValidationError(f"a history-backed estimate needs {need} earlier encoders, got {x.size}")
        return cls(x, y, bool(bounded), level)

    def predict(self, early: float) -> Estimate:
        """The estimate of a new encoder's full figure from its early score.

        Parameters
        ----------
        early : float

        Returns
        -------
        Estimate
            ``method='history'``: the full-history line's prediction, and the jackknife+
            interval at ``level``.
        """
        x_new = float(_scale(np.array([_finite(early, "early score")]), self.bounded)[0])
        mu, low, high = jackknife_plus(_scale(self.early, self.bounded), _scale(self.full, self.bounded), x_new,
                                       self.level)
        return Estimate(_unscale(mu, self.bounded), _unscale(low, self.bounded), _unscale(high, self.bounded),
                        self.level, "history", int(self.early.size), _HISTORY_COVERS)

    def outside(self, early: float) -> str | None:
        """Why a new early score lies beyond what the history saw (the line would be
        extrapolated), or None when it lies within.

        Parameters
        ----------
        early : float

        Returns
        -------
        str or None
        """
        return _outside(float(early), self.early.min(), self.early.max(), "early score")

    def leave_one_out(self) -> list[Estimate]:
        """Each earlier encoder's full figure as the line fitted on the others predicts it.

        Returns
        -------
        list of Estimate
            One per earlier encoder, in order: the prediction from its early score, with the
            others' jackknife+ interval (none where they are too few for one at ``level``).
        """
        x, y = _scale(self.early, self.bounded), _scale(self.full, self.bounded)
        return _loo_estimates(x, y, np.zeros(x.size), self.level, self.bounded, "history", _HISTORY_COVERS)


@dataclass(frozen=True)
class PairedHistoryModel:
    """A line from the change of early score to the change of full figure between two
    checkpoints of a series, with jackknife+ intervals: the new checkpoint's full figure is
    estimated as its predecessor's exact figure plus the predicted change.

    Both early scores of a pair are fitted on the same early rows and scored on the same
    early test images, so what those rows happen to favour cancels in the difference (a
    control variate): for checkpoints close to each other the change is estimated far more
    precisely than either score. Build it with :meth:`fit` from earlier consecutive pairs.

    Parameters
    ----------
    early_before, early_after, full_before, full_after : numpy.ndarray
        (n,) per earlier pair: the early scores and exact figures of its older and newer checkpoint.
    bounded : bool
        Fractions in [0, 1]: differences on the logit scale.
    level : float
        Nominal coverage.
    """

    early_before: np.ndarray
    early_after: np.ndarray
    full_before: np.ndarray
    full_after: np.ndarray
    bounded: bool
    level: float

    @classmethod
    def fit(cls, early_before: object, early_after: object, full_before: object, full_after: object,
            bounded: bool = True, level: float = 0.9, minimum: int = MIN_HISTORY) -> "PairedHistoryModel":
        """Check the pairs and keep them.

        Parameters
        ----------
        early_before, early_after, full_before, full_after : array-like
            One value per earlier pair.
        bounded : bool
        level : float
        minimum : int
            Pairs needed (at least ``min_history(level)``).

        Returns
        -------
        PairedHistoryModel
        """
        level = _check_level(level)
        arrays = [np.asarray(v, dtype=np.float64) for v in (early_before, early_after, full_before, full_after)]
        if any(a.ndim != 1 or a.shape != arrays[0].shape for a in arrays):
            raise DataValidationError(f"pairs must be four (n,) arrays, got {[a.shape for a in arrays]}")
        _check_scores(arrays, bounded)
        need = max(int(minimum), min_history(level))
        if arrays[0].size < need:
            raise DataValidationError(f"a paired estimate needs {need} earlier pairs, got {arrays[0].size}")
        return cls(*arrays, bool(bounded), level)

    def predict(self, early: float, early_reference: float, full_reference: float) -> Estimate:
        """The estimate of a new checkpoint's full figure from its early score and its
        predecessor's (the reference's) early score and exact figure.

        Parameters
        ----------
        early, early_reference, full_reference : float

        Returns
        -------
        Estimate
            ``method='paired'``.
        """
        sc = lambda v: _scale(np.asarray(v, dtype=np.float64), self.bounded)  # noqa: E731
        x = sc(self.early_after) - sc(self.early_before)
        y = sc(self.full_after) - sc(self.full_before)
        values = [_finite(v, what) for v, what in ((early, "early score"), (early_reference, "reference early score"),
                                                    (full_reference, "reference full figure"))]
        x_new = float(sc([values[0]])[0] - sc([values[1]])[0])
        base = float(sc([values[2]])[0])
        mu, low, high = jackknife_plus(x, y, x_new, self.level)
        return Estimate(_unscale(base + mu, self.bounded), _unscale(base + low, self.bounded),
                        _unscale(base + high, self.bounded), self.level, "paired", int(x.size), _PAIRED_COVERS)

    def outside(self, early: float, early_reference: float) -> str | None:
        """Why a new early change (``early`` minus ``early_reference``) lies beyond the
        changes the history saw, or None when it lies within.

        Parameters
        ----------
        early, early_reference : float

        Returns
        -------
        str or None
        """
        sc = lambda v: _scale(np.asarray(v, dtype=np.float64), self.bounded)  # noqa: E731
        seen = sc(self.early_after) - sc(self.early_before)
        change = float(sc([float(early)])[0] - sc([float(early_reference)])[0])
        return _outside(change, seen.min(), seen.max(), "early change" + (" (logit)" if self.bounded else ""))

    def leave_one_out(self) -> list[Estimate]:
        """Each earlier pair's newer full figure as the line fitted on the other pairs
        predicts it (from its older checkpoint's exact figure and the change of early score).

        Returns
        -------
        list of Estimate
            One per earlier pair, in order, each with the other pairs' jackknife+ interval
            (none where they are too few for one at ``level``).
        """
        sc = lambda v: _scale(np.asarray(v, dtype=np.float64), self.bounded)  # noqa: E731
        x = sc(self.early_after) - sc(self.early_before)
        y = sc(self.full_after) - sc(self.full_before)
        return _loo_estimates(x, y, sc(self.full_before), self.level, self.bounded, "paired", _PAIRED_COVERS)


_PAIRED_COVERS = "the full figure, if the change since the previous checkpoint is like earlier changes"


#: How far beyond the history's range (a share of its width) a line is still read: the
#: newest checkpoint of an improving series is often a little past the best seen so far.
EXTRAPOLATION_MARGIN = 0.25


def _outside(value: float, low: float, high: float, what: str) -> str | None:
    # a line fitted on [low, high] says nothing trustworthy far beyond it: a loss spike's
    # early change far below every earlier change would be mapped onto "training improves"
    margin = EXTRAPOLATION_MARGIN * (high - low)
    if low - margin <= value <= high + margin:
        return None
    return f"the {what} {value:+.3g} is outside the range the history saw ({low:+.3g} to {high:+.3g})"


def _finite(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) or not math.isfinite(value):
        raise DataValidationError(f"{what} must be a finite number, got {value!r}")
    return float(value)


def _check_scores(arrays: list[np.ndarray], bounded: bool) -> None:
    if not all(np.all(np.isfinite(a)) for a in arrays):
        raise DataValidationError("early scores and full figures must be finite")
    if bounded and any(np.any((a < 0) | (a > 1)) for a in arrays):
        raise DataValidationError("bounded scores must be fractions in [0, 1]")


def _scale(v: np.ndarray, bounded: bool) -> np.ndarray:
    if not bounded:
        return np.asarray(v, dtype=np.float64)
    p = np.clip(np.asarray(v, dtype=np.float64), LOGIT_EPS, 1 - LOGIT_EPS)
    return np.log(p / (1 - p))


def _unscale(v: float, bounded: bool) -> float:
    return float(1 / (1 + math.exp(-v))) if bounded else float(v)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Intercept and slope of the least-squares line (a flat line when x does not vary)."""
    if np.ptp(x) <= 1e-12:
        return float(y.mean()), 0.0
    # the closed form, not np.polyfit: a leave-one-out trial refits it n^2 times
    xm, ym = x.mean(), y.mean()
    dx = x - xm
    slope = float(np.dot(dx, y - ym) / np.dot(dx, dx))
    return float(ym - slope * xm), slope


def jackknife_plus(x: np.ndarray, y: np.ndarray, x_new: float, level: float) -> tuple[float, float, float]:
    """The least-squares line's prediction at ``x_new`` and its jackknife+ interval.

    Each point i is left out once: the line refitted without it predicts ``mu_i`` at
    ``x_new`` and leaves the residual ``R_i`` at ``x_i``. The interval runs from the
    ``floor((1 - level)(n + 1))``-th smallest ``mu_i - R_i`` to the
    ``ceil(level (n + 1))``-th smallest ``mu_i + R_i`` (Barber et al. 2021).

    Parameters
    ----------
    x, y : numpy.ndarray
        (n,) the points.
    x_new : float
    level : float

    Returns
    -------
    tuple of float
        (prediction of the line through every point, low, high).
    """
    n = x.size
    if _rank_high(level, n) > n or _rank_low(level, n) < 1:
        raise DataValidationError(f"jackknife+ at level {level:g} needs {min_history(level)} points, got {n}")
    below, above = np.empty(n), np.empty(n)
    for i in range(n):
        keep = np.arange(n) != i
        a, b = _line(x[keep], y[keep])
        residual = abs(y[i] - (a + b * x[i]))
        mu = a + b * x_new
        below[i], above[i] = mu - residual, mu + residual
    a, b = _line(x, y)
    return a + b * x_new, float(np.sort(below)[_rank_low(level, n) - 1]), float(np.sort(above)[_rank_high(level, n) - 1])


def _loo_estimates(x: np.ndarray, y: np.ndarray, base: np.ndarray, level: float, bounded: bool, method: str,
                   covers: str) -> list[Estimate]:
    """Point i predicted by the line through the other points (``base[i]`` plus it, unscaled),
    with their jackknife+ interval where they are enough for one."""
    n, out = x.size, []
    for i in range(n):
        keep = np.arange(n) != i
        if n - 1 >= min_history(level):
            mu, low, high = jackknife_plus(x[keep], y[keep], float(x[i]), level)
        else:
            a, b = _line(x[keep], y[keep])
            mu, low, high = a + b * x[i], None, None
        value, low, high = (None if v is None else _unscale(float(base[i] + v), bounded) for v in (mu, low, high))
        out.append(Estimate(value, low, high, level, method, n - 1, covers))
    return out


@dataclass(frozen=True)
class LineTrial:
    """A history line tried on its own history, leave-one-out, against the plain early-row
    estimate of the same checkpoints: the line earns its place only where it does better.

    Build it with :func:`line_trial`.

    Parameters
    ----------
    method : str
        The line's method (``history`` or ``paired``).
    errors, plain_errors : tuple of float
        Per checkpoint, the absolute error of the line's leave-one-out prediction and of the
        plain estimate, against the exact figure.
    covered, plain_covered : tuple of bool
        Per checkpoint with an interval, whether it held the exact figure.
    level : float
        The line's nominal coverage.
    bounded : bool
        Fractions in [0, 1] (errors said in points).
    alternative : str
        What the line is measured against, in a word: ``plain`` (the early rows' own
        estimate) or ``change`` (the previous exact figure plus the early rows' change).
    """

    method: str
    errors: tuple[float, ...]
    plain_errors: tuple[float, ...]
    covered: tuple[bool, ...]
    plain_covered: tuple[bool, ...]
    level: float
    bounded: bool = True
    alternative: str = "plain"

    @property
    def error(self) -> float:
        """The line's median absolute leave-one-out error."""
        return float(np.median(self.errors))

    @property
    def plain_error(self) -> float:
        """The plain estimate's median absolute error over the same checkpoints."""
        return float(np.median(self.plain_errors))

    @property
    def undercovered(self) -> bool:
        """The line's leave-one-out intervals held clearly less often than their level (the
        one-sided binomial test that turns a setting's early pass off)."""
        return coverage_state(self.covered, self.level, min_checks=1).off

    @property
    def kept(self) -> bool:
        """Whether the line is used: lower median error than the plain estimate, and no
        clear shortfall of coverage."""
        return self.error < self.plain_error and not self.undercovered

    def line(self) -> str:
        """Why the line is used or set aside, in a few words.

        Returns
        -------
        str
        """
        text = (f"leave-one-out error {self._amount(self.error)} vs {self.alternative} "
                f"{self._amount(self.plain_error)}")
        if self.covered:
            text += f", its intervals held {sum(self.covered)} of {len(self.covered)}"
            if self.undercovered:
                text += f" (below nominal {self.level:.0%})"
        return text if self.kept else f"{self.method} line set aside: {text}"

    def _amount(self, value: float) -> str:
        return f"{100 * value:.1f} points" if self.bounded else f"{value:.3g}"


def line_trial(line: Sequence[Estimate], plain: Sequence[Estimate], exact: object, bounded: bool = True) -> LineTrial:
    """Compare a line's leave-one-out predictions with the plain estimates of the same checkpoints.

    Parameters
    ----------
    line : sequence of Estimate
        Per checkpoint, the line's prediction from the others (``leave_one_out`` of a
        :class:`HistoryModel` or :class:`PairedHistoryModel`).
    plain : sequence of Estimate
        Per checkpoint, in the same order, what the line must beat: the plain estimate from
        its early rows alone, or (``method='change'``) its predecessor's exact figure plus
        the early rows' change, where that is the estimate used without a line.
    exact : array-like
        Per checkpoint, its exact figure.
    bounded : bool
        Fractions in [0, 1].

    Returns
    -------
    LineTrial
    """
    truth = np.asarray(exact, dtype=np.float64)
    if not len(line) or truth.shape != (len(line),) or len(plain) != len(line):
        raise DataValidationError(f"a line trial needs one prediction, plain estimate and exact figure per "
                                  f"checkpoint, got {len(line)}, {len(plain)} and {truth.shape}")
    errors = tuple(abs(e.value - t) for e, t in zip(line, truth))
    plain_errors = tuple(abs(e.value - t) for e, t in zip(plain, truth))
    held = lambda ests: tuple(e.contains(t) for e, t in zip(ests, truth) if e.has_interval)  # noqa: E731
    alternative = "change" if plain[0].method == "change" else "plain"
    return LineTrial(line[0].method, tuple(map(float, errors)), tuple(map(float, plain_errors)), held(line),
                     held(plain), line[0].level, bool(bounded), alternative)
