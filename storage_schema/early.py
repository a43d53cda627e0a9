"""The early pass's records, kept apart from the ledger so that an estimate is never read
as an exact figure."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline.errors import ConfigError
from storage_schema import record_keys
from storage_schema.provenance import canonical_json, now_iso, stable_hash

__all__ = ["EarlyRecords", "early_id"]


def early_id(*parts: Any) -> str:
    """The id of an early-pass record: a hash of what decides it."""
    return stable_hash(list(parts), length=32)


class EarlyRecords:
    """The early-pass records of a store, read and added by any number of processes."""

    def __init__(self, store):
        self.store = store
        self.backend = store.backend

    def put(self, kind: str, record: Mapping[str, Any]) -> bool:
        """Add a record (``id``, and ``dataset`` for a subset); an existing one is kept."""
        self.store.check_writable()
        if "id" not in record:
            raise ConfigError(f"an early {kind} record needs an 'id'")
        body = {**record, "kind": kind, "recorded": record.get("recorded", now_iso())}
        key = record_keys.early_record_key(kind, str(record["id"]), record.get("dataset"))
        return self.backend.create_exclusive(key, canonical_json(body).encode())

    def get(self, kind: str, id: str, dataset: str | None = None) -> dict[str, Any] | None:
        """The record of that id, or None."""
        raw = self.backend.read(record_keys.early_record_key(kind, id, dataset))
        return None if raw is None else json.loads(raw)

    def iter(self, kind: str, dataset: str | None = None) -> Iterator[dict[str, Any]]:
        """Every record of one kind (the subsets of one dataset, when given)."""
        if kind == "subsets":
            folders = [dataset] if dataset is not None else self.backend.list(record_keys.early_dir(kind),
                                                                                dirs_only=True)
        else:
            folders = self.backend.list(record_keys.early_dir(kind), dirs_only=True)
        for folder in folders:
            for name in self.backend.list(record_keys.early_dir(kind, folder)):
                if not name.endswith(".json"):  # a temporary file of a write in progress
                    continue
                raw = self.backend.read(f"{record_keys.early_dir(kind, folder)}/{name}")
                if raw is not None:
                    yield json.loads(raw)
