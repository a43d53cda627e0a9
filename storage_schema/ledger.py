"""Results ledger: one immutable JSON record per evaluated cell.

A cell is (the feature arrays it read, protocol name, hash of the protocol's full
settings, protocol code version). Its id is a hash of exactly that, so a changed setting
is a new cell and an unchanged one is found again without recomputation. Records are
created with an exclusive create: never overwritten, never torn, and two processes that
evaluate the same cell at once keep one record.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from pipeline.errors import ConfigError, RecordNotFoundError
from storage_schema import keys
from storage_schema.keys import LEDGER
from storage_schema.provenance import canonical_json, now_iso, stable_hash
EXPORT_FORMATS = ("table", "csv", "parquet", "json")


def config_hash(settings: Mapping[str, Any]) -> str:
    """A short hash of a protocol's full settings.

    Parameters
    ----------
    settings : mapping
        The resolved settings.

    Returns
    -------
    str
        16 hexadecimal digits.
    """
    return stable_hash(dict(settings), length=16)


def cell_id(feature_fingerprints: Mapping[str, str], protocol: str, settings: Mapping[str, Any],
            protocol_version: int | str) -> str:
    """Content key of a cell: what it read and exactly how it was evaluated.

    Parameters
    ----------
    feature_fingerprints : mapping
        ``<split>.features`` / ``<split>.labels`` -> fingerprint of each array read.
    protocol : str
        The protocol's registry name.
    settings : mapping
        Its resolved settings.
    protocol_version : int or str
        The protocol's code version.

    Returns
    -------
    str
        The cell id (hexadecimal).
    """
    return stable_hash(
        {"features": dict(feature_fingerprints), "protocol": protocol,
         "settings": config_hash(settings), "version": str(protocol_version)}
    )


class Ledger:
    """The results of a store, read and appended by any number of processes.

    Parameters
    ----------
    store : FeatureStore
        The store holding the ledger.
    """

    def __init__(self, store):
        self.store = store
        self.backend = store.backend

    def has(self, cid: str) -> bool:
        """Whether the cell ``cid`` is recorded.

        Parameters
        ----------
        cid : str
            A cell id.

        Returns
        -------
        bool
            True when its record exists.
        """
        return self.backend.exists(keys.ledger_record_key(cid))

    def get(self, cid: str) -> dict[str, Any]:
        """The record of cell ``cid``.

        Parameters
        ----------
        cid : str
            A cell id.

        Returns
        -------
        dict
            The record.

        Raises
        ------
        RecordNotFoundError
            No record of that cell (also a KeyError).
        """
        raw = self.backend.read(keys.ledger_record_key(cid))
        if raw is None:
            raise RecordNotFoundError(f"no ledger record {cid!r} in store {self.store.url!r}")
        return json.loads(raw)

    def put(self, record: Mapping[str, Any]) -> bool:
        """Add a record; an existing record of the same cell is kept, never overwritten.

        Parameters
        ----------
        record : mapping
            The record; must carry ``cell_id``.

        Returns
        -------
        bool
            True when added, False when that cell was already recorded.
        """
        self.store.check_writable()
        if "cell_id" not in record:
            raise ConfigError("a ledger record needs a 'cell_id'")
        body = {**record, "recorded": record.get("recorded", now_iso())}
        return self.backend.create_exclusive(keys.ledger_record_key(body["cell_id"]), canonical_json(body).encode())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for shard in self.backend.list(LEDGER, dirs_only=True):
            for name in self.backend.list(keys.ledger_shard_key(shard)):
                cid = name.removesuffix(".json")
                if name.endswith(".json") and cid.startswith(shard):  # else not a record (a temporary file)
                    raw = self.backend.read(keys.ledger_record_key(cid))
                    if raw is not None:
                        yield json.loads(raw)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def to_frame(self):
        """One row per cell; scalar metrics as ``metric.<name>`` columns.

        Returns
        -------
        pandas.DataFrame
            Sorted by model, dataset, layer, protocol and setting.
        """
        import pandas as pd

        rows = []
        for rec in self:
            row = {k: v for k, v in rec.items() if not isinstance(v, (dict, list))}
            for name, value in (rec.get("metrics") or {}).items():
                if isinstance(value, (int, float, str, bool)) or value is None:
                    row[f"metric.{name}"] = value
            for name, value in (rec.get("diagnostics") or {}).items():
                if isinstance(value, (int, float, str, bool)) or value is None:
                    row[f"diag.{name}"] = value
            row["settings"] = canonical_json(rec.get("settings", {}))
            rows.append(row)
        frame = pd.DataFrame(rows)
        if not frame.empty:
            order = [c for c in ("model", "dataset", "layer", "protocol", "setting") if c in frame]
            frame = frame.sort_values(order + ["cell_id"]).reset_index(drop=True)
        return frame

    def export(self, path: str, fmt: str) -> None:
        """Write every record to a file.

        Parameters
        ----------
        path : str
            The file to write.
        fmt : str
            ``csv``, ``parquet`` (one row per cell) or ``json`` (the records as they are).
        """
        if fmt not in ("csv", "parquet", "json"):
            raise ConfigError(f"export format {fmt!r} is not supported; choose csv, parquet or json")
        frame = self.to_frame()
        if fmt == "csv":
            frame.to_csv(path, index=False)
        elif fmt == "parquet":
            frame.to_parquet(path, index=False)
        else:
            with open(path, "w") as f:
                json.dump(list(self), f, indent=1, default=str)
