"""A cell's ledger record: built one way for every protocol, written one way."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from jobs.evaluation.encoder_identity import point_identity
from jobs.evaluation.cell import Cell
from pipeline.plain import to_plain
from storage_schema import FeatureStore, record_keys
from storage_schema.evidence import write_evidence, write_predicted_maps
from storage_schema.keys import evidence_group_key
from storage_schema.ledger import Ledger, config_hash
from storage_schema.provenance import canonical_json, now_iso

__all__ = ["cell_lease", "cell_record", "point_to", "work_lease", "write_record"]

log = logging.getLogger(__name__)


@contextmanager
def cell_lease(store: FeatureStore, cid: str, label: str) -> Iterator[None]:
    """Hold the lease of cell ``cid`` while it is computed (``storage_schema.record_keys.cell_work_key``):
    a second run asked for the same cell waits here, then finds its record in the ledger."""
    with work_lease(store, record_keys.cell_work_key(cid), f"cell {label} is being computed by another run: "
                    "waiting for its record"):
        yield


@contextmanager
def work_lease(store: FeatureStore, key: str, waiting: str) -> Iterator[None]:
    """Hold the lease on ``key`` while a piece of work runs, saying ``waiting`` (once) when
    another run holds it."""
    lease = store.lease(key)
    if not lease.acquire(wait=False):
        log.info("%s", waiting)
        lease.acquire()
    try:
        yield
    finally:
        lease.release()


def cell_record(cell: Cell, cid: str, settings: dict[str, Any], fingerprints: dict[str, str], result: Any, *,
                n_train: int, n_test: int, timings: dict[str, Any], provenance: dict[str, Any],
                **extra: Any) -> dict[str, Any]:
    """The ledger record of ``cell``'s ``result``."""
    entry = cell.entry
    return to_plain({
        "cell_id": cid, "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
        "setting": cell.setting, "protocol": cell.protocol, "protocol_version": entry.version,
        "settings": settings, "config_hash": config_hash(entry.result_settings(settings)), "splits": cell.splits(),
        "fingerprints": fingerprints, "metrics": dict(result.metrics), "diagnostics": dict(result.diagnostics),
        "warnings": result.warnings, "converged": bool(result.diagnostics.get("converged", True)),
        "n_train": int(n_train), "n_test": int(n_test), **extra, "timings": timings,
        # what the config's encoder and dataset were (jobs.evaluation.encoder_identity); None: unknown
        "provenance": {**provenance, "config_identity": cell.identity},
        "recorded": now_iso(),
    })


def write_record(store: FeatureStore, ledger: Ledger, cell: Cell, record: dict[str, Any], result: Any,
                 labels_key: str | None = None) -> bool:
    """Write what the record names, then the record (see the module doc)."""
    cid = record["cell_id"]
    if result.pictures is not None:  # first, so that a record never lacks its pictures
        store.backend.write_atomic(record_keys.examples_key(cid), result.pictures)
    if result.evidence is None:
        added = ledger.put(record)
    else:
        added = _put_with_evidence(store, ledger, record, result.evidence, labels_key, result.maps)
    if not cell.entry.reads_features:  # its id needs the encoder built: a listing finds it by its names
        point_to(store, cell, cid)
    point_identity(store, cell.identity, cell, cid)  # found again once the name holds other weights
    if not added:
        log.info("cell %s was recorded by another process meanwhile", cid)
    return added


def point_to(store: Any, cell: Cell, cid: str) -> None:
    """Remember that the weights cell of these names uses record ``cid`` (a later listing
    finds it without building the encoder)."""
    body = {"cell_id": cid, "protocol": cell.protocol, "updated": now_iso()}
    store.backend.write_atomic(record_keys.encoder_cell_key(cell.model, cell.dataset, cell.setting),
                               canonical_json(body).encode())


def _put_with_evidence(store: FeatureStore, ledger: Ledger, rec: dict[str, Any], evidence: Any,
                       labels_key: str | None, maps: Any = None) -> bool:
    """Store the cell's evidence (and a dense cell's predicted test maps), then its record,
    both under the cell's evidence lease: a second process evaluating the same cell finds
    the record once it gets the lease and leaves the evidence alone."""
    cid = rec["cell_id"]
    with store.lease(evidence_group_key(cid)) as lease:
        if ledger.has(cid):
            return False
        rec["evidence"] = {**write_evidence(store, lease, cid, evidence), "labels": labels_key}
        if maps is not None:
            rec["predicted_maps"] = write_predicted_maps(store, lease, cid, maps)
        return ledger.put(rec)


