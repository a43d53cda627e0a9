"""What ``repeval results`` and ``repeval report`` show: a config's current records under
its own names, the store's history, and the failures on record."""

from __future__ import annotations

from typing import Any

from jobs.config import BenchmarkConfig
from jobs.evaluation.identity import recorded_cells
from jobs.plan import make_plan
from jobs.report.inputs import config_failures, history, run_records
from storage_schema.ledger import FailureLog, Ledger, latest_records


def config_cells(store, cfg: BenchmarkConfig) -> tuple[list[dict[str, Any]], list[Any], Any]:
    """(recorded cells as ``cell_id`` + names, cells without a record, the plan) of ``cfg``
    at its current settings, the checkpoint folders listed as they are now (no encoder is
    loaded: ``jobs.evaluation.identity.recorded_cells``)."""
    plan = make_plan(cfg, ready_only=False, record=False, store=store, check=False)
    found, missing = recorded_cells(store, plan.cells)
    return found, missing, plan


def config_records(store, cfg: BenchmarkConfig, all_records: bool = False) -> tuple[list[dict[str, Any]], int]:
    """(rows, cells not evaluated yet): the config's current records under its names; with
    ``all_records`` its history too (older settings, replaced weights), marked not current."""
    cells, missing, plan = config_cells(store, cfg)
    rows = [{**r, "current": True} for r in run_records(store, cells)]
    if all_records:
        rows += [{**r, "current": False} for r in history(store, plan.config, rows)]
    return rows, len(missing)


def store_records(store, all_records: bool = False,
                  records: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every ledger record (``all_records``), or the latest per (model, dataset, layer,
    setting); ``records``: the ledger's records when already read."""
    records = list(Ledger(store)) if records is None else records
    if all_records:
        chosen, _ = latest_records(records)
        latest = {r.get("cell_id") for r in chosen}
        return [{**r, "current": r.get("cell_id") in latest} for r in records]
    return latest_records(records)[0]


def failed_rows(store, cfg: BenchmarkConfig | None = None) -> list[dict[str, Any]]:
    """Failure records on file (of ``cfg``'s work when given), oldest first."""
    if cfg is None:
        return FailureLog(store).records()

    plan = make_plan(cfg, ready_only=False, record=False, store=store, check=False)
    return config_failures(store, plan.config, plan.cells, plan.units)
