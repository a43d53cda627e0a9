"""Gather one run's records from the ledger, correlate them, and write the report."""

from __future__ import annotations

import logging
from typing import Any

from jobs.config import BenchmarkConfig
from jobs.correlate import correlate_results, measured_reference
from jobs.report import write_report
from pipeline.errors import DataValidationError
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger

log = logging.getLogger(__name__)


def run_records(store: FeatureStore, cells: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Ledger records of (cell id, setting name) pairs, named as this run's config names them.

    A cell id is content (features + protocol + settings), so two names for identical
    settings share one record; each name still gets its own row in the report.
    """
    ledger = Ledger(store)
    return [{**ledger.get(cid), "setting": setting} for cid, setting in dict.fromkeys(cells)]


def reference_scores(records: list[dict[str, Any]], cfg: BenchmarkConfig) -> tuple[dict[str, float], str | None]:
    """Given reference scores plus measured ones; a measured reference that is missing is
    reported (second value), not fatal: the rest of the report is still worth having."""
    reference = cfg.reference_scores()
    if cfg.reference.dataset and cfg.reference.protocol:
        try:
            reference.update(measured_reference(records, cfg.reference.dataset, cfg.reference.protocol,
                                                metric=cfg.reference.metric))
        except DataValidationError as exc:
            return reference, f"measured reference unavailable: {exc}"
    return reference, None


def correlate_and_report(store: FeatureStore, cfg: BenchmarkConfig, cells: list[tuple[str, str]],
                         path: str | None = None, failed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``failed``: cells that raised a data error this run ({"cell", "error"}); listed in the report."""
    records = run_records(store, cells)
    reference, problem = reference_scores(records, cfg)
    if problem:
        log.warning(problem)
    correlation = correlate_results(records, cfg, reference) if reference else None
    out = write_report(records, correlation, cfg, path or cfg.report.path, reference=reference,
                       failed=failed or [], problems=[problem] if problem else [])
    return {"report": out, "correlation": correlation.to_dict() if correlation else None,
            "reference_problem": problem, "records": len(records), "failed": failed or []}
