"""Whether early intervals have held: their coverage over the exact figures that followed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_CHECKS", "CoverageState", "coverage_state", "gross_miss"]

#: Checks before coverage can turn an early pass off.
MIN_CHECKS = 10


@dataclass(frozen=True)
class CoverageState:
    """Coverage of one protocol setting's early intervals so far.

    Parameters
    ----------
    checks, covered : int
        Estimates checked, and those whose interval held the figure.
    level : float
        Their nominal coverage.
    p_below : float
        One-sided binomial p-value of ``covered`` out of ``checks`` at ``level`` (1 when
        nothing was checked).
    off : bool
        The early pass is turned off for the setting.
    tripped : bool
        A gross miss (the figure outside its interval by more than the interval's width)
        not yet followed by an interval that held: the history lines are not used.
    """

    checks: int
    covered: int
    level: float
    p_below: float
    off: bool
    tripped: bool = False

    @property
    def rate(self) -> float | None:
        """The observed coverage (None before the first check)."""
        return self.covered / self.checks if self.checks else None

    def line(self) -> str:
        """One line for the terminal and the report.

        Returns
        -------
        str
        """
        if not self.checks:
            return f"no early estimate checked yet (nominal {self.level:.0%})"
        text = f"{self.covered} of {self.checks} intervals held the figure ({self.rate:.0%}; nominal {self.level:.0%})"
        if self.off:
            return text + f": below nominal (binomial p = {self.p_below:.2g}), early pass off"
        if self.tripped:
            return text + (": the last miss was wider than its interval, calibrated estimates off until an "
                           "interval holds again (the early rows' own intervals meanwhile)")
        return text


def gross_miss(low: float | None, high: float | None, figure: float) -> bool:
    """Whether a figure falls outside its interval by more than the interval's width.

    Parameters
    ----------
    low, high : float or None
        The interval (None: no interval, never a gross miss).
    figure : float
        What it was to hold.

    Returns
    -------
    bool
    """
    if low is None or high is None:
        return False
    width = high - low
    return figure < low - width or figure > high + width


def coverage_state(covered: Sequence[bool], level: float, min_checks: int = MIN_CHECKS,
                   alpha: float = 0.05, gross: Sequence[bool] | None = None) -> CoverageState:
    """Coverage of a sequence of checks, and whether it turns the early pass off.

    Parameters
    ----------
    covered : sequence of bool
        One per checked estimate: whether its interval held the figure.
    level : float
        Nominal coverage.
    min_checks : int
        Checks needed before coverage can turn the pass off.
    alpha : float
        Level of the one-sided binomial test.
    gross : sequence of bool, optional
        One per check, in the order they were made: whether it was a :func:`gross_miss`.
        One trips the guard at once, until a later interval holds.

    Returns
    -------
    CoverageState
    """
    from scipy import stats  # deferred: importing the early-pass modules stays cheap

    n, k = len(covered), int(sum(bool(c) for c in covered))
    p_below = float(stats.binom.cdf(k, n, level)) if n else 1.0
    tripped = False
    for held, wide in zip(covered, gross or [False] * n):
        tripped = bool(wide) or (tripped and not held)
    return CoverageState(n, k, float(level), p_below, bool(n >= min_checks and p_below < alpha), tripped)
