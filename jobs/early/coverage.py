"""Coverage of each protocol setting's early intervals, from the recorded checks
(``jobs.early.checks``): when it is below the nominal level
(``pipeline.analysis.early.coverage_state``) the setting's early pass is off, with a
warning, until its settings change (another settings hash starts its count again)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.analysis.early import CoverageState, coverage_state
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords

__all__ = ["coverage_by_setting", "off_settings"]


def coverage_by_setting(checks: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], CoverageState]:
    """(protocol, config hash) -> the coverage of its checked intervals.

    Parameters
    ----------
    checks : iterable of mapping
        ``checks`` records.

    Returns
    -------
    dict
    """
    grouped: dict[tuple[str, str], tuple[list[bool], float]] = {}
    for c in checks:
        covered, _ = grouped.setdefault((c["protocol"], c["config_hash"]), ([], float(c["level"])))
        covered.append(bool(c["covered"]))
    return {k: coverage_state(v, level) for k, (v, level) in grouped.items()}


def off_settings(store: FeatureStore) -> dict[tuple[str, str], str]:
    """(protocol, config hash) -> why its early pass is off: its intervals' coverage is below nominal.

    Parameters
    ----------
    store : FeatureStore

    Returns
    -------
    dict
    """
    states = coverage_by_setting(EarlyRecords(store).iter("checks"))
    return {k: f"early pass off for this protocol setting: {s.line()}" for k, s in states.items() if s.off}
