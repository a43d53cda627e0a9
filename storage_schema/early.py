"""The early pass's records, kept apart from the ledger so that an estimate is never read
as an exact figure.

Four kinds, each a JSON record created once (exclusive create) and never overwritten, so
two runs that make the same record keep one: a ``subsets`` record names the rows an early
pass reads of a dataset (per split) and how they were chosen; a ``results`` record holds a
readout fitted on those rows of one encoder (its score and its predictions on the early
test rows); an ``estimates`` record an early estimate of a cell's full figure with its
interval and early verdicts; a ``checks`` record that estimate against the exact figure
that followed. Keys: ``storage_schema.record_keys.early_record_key``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline.errors import ConfigError
from storage_schema import record_keys
from storage_schema.provenance import canonical_json, now_iso, stable_hash

__all__ = ["EarlyRecords", "early_id"]


def early_id(*parts: Any) -> str:
    """The id of an early-pass record: a hash of what decides it.

    Parameters
    ----------
    *parts
        JSON-able values.

    Returns
    -------
    str
        32 hexadecimal digits.
    """
    return stable_hash(list(parts), length=32)


class EarlyRecords:
    """The early-pass records of a store, read and added by any number of processes.

    Parameters
    ----------
    store : FeatureStore
        The store holding them.
    """

    def __init__(self, store):
        self.store = store
        self.backend = store.backend

    def put(self, kind: str, record: Mapping[str, Any]) -> bool:
        """Add a record (``id``, and ``dataset`` for a subset); an existing one is kept.

        Parameters
        ----------
        kind : str
            ``subsets``, ``results``, ``estimates`` or ``checks``.
        record : mapping
            JSON-able.

        Returns
        -------
        bool
            True when added, False when a record of that id was there.
        """
        self.store.check_writable()
        if "id" not in record:
            raise ConfigError(f"an early {kind} record needs an 'id'")
        body = {**record, "kind": kind, "recorded": record.get("recorded", now_iso())}
        key = record_keys.early_record_key(kind, str(record["id"]), record.get("dataset"))
        return self.backend.create_exclusive(key, canonical_json(body).encode())

    def get(self, kind: str, id: str, dataset: str | None = None) -> dict[str, Any] | None:
        """The record of that id, or None.

        Parameters
        ----------
        kind : str
        id : str
        dataset : str, optional
            The dataset of a subset.

        Returns
        -------
        dict or None
        """
        raw = self.backend.read(record_keys.early_record_key(kind, id, dataset))
        return None if raw is None else json.loads(raw)

    def iter(self, kind: str, dataset: str | None = None) -> Iterator[dict[str, Any]]:
        """Every record of one kind (the subsets of one dataset, when given).

        Parameters
        ----------
        kind : str
        dataset : str, optional
            For ``subsets``: only that dataset's.

        Yields
        ------
        dict
        """
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
