"""A cell's evidence in the store: written before its ledger record, read back checked.

Each evidence array (test predictions, multi-label scores, per-episode accuracies, the
predictions of every low-shot fit) is one small single-chunk Zarr array under
``evidence/<cell id[:2]>/<cell id>/<kind>``, written through the store's one write path by
the holder of the cell's evidence lease. The ledger record's ``evidence`` entry names the
key and the SHA-256 of the array (dtype, shape and bytes); a reader recomputes it, so
evidence changed or replaced since the record was made is refused, not compared. A dense
cell also keeps its predicted test maps there (``.../maps``, chunked by images), named by
the record's ``predicted_maps`` entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import ArrayNotFoundError, StaleArrayError, StoreError
from pipeline.protocols.evidence import Evidence, evidence_sha256
from storage_schema import keys
from storage_schema.leases import Lease
from storage_schema.provenance import stable_hash
from storage_schema.writing import ArraySpec

__all__ = ["MAP_CHUNK_ROWS", "EvidenceProblem", "iter_evidence_keys", "read_evidence", "verify_evidence",
           "write_evidence", "write_predicted_maps"]


def write_evidence(store, lease: Lease, cell_id: str, evidence: Evidence) -> dict[str, Any]:
    """Store one cell's evidence; return the record's ``evidence`` entry.

    Parameters
    ----------
    store : FeatureStore
        A writable store.
    lease : Lease
        The held lease of ``keys.evidence_group_key(cell_id)``.
    cell_id : str
        The cell the evidence belongs to.
    evidence : Evidence
        What the protocol returned.

    Returns
    -------
    dict
        ``Evidence.record`` of the stored array (key, kind, sha256, fingerprint...).
    """
    values = np.ascontiguousarray(evidence.values)
    if values.ndim == 0 or values.shape[0] == 0:
        raise StoreError(f"evidence of cell {cell_id} is empty (shape {values.shape}); nothing to store")
    key = keys.evidence_key(cell_id, evidence.kind)
    sha = evidence_sha256(values)
    attrs = {"fingerprint": stable_hash([cell_id, evidence.kind, sha]), "cell_id": cell_id, "kind": evidence.kind,
             "sha256": sha, "metric": evidence.metric,
             f"{evidence.fingerprint_of}_fingerprint": evidence.fingerprint}
    spec = ArraySpec(key, values.shape, int(values.shape[0]), str(values.dtype), attrs)
    store.write_arrays(lease, [spec], lambda todo: [(0, {key: values})])
    return evidence.record(key, sha)


def read_evidence(store, entry: Mapping[str, Any], what: str = "this cell") -> np.ndarray:
    """Read the evidence a record names, refusing it when it is not what the record was made from.

    Parameters
    ----------
    store : FeatureStore
        The store holding it.
    entry : mapping
        The record's ``evidence`` entry.
    what : str
        The cell, for messages.

    Returns
    -------
    numpy.ndarray
        The stored array.

    Raises
    ------
    ArrayNotFoundError
        The array is missing.
    StaleArrayError
        Its SHA-256 differs from the record's (rewritten or damaged since).
    """
    array = store.open_array(str(entry["key"])).read()
    found = evidence_sha256(array)
    if found != entry.get("sha256"):
        raise StaleArrayError(
            f"the evidence of {what} ({entry['key']}) is not what its record was made from (sha256 "
            f"{found[:12]}, recorded {str(entry.get('sha256'))[:12]}); check the store with `repeval verify` "
            "and re-evaluate the cell"
        )
    return array


def iter_evidence_keys(store) -> Iterator[str]:
    """Every evidence array of the store, in key order.

    Parameters
    ----------
    store : FeatureStore
        The store.

    Returns
    -------
    iterator of str
        The keys.
    """
    b = store.backend
    for shard in sorted(b.list(keys.evidence_prefix(), dirs_only=True)):
        for cid in sorted(b.list(keys.evidence_prefix(shard), dirs_only=True)):
            for name in sorted(b.list(keys.evidence_prefix(shard, cid), dirs_only=True)):
                key = keys.evidence_prefix(shard, cid, name)
                if b.exists(keys.node_metadata_key(key)):
                    yield key


@dataclass(frozen=True)
class EvidenceProblem:
    """Something wrong with one record's evidence.

    Parameters
    ----------
    key : str
        The evidence array's key.
    cell_id : str
        The cell whose record names it.
    problem : str
        ``missing``, ``incomplete``, ``damaged`` (a chunk fails its crc32c) or ``changed``
        (its SHA-256 differs from the record's).
    detail : str
        What was found, in words.
    """

    key: str
    cell_id: str
    problem: str
    detail: str

    def line(self) -> str:
        """One line for the terminal.

        Returns
        -------
        str
        """
        return f"{self.problem:10s} {self.key} (cell {self.cell_id}): {self.detail}"


def verify_evidence(store, records: Iterable[Mapping[str, Any]]) -> tuple[int, list[EvidenceProblem]]:
    """Check every record's evidence: present, complete, chunks intact, SHA-256 as recorded.

    Parameters
    ----------
    store : FeatureStore
        The store.
    records : iterable of mapping
        Ledger records (those without evidence are skipped).

    Returns
    -------
    (int, list of EvidenceProblem)
        How many evidence arrays were checked, and the problems found.
    """
    checked, problems = 0, []
    for rec in records:
        entry = rec.get("evidence")
        if not isinstance(entry, Mapping):
            continue
        checked += 1
        key, cid = str(entry.get("key")), str(rec.get("cell_id"))
        st = store.status(key)
        if st is None:
            problems.append(EvidenceProblem(key, cid, "missing", "the record names evidence the store does not hold"))
            continue
        if not st.complete:
            problems.append(EvidenceProblem(key, cid, "incomplete", "its write never finished"))
            continue
        bad = store.damaged_chunks(key)
        if bad:
            problems.append(EvidenceProblem(key, cid, "damaged", f"chunk(s) {bad} fail their checksum"))
            continue
        try:
            read_evidence(store, entry, cid)
        except StaleArrayError as exc:
            problems.append(EvidenceProblem(key, cid, "changed", str(exc)))
        except ArrayNotFoundError as exc:
            problems.append(EvidenceProblem(key, cid, "missing", str(exc)))
    return checked, problems


#: Test images per chunk of a dense cell's predicted maps.
MAP_CHUNK_ROWS = 16


def write_predicted_maps(store, lease: Lease, cell_id: str, maps: np.ndarray) -> dict[str, Any]:
    """Store a dense cell's predicted test maps beside its evidence; the record's entry.

    Chunked by :data:`MAP_CHUNK_ROWS` images (they are as large as the test targets), through
    the store's one write path by the holder of the cell's evidence lease.

    Parameters
    ----------
    store : FeatureStore
        A writable store.
    lease : Lease
        The held lease of ``keys.evidence_group_key(cell_id)``.
    cell_id : str
        The cell.
    maps : numpy.ndarray
        (n_test, H, W) class maps or (n_test, H, W, 3) normals, in test order.

    Returns
    -------
    dict
        ``key``, ``sha256`` (``evidence_sha256`` of the maps), ``shape`` and ``dtype``.
    """
    values = np.ascontiguousarray(maps)
    if values.ndim < 3 or values.shape[0] == 0:
        raise StoreError(f"predicted maps of cell {cell_id} have shape {values.shape}; nothing to store")
    key = keys.evidence_key(cell_id, "maps")
    sha = evidence_sha256(values)
    attrs = {"fingerprint": stable_hash([cell_id, "maps", sha]), "cell_id": cell_id, "kind": "maps", "sha256": sha}
    rows = min(MAP_CHUNK_ROWS, values.shape[0])
    spec = ArraySpec(key, values.shape, rows, str(values.dtype), attrs)
    store.write_arrays(lease, [spec], lambda todo: ((c, {key: values[c * rows:(c + 1) * rows]})
                                                    for c in sorted(todo[key])))
    return {"key": key, "sha256": sha, "shape": list(values.shape), "dtype": str(values.dtype)}
