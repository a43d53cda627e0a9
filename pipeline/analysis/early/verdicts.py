"""Early verdicts: a new encoder against an earlier one, before its exact figures exist."""

from __future__ import annotations

import math
from statistics import NormalDist

from pipeline.analysis.early.estimate import Estimate

__all__ = ["CALIBRATED", "EARLY_VERDICTS", "detectable_difference", "early_verdict"]

EARLY_VERDICTS = ("better", "worse", "indistinguishable", "unreliable", "no verdict")
#: Estimates of the full figure whose intervals are calibrated on earlier exact figures.
CALIBRATED = ("paired", "history")


def detectable_difference(discordant: float, n_test: int, alpha: float = 0.05) -> float:
    """The smallest difference of accuracy the exact paired test could find between two
    encoders on ``n_test`` test images, of which a fraction ``discordant`` is right for one
    of them only: McNemar's test in its normal approximation, ``z * sqrt(discordant / n_test)``
    with ``z`` the two-sided ``alpha`` quantile (the exact cells' false discovery rate,
    before its adjustment over the family, so the margin errs small).

    Parameters
    ----------
    discordant : float
        Fraction of the images (estimated on the early test rows) on which exactly one of the
        two encoders is right, in [0, 1].
    n_test : int
        Images of the whole test split.
    alpha : float
        The exact tests' level.

    Returns
    -------
    float
        In accuracy (a fraction).
    """
    if not 0.0 <= discordant <= 1.0 or n_test < 1:
        raise ValueError(f"discordant must be in [0, 1] and n_test at least 1, got {discordant!r} and {n_test!r}")
    return NormalDist().inv_cdf(1 - alpha / 2) * math.sqrt(discordant / n_test)


def early_verdict(estimate: Estimate, against: float, *, difference: float | None, p_adjusted: float | None,
                  alpha: float = 0.05, higher_is_better: bool = True,
                  unreliable: str | None = None, detectable: float = 0.0) -> tuple[str, str]:
    """The early verdict of a new encoder (A) against an earlier one (B) on one cell.

    The paired test on the early rows is the direct evidence: where it is significant it
    decides a calibrated estimate's verdict (a line fitted on the history never overturns
    it), and where it leans against a calibrated interval's side there is no verdict. An
    uncalibrated estimate (``change``, ``sampling``) needs both its interval and that test.

    Parameters
    ----------
    estimate : Estimate
        A's early estimate.
    against : float
        B's figure on the estimate's scale: its exact figure for a calibrated estimate, its
        early-fitted readout over the whole test split for a ``sampling`` one.
    difference : float or None
        A - B on the early test rows (None: no paired test could be made).
    p_adjusted : float or None
        The paired test's p-value, adjusted over the family.
    alpha : float
        The false discovery rate of the paired tests.
    higher_is_better : bool
        The metric's direction.
    unreliable : str or None
        Why either encoder's figure is not to be trusted (a fit warning), if so.
    detectable : float
        The smallest difference the exact test could find (:func:`detectable_difference`):
        an interval that clears ``against`` by less says so in the reason (0: never said).

    Returns
    -------
    tuple of str
        The verdict (one of :data:`EARLY_VERDICTS`) and the reason, in words.
    """
    if unreliable:
        return "unreliable", unreliable
    if not estimate.has_interval:
        return "no verdict", "the estimate states no interval"
    above, below = estimate.low > against, estimate.high < against
    tested = difference is not None and p_adjusted is not None and math.isfinite(p_adjusted) and difference != 0
    early_rows = f"paired test on the early rows {difference:+.3g}, p = {p_adjusted:.2g}" if tested else ""
    if estimate.method in CALIBRATED and tested and p_adjusted <= alpha:
        # the early rows' own test is direct evidence: a line fitted on the history may
        # narrow an interval, never overturn what the same rows show significantly
        verdict = "better" if (difference > 0) == higher_is_better else "worse"
        agrees = (above or below) and (difference > 0) == above
        interval = f"calibrated interval {estimate.low:.4g}..{estimate.high:.4g}"
        return verdict, (f"{early_rows}; the {interval} agrees" if agrees else
                         f"{early_rows}, which decides: the {interval} "
                         f"{'says otherwise' if above or below else f'holds {against:.4g}'}")
    side = f"interval {estimate.low:.4g}..{estimate.high:.4g} {'above' if above else 'below'} {against:.4g}"
    if not (above or below):
        return "indistinguishable", f"interval {estimate.low:.4g}..{estimate.high:.4g} holds {against:.4g}"
    if (estimate.low - against if above else against - estimate.high) <= detectable:
        side += (f", by less than the {detectable:.3g} the exact test could find on the whole test split "
                 "(the exact verdict may be indistinguishable)")
    verdict = "better" if above == higher_is_better else "worse"
    if estimate.method in CALIBRATED:
        if tested and (difference > 0) != above:  # the early rows lean the other way: no verdict against them
            return "indistinguishable", f"{side}, but the early rows point the other way ({early_rows})"
        return verdict, f"{side} ({estimate.level:.0%} interval calibrated on exact figures)"
    if difference is None or p_adjusted is None or not math.isfinite(p_adjusted):
        return "no verdict", f"{side}, but a sampling interval needs the paired test on the early rows, not made"
    if p_adjusted <= alpha and (difference > 0) == above:
        return verdict, f"{side}, paired test on the early rows p = {p_adjusted:.2g}"
    return "indistinguishable", f"{side}, but the paired test on the early rows (p = {p_adjusted:.2g}) does not back it"
