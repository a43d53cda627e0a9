"""What ``repeval results`` and ``repeval report`` show: a config's current records under
its own names, the store's history, and the failures on record."""

from __future__ import annotations

from typing import Any

from jobs.config import BenchmarkConfig
from jobs.evaluation.evaluate import identify_cells
from jobs.report.inputs import NAME_FIELDS, config_failures, history
from storage_schema.ledger import FailureLog, Ledger, latest_records


def config_cells(store, cfg: BenchmarkConfig) -> tuple[list[dict[str, Any]], list[Any], Any]:
    """(recorded cells as ``cell_id`` + names, cells without a record, the plan) of ``cfg``
    at its current settings, the checkpoint folders listed as they are now."""
    from jobs.plan import make_plan

    plan = make_plan(cfg, ready_only=False, record=False, store=store, check=False)
    ledger = Ledger(store)
    found, missing = [], []
    for cell, cid in zip(plan.cells, identify_cells(store, plan.cells)):
        if cid is not None and ledger.has(cid):
            found.append({"cell_id": cid, **{k: getattr(cell, k) for k in NAME_FIELDS}})
        else:
            missing.append(cell)
    from jobs.evaluation.encoder_cells import recorded_encoder_cells

    enc_found, enc_missing = recorded_encoder_cells(store, plan.encoder_cells)  # no encoder loaded
    return found + enc_found, missing + enc_missing, plan


def config_records(store, cfg: BenchmarkConfig, all_records: bool = False) -> tuple[list[dict[str, Any]], int]:
    """(rows, cells not evaluated yet): the config's current records under its names; with
    ``all_records`` its history too (older settings, replaced weights), marked not current."""
    from jobs.report.inputs import run_records

    cells, missing, plan = config_cells(store, cfg)
    rows = [{**r, "current": True} for r in run_records(store, cells)]
    if all_records:
        rows += [{**r, "current": False} for r in history(store, plan.config, rows)]
    return rows, len(missing)


def store_records(store, all_records: bool = False) -> list[dict[str, Any]]:
    """Every ledger record (``all_records``), or the latest per (model, dataset, layer, setting)."""
    records = list(Ledger(store))
    if all_records:
        chosen, _ = latest_records(records)
        latest = {r.get("cell_id") for r in chosen}
        return [{**r, "current": r.get("cell_id") in latest} for r in records]
    return latest_records(records)[0]


def failed_rows(store, cfg: BenchmarkConfig | None = None) -> list[dict[str, Any]]:
    """Failure records on file (of ``cfg``'s work when given), oldest first."""
    if cfg is None:
        return FailureLog(store).records()
    from jobs.plan import make_plan

    plan = make_plan(cfg, ready_only=False, record=False, store=store, check=False)
    return config_failures(store, plan.config, [*plan.cells, *plan.encoder_cells], plan.units)
