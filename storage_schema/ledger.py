"""Results ledger: one immutable JSON record per evaluated cell."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from pipeline.errors import ConfigError, RecordNotFoundError
from storage_schema import record_keys
from storage_schema.keys import LEDGER
from storage_schema.provenance import canonical_json, now_iso, stable_hash
from storage_schema.tables import EXPORT_FORMATS, export_records, records_frame
# What can fail: a scanned checkpoint file, an extraction unit (encoder/dataset/split), an
# evaluation cell (encoder/dataset/layer:setting) and a config's correlation + report step.
FAILURE_KINDS = ("checkpoint", "extraction", "cell", "correlation")


def config_hash(settings: Mapping[str, Any]) -> str:
    """A short hash of a protocol's full settings."""
    return stable_hash(dict(settings), length=16)


def cell_id(feature_fingerprints: Mapping[str, str], protocol: str, settings: Mapping[str, Any],
            protocol_version: int | str) -> str:
    """Content key of a cell: what it read and exactly how it was evaluated."""
    return stable_hash(
        {"features": dict(feature_fingerprints), "protocol": protocol,
         "settings": config_hash(settings), "version": str(protocol_version)}
    )


def encoder_fingerprints(weights_fingerprint: str, model_input: str,
                         image_fingerprints: Mapping[str, str]) -> dict[str, str]:
    """What an encoder-protocol cell reads, as :func:`cell_id` takes it: identical weights
    under another name give the same fingerprints, hence the same cell."""
    return {"weights": str(weights_fingerprint), "input": str(model_input),
            **{f"{split}.images": str(fp) for split, fp in image_fingerprints.items()}}


class Ledger:
    """The results of a store, read and appended by any number of processes."""

    def __init__(self, store):
        self.store = store
        self.backend = store.backend

    def has(self, cid: str) -> bool:
        """Whether the cell ``cid`` is recorded."""
        return self.backend.exists(record_keys.ledger_record_key(cid))

    def get(self, cid: str) -> dict[str, Any]:
        """The record of cell ``cid``."""
        raw = self.backend.read(record_keys.ledger_record_key(cid))
        if raw is None:
            raise RecordNotFoundError(f"no ledger record {cid!r} in store {self.store.url!r}")
        return json.loads(raw)

    def put(self, record: Mapping[str, Any]) -> bool:
        """Add a record; an existing record of the same cell is kept, never overwritten."""
        self.store.check_writable()
        if "cell_id" not in record:
            raise ConfigError("a ledger record needs a 'cell_id'")
        body = {**record, "recorded": record.get("recorded", now_iso())}
        return self.backend.create_exclusive(record_keys.ledger_record_key(body["cell_id"]), canonical_json(body).encode())

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for shard in self.backend.list(LEDGER, dirs_only=True):
            for name in self.backend.list(record_keys.ledger_shard_key(shard)):
                cid = name.removesuffix(".json")
                if name.endswith(".json") and cid.startswith(shard):  # else not a record (a temporary file)
                    raw = self.backend.read(record_keys.ledger_record_key(cid))
                    if raw is not None:
                        yield json.loads(raw)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def to_frame(self):
        """One row per cell; scalar metrics as ``metric.<name>`` columns."""
        return records_frame(self)

    def export(self, path: str, fmt: str) -> None:
        """Write every record to a file."""
        export_records(list(self), path, fmt)


def latest_records(records: Iterable[Mapping[str, Any]],
                   current: Mapping[str, tuple[str, str]] | None = None) -> tuple[list[dict], list[dict]]:
    """(records in use, records set aside): one record per (setting, layer, model, dataset)."""
    # A ledger keeps every record it was ever given. ``current`` maps a setting name to the
    # (protocol, config hash) of its current settings: records of that name with other
    # settings are set aside. Of several records left for the same cell, the most recently
    # recorded is used and the others are set aside.
    current = current or {}
    chosen: dict[tuple, dict] = {}
    aside: list[dict] = []
    for rec in records:
        rec = dict(rec)
        wanted = current.get(rec.get("setting"))
        if wanted is not None and (rec.get("protocol"), rec.get("config_hash")) != tuple(wanted):
            aside.append(rec)
            continue
        key = (rec.get("setting"), rec.get("layer"), rec.get("model"), rec.get("dataset"))
        old = chosen.get(key)
        if old is None:
            chosen[key] = rec
        elif _recency(rec) > _recency(old):
            chosen[key] = rec
            aside.append(old)
        else:
            aside.append(rec)
    return list(chosen.values()), aside


def _recency(rec: Mapping[str, Any]) -> tuple[str, str]:
    return str(rec.get("recorded") or ""), str(rec.get("cell_id") or "")


def failure_id(*parts: str) -> str:
    """Id of a failure from the names of what failed (not its settings): a later success of
    the same thing, whatever it changed, finds and clears it."""
    return stable_hash([str(p) for p in parts], length=16)


class FailureLog:
    """What failed in the runs on a store, one JSON record per failed thing (not results)."""
    # A record holds ``kind`` (one of ``FAILURE_KINDS``), ``id``, ``label`` (e.g.
    # ``r18/tex/pre_logits:few5``), ``error_type``, ``reason`` (one line), ``first_failed``,
    # ``recorded`` (the latest failure), ``attempts``, plus what names the failed thing
    # (``model``, ``dataset``, ``layer``, ``setting``, ``split``, ``file``, ``size``,
    # ``mtime_ns``...). Recording again overwrites it atomically and counts the attempt.

    def __init__(self, store):
        self.store = store
        self.backend = store.backend

    @staticmethod
    def _key(kind: str, fid: str) -> str:
        if kind not in FAILURE_KINDS:
            raise ConfigError(f"failure kind {kind!r} is not one of {', '.join(FAILURE_KINDS)}")
        return record_keys.failure_key(kind, fid)

    def get(self, kind: str, fid: str) -> dict[str, Any] | None:
        """The failure record, or None when that thing has not failed (or was cleared)."""
        raw = self.backend.read(self._key(kind, fid))
        return json.loads(raw) if raw is not None else None

    def record(self, kind: str, fid: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Record (or record again) a failure; returns the record as written."""
        for needed in ("label", "reason"):
            if needed not in body:
                raise ConfigError(f"a failure record needs {needed!r}")
        old = self.get(kind, fid) or {}
        now = now_iso()
        rec = {**body, "kind": kind, "id": fid, "recorded": now,
               "first_failed": old.get("first_failed", now), "attempts": int(old.get("attempts", 0)) + 1}
        self.backend.write_atomic(self._key(kind, fid), canonical_json(rec).encode())
        return rec

    def clear(self, kind: str, fid: str) -> bool:
        """Remove a failure record (the thing succeeded); True when there was one."""
        key = self._key(kind, fid)
        if not self.backend.exists(key):
            return False
        self.backend.delete(key)
        return True

    def ids(self, kind: str) -> set[str]:
        """Ids of the failures of one kind (one listing, no reads)."""
        self._key(kind, "x")  # validates the kind
        return {n[:-len(".json")] for n in self.backend.list(record_keys.failures_dir(kind)) if n.endswith(".json")}

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every failure record (of ``kind``, or of all kinds), oldest first failure first."""
        out = []
        for k in (kind,) if kind else FAILURE_KINDS:
            for fid in sorted(self.ids(k)):
                rec = self.get(k, fid)
                if rec is not None:
                    out.append(rec)
        return sorted(out, key=lambda r: (str(r.get("first_failed")), str(r.get("label"))))
