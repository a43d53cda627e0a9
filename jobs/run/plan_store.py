"""A run's plan, written once into the store and read back by the run's flow."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from jobs.config import BenchmarkConfig
from jobs.config.checkpoint_folders import alias_line
from jobs.config.typed import from_plain
from jobs.evaluation.cell import Cell
from jobs.run.plan import ExtractUnit, Plan
from pipeline.errors import StoreError
from pipeline.plain import to_plain
from storage_schema import record_keys
from storage_schema.provenance import canonical_json, stable_hash

__all__ = ["PLAN_VERSION", "RunPlan", "plan_notes", "read_plan", "write_plan"]

#: Version of the plan file's layout.
PLAN_VERSION = 1


@dataclass
class RunPlan:
    """What a run's flow reads back: the planned config, its units and cells, the plan's
    notes for the summary and each cell's peak memory (by label)."""

    config: BenchmarkConfig
    units: list[ExtractUnit]
    cells: list[Cell]
    notes: dict[str, Any] = field(default_factory=dict)
    cell_memory: dict[str, int | None] = field(default_factory=dict)


def plan_notes(plan: Plan, new_encoders: list[str] | None = None) -> dict[str, Any]:
    """What the run's summary says about the plan: new encoders, files waiting or skipped,
    refused checkpoints, data notes, scan notes, the scanned files' signatures."""
    return {"new_encoders": list(new_encoders or []), "waiting": list(plan.scan.waiting),
            "skipped": list(plan.scan.skipped), "checkpoint_failures": list(plan.checkpoint_failures),
            "data_notes": list(plan.data_notes), "scan_notes": list(plan.scan.notes) + [alias_line(a) for a in plan.scan.aliases],
            "aliases": list(plan.scan.aliases),
            "scanned": {f.encoder.name: [*f.signature, f.settings] for f in plan.scan.taken}}


def write_plan(store: Any, plan: Plan, new_encoders: list[str] | None = None) -> str:
    """Write ``plan`` into ``store`` once (see the module doc); its key."""
    body = {"version": PLAN_VERSION, "config": to_plain(plan.config), "units": [to_plain(u) for u in plan.units],
            "cells": [to_plain(c) for c in plan.cells], "notes": plan_notes(plan, new_encoders),
            "cell_memory": dict(plan.cell_memory)}
    text = canonical_json(body)
    key = record_keys.plan_key(stable_hash(body))
    store.check_writable()
    store.backend.write_atomic(key, text.encode())
    return key


def read_plan(store: Any, key: str) -> RunPlan:
    """The plan :func:`write_plan` wrote under ``key``."""
    raw = store.backend.read(key)
    if raw is None:
        raise StoreError(f"no run plan {key} in the store {store.url}; a run writes its plan before its flow starts")
    body = json.loads(raw)
    if body.get("version") != PLAN_VERSION:
        raise StoreError(f"run plan {key} has layout version {body.get('version')!r}; this repeval reads "
                         f"version {PLAN_VERSION}")
    return RunPlan(from_plain(BenchmarkConfig, body["config"], "plan.config"),
                   [from_plain(ExtractUnit, u, f"plan.units[{i}]") for i, u in enumerate(body["units"])],
                   [from_plain(Cell, c, f"plan.cells[{i}]") for i, c in enumerate(body["cells"])],
                   dict(body["notes"]), dict(body["cell_memory"]))
