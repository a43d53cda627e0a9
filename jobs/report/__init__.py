"""The benchmark report: one static HTML file with its plots embedded."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BEST_MARKER", "REGRESSION_MARKER", "VIOLATION_MARKER", "write_report"]


def __getattr__(name: str) -> Any:
    if name in __all__:  # matplotlib loads with the sections, when a report is written
        return getattr(importlib.import_module("jobs.report.page"), name)
    raise AttributeError(f"module 'jobs.report' has no attribute {name!r}")
