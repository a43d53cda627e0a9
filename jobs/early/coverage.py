"""Coverage of each protocol setting's early intervals, from the recorded checks
(``jobs.early.checks``): when it is below the nominal level
(``pipeline.analysis.early.coverage_state``) the setting's early pass is off, with a
warning, until its settings change (another settings hash starts its count again); after a
gross miss its history lines are set aside until an interval holds again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pipeline.analysis.early import CoverageState, coverage_state, gross_miss
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords

__all__ = ["coverage_by_setting", "off_settings", "uncalibrated_settings"]


def coverage_by_setting(checks: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], CoverageState]:
    """(protocol, config hash) -> the coverage of its checked intervals, in the order they
    were checked (checks recorded before the time was kept come first)."""
    grouped: dict[tuple[str, str], tuple[list[Mapping[str, Any]], float]] = {}
    for c in checks:
        grouped.setdefault((c["protocol"], c["config_hash"]), ([], float(c["level"])))[0].append(c)
    out = {}
    for key, (group, level) in grouped.items():
        group = sorted(group, key=lambda c: (str(c.get("checked") or ""), str(c.get("id"))))
        out[key] = coverage_state([bool(c["covered"]) for c in group], level,
                                  gross=[gross_miss(c.get("low"), c.get("high"), float(c["target"]))
                                         if c.get("target") is not None else False for c in group])
    return out


def off_settings(store: FeatureStore) -> dict[tuple[str, str], str]:
    """(protocol, config hash) -> why its early pass is off: its intervals' coverage is below nominal."""
    states = coverage_by_setting(EarlyRecords(store).iter("checks"))
    return {k: f"early pass off for this protocol setting: {s.line()}" for k, s in states.items() if s.off}


def uncalibrated_settings(store: FeatureStore) -> dict[tuple[str, str], str]:
    """(protocol, config hash) -> why its history lines are not used now: a gross miss not
    yet followed by an interval that held (its estimates fall back to the early rows' own)."""
    states = coverage_by_setting(EarlyRecords(store).iter("checks"))
    return {k: f"calibration off for this protocol setting: {s.line()}" for k, s in states.items()
            if s.tripped and not s.off}
