"""One story per comparison: the interval of the test that decides a verdict, and the line
saying why the bootstrap interval beside it may disagree."""

from __future__ import annotations

import math
from typing import Any

__all__ = ["agreement_line", "decided_by", "mcnemar_interval"]


def mcnemar_interval(a_only: int, b_only: int, n: int, confidence: float) -> tuple[float, float]:
    """The difference interval that inverts the exact McNemar test (Clopper-Pearson)."""
    m = int(a_only) + int(b_only)
    if m == 0 or n <= 0:
        return 0.0, 0.0
    from scipy import stats  # deferred: importing the comparison modules stays cheap (fast CLI)

    tail = (1.0 - confidence) / 2.0
    low = 0.0 if a_only == 0 else float(stats.beta.ppf(tail, a_only, m - a_only + 1))
    high = 1.0 if a_only == m else float(stats.beta.ppf(1.0 - tail, a_only + 1, m - a_only))
    scale = m / n
    return scale * (2.0 * low - 1.0), scale * (2.0 * high - 1.0)


def _excludes_zero(low: float, high: float) -> bool:
    return (low > 0.0 or high < 0.0) and math.isfinite(low) and math.isfinite(high)


def agreement_line(comparison: Any, verdict: str, p_adjusted: float, alpha: float) -> str | None:
    """Why the bootstrap interval and the verdict may disagree; None when they agree."""
    # The line names the reason that holds for this comparison: an interval at another level
    # than the test's alpha; the adjustment over the cells compared raising a p-value the test
    # alone would call; or the test itself not rejecting (for McNemar: the few discordant
    # images it is decided on).
    if verdict == "unreliable":
        return None
    c = comparison
    excludes = _excludes_zero(c.ci_low, c.ci_high)
    decided = verdict in ("better", "worse")
    if excludes == decided:
        return None
    level = f"{100 * c.confidence:g} %"
    # 1e-9: a level given as 1 - alpha is that level, whatever its last bit
    looser, stricter = 1.0 - c.confidence > alpha + 1e-9, 1.0 - c.confidence < alpha - 1e-9
    if c.test.startswith("mcnemar"):
        test = (f"the exact McNemar test on the {c.a_only + c.b_only} of {c.n} images where the two disagree "
                f"({c.a_only} only A right, {c.b_only} only B right)")
    elif c.test == "paired-t":
        test = f"a paired t test over the {c.n} episodes"
    else:
        test = f"a {c.test} test over the {c.n} paired units"
    if excludes:
        head = (f"why these differ: the {level} interval is a bootstrap interval of the difference; the verdict "
                f"is {test}, p = {c.p_value:.3g}, adjusted over the cells compared (Benjamini-Hochberg) to "
                f"{p_adjusted:.3g} > {alpha:g}: ")
        if c.p_value <= alpha:
            return head + (f"the test alone would call it (p = {c.p_value:.3g} <= {alpha:g}); the adjustment for "
                           "the other cells compared does not")
        if looser:
            return head + (f"the interval is at {level}, the verdict at the stricter alpha {alpha:g} (an interval "
                           f"at {100 * (1 - alpha):g} % matches it)")
        if c.test.startswith("mcnemar"):
            return head + (f"the test counts only the {c.a_only + c.b_only} discordant images, too few to call it; "
                           "the bootstrap also resamples the images where the two agree")
        return head + "the test, a different procedure, does not reach alpha on these units"
    head = (f"why these differ: the verdict is {test}, adjusted p = {p_adjusted:.3g} <= {alpha:g}; the {level} "
            "bootstrap interval of the difference")
    if stricter:
        return head + (f" is at a stricter level than alpha {alpha:g} (an interval at {100 * (1 - alpha):g} % "
                       "matches it) and reaches 0")
    return head + ", a different procedure, just reaches 0"


def decided_by(comparison: Any, verdict: str | None = None, p_adjusted: float | None = None,
               alpha: float = 0.05) -> dict[str, Any]:
    """How a comparison's verdict was decided, as plain fields for JSON and the report."""
    c = comparison
    test_ci: tuple[float | None, float | None] = (None, None)
    if c.test == "mcnemar-exact" and c.a_only is not None and c.b_only is not None:
        test_ci = mcnemar_interval(c.a_only, c.b_only, c.n, c.confidence)
    line = None
    if verdict is not None and p_adjusted is not None:
        line = agreement_line(c, verdict, p_adjusted, alpha)
    return {"test": c.test, "p_value": c.p_value, "n": c.n, "a_only": c.a_only, "b_only": c.b_only,
            "ci_low": c.ci_low, "ci_high": c.ci_high, "confidence": c.confidence,
            "test_ci_low": test_ci[0], "test_ci_high": test_ci[1], "agreement": line}
