"""The benchmark report: one static HTML file with its plots embedded.

Sections: failures and fit warnings (at the top, never hidden), the summary (leaderboard, regressions, what
changed since the previous run), checkpoint series, data problems, accuracy tables per protocol
setting and layer (best per column marked), the best layer per encoder, low-shot curves
(absolute and relative to a baseline encoder, ImageNet-CoG style), accuracy per ImageNet-CoG
level (when the run has level datasets), correlation scatters
against the reference (Ericsson et al. 2021, figure 1), the rank agreement between protocol
settings (figure 7: Kendall's tau matrix, flips, radar charts), the invariance audit, calibration,
the dense readouts (segmentation and surface normals, with predicted maps), solver warnings
and, one click from every number, each record's provenance. The overview's table of contents
lists the sections with content (``html.section(..., empty=True)`` marks one that only says
there is nothing to show).

Where to look: ``page`` (``write_report``: the sections in page order), ``sections/`` (one
module per topic), ``html`` (escaping building blocks), ``plots`` (matplotlib figures),
``model`` (what the report is built from), ``files`` (the atomic write), ``inputs`` (the
records a config's report shows), ``run_summary`` and ``events`` (a run's summary and the
payloads of its events). Importing this package loads no plotting library: ``write_report``
and the markers come from ``page`` on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BEST_MARKER", "REGRESSION_MARKER", "VIOLATION_MARKER", "write_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:  # matplotlib loads with the sections, when a report is written
        return getattr(importlib.import_module("jobs.report.page"), name)
    raise AttributeError(f"module 'jobs.report' has no attribute {name!r}")
