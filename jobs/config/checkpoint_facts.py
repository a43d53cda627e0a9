"""The checkpoint facts of a store: what folder scans read from checkpoint files (steps,
content fingerprints; ``pipeline.encoders.checkpoints.facts``), kept in the store so the
next process scanning an unchanged folder (a rerun, the next scheduled scan) reads no
file and imports no torch."""

from __future__ import annotations

import json
from typing import Any

from pipeline.encoders.checkpoints.facts import export_facts, load_facts
from storage_schema.record_keys import checkpoint_facts_key

__all__ = ["keep_facts", "take_facts"]


def take_facts(store: Any) -> dict[str, Any]:
    """Load the store's checkpoint facts into this process; returns them as stored (empty
    when there are none or they cannot be read: the files are read instead)."""
    if store is None:
        return {}
    try:
        raw = store.backend.read(checkpoint_facts_key())
        stored = json.loads(raw) if raw is not None else {}
    except (OSError, ValueError):
        return {}
    if isinstance(stored, dict):
        load_facts(stored)
        return stored
    return {}


def keep_facts(store: Any, before: dict[str, Any]) -> None:
    """Store this process's checkpoint facts when it learned any since ``before`` (a
    read-only store keeps none; a racing writer's new facts are read again next time)."""
    if store is None or store.read_only:
        return
    now = export_facts()
    if now != before:
        store.backend.write_atomic(checkpoint_facts_key(), json.dumps(now, sort_keys=True).encode())
