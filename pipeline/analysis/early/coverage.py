"""Whether early intervals have held: their coverage over the exact figures that followed.

Each early estimate is checked once its exact figure (or, for a sampling interval, the
figure it is an interval for) is known. The early pass of a protocol setting is turned off
when its checks show coverage below the nominal level: at least ``min_checks`` checks and
a one-sided binomial test of the covered count against the nominal level at ``alpha``.
A test, not the raw rate, because at exactly nominal coverage the rate of a few dozen
checks falls below it about half the time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["MIN_CHECKS", "CoverageState", "coverage_state"]

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
    """

    checks: int
    covered: int
    level: float
    p_below: float
    off: bool

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
        return text + (f": below nominal (binomial p = {self.p_below:.2g}), early pass off" if self.off else "")


def coverage_state(covered: Sequence[bool], level: float, min_checks: int = MIN_CHECKS,
                   alpha: float = 0.05) -> CoverageState:
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

    Returns
    -------
    CoverageState
    """
    from scipy import stats  # deferred: importing the early-pass modules stays cheap

    n, k = len(covered), int(sum(bool(c) for c in covered))
    p_below = float(stats.binom.cdf(k, n, level)) if n else 1.0
    return CoverageState(n, k, float(level), p_below, bool(n >= min_checks and p_below < alpha))
