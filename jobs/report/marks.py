"""The report's marks: one per severity, each its own glyph and colour, so a harmless
caution never looks like a regression (``jobs.report.html``'s style sheet colours them by class)."""

from __future__ import annotations

from jobs.report.html import Markup, el

#: A cell that got worse: significantly below the series' best so far, or B beats A.
REGRESSION_MARKER = "\u25bc"
#: A cell that got better (the newest checkpoint is the best so far there).
IMPROVEMENT_MARKER = "\u25b2"
#: A failure: no result at all.
FAILURE_MARKER = "\u2716"
#: A score not to be trusted (an ``unreliable`` fit warning): no verdict is drawn from it.
UNRELIABLE_MARKER = "\u26a0"
#: A caution that does not change a number (plateau, not_converged, ...).
CAUTION_MARKER = "\u2139"

_CLASS = {REGRESSION_MARKER: "mark-regression", IMPROVEMENT_MARKER: "mark-improvement",
          FAILURE_MARKER: "mark-failure", UNRELIABLE_MARKER: "mark-unreliable", CAUTION_MARKER: "mark-caution"}
_TITLE = {REGRESSION_MARKER: "regression", IMPROVEMENT_MARKER: "improvement", FAILURE_MARKER: "failure",
          UNRELIABLE_MARKER: "not to be trusted", CAUTION_MARKER: "caution (the number stands)"}

def mark(symbol: str) -> Markup:
    """``symbol`` (one of the markers above) as a coloured span with its meaning as the tooltip."""
    return el("span", symbol, class_=_CLASS.get(symbol, "mark"), title=_TITLE.get(symbol))
