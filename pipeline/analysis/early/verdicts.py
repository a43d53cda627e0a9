"""Early verdicts: a new encoder against an earlier one, before its exact figures exist.

An early verdict is drawn only where the interval allows: the early estimate's interval
lies wholly on one side of the earlier encoder's figure on the same scale.

- A calibrated estimate (``paired``, ``history``) is an estimate of the full figure, its
  interval calibrated on earlier exact figures: that is enough.
- A ``sampling`` estimate's interval covers only which test rows were drawn, not which
  train rows the readout was fitted on: the paired test on the early test rows (both
  readouts fitted on the same early train rows and scored on the same images, the test
  their exact cells would use), after the family's Benjamini-Hochberg adjustment, must
  also be significant, in the same direction.

Otherwise the early verdict is ``indistinguishable``. The exact cells' rules for drawing no
verdict hold here too: a record (or early fit) of either encoder with an ``unreliable``
fit warning gives ``unreliable``, and an estimate without an interval gives ``no verdict``.
"""

from __future__ import annotations

import math

from pipeline.analysis.early.estimate import Estimate

__all__ = ["CALIBRATED", "EARLY_VERDICTS", "early_verdict"]

EARLY_VERDICTS = ("better", "worse", "indistinguishable", "unreliable", "no verdict")
#: Estimates of the full figure whose intervals are calibrated on earlier exact figures.
CALIBRATED = ("paired", "history")


def early_verdict(estimate: Estimate, against: float, *, difference: float | None, p_adjusted: float | None,
                  alpha: float = 0.05, higher_is_better: bool = True,
                  unreliable: str | None = None) -> tuple[str, str]:
    """The early verdict of a new encoder (A) against an earlier one (B) on one cell.

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
    side = f"interval {estimate.low:.4g}..{estimate.high:.4g} {'above' if above else 'below'} {against:.4g}"
    if not (above or below):
        return "indistinguishable", f"interval {estimate.low:.4g}..{estimate.high:.4g} holds {against:.4g}"
    verdict = "better" if above == higher_is_better else "worse"
    if estimate.method in CALIBRATED:
        return verdict, f"{side} ({estimate.level:.0%} interval calibrated on exact figures)"
    if difference is None or p_adjusted is None or not math.isfinite(p_adjusted):
        return "no verdict", f"{side}, but a sampling interval needs the paired test on the early rows, not made"
    if p_adjusted <= alpha and (difference > 0) == above:
        return verdict, f"{side}, paired test on the early rows p = {p_adjusted:.2g}"
    return "indistinguishable", f"{side}, but the paired test on the early rows (p = {p_adjusted:.2g}) does not back it"
