"""A cell's evidence in the store: written before its ledger record, read back checked."""

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
    """Store one cell's evidence; return the record's ``evidence`` entry."""
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
    """Read the evidence a record names, refusing it when it is not what the record was made from."""
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
    """Every evidence array of the store, in key order."""
    b = store.backend
    for shard in sorted(b.list(keys.evidence_prefix(), dirs_only=True)):
        for cid in sorted(b.list(keys.evidence_prefix(shard), dirs_only=True)):
            for name in sorted(b.list(keys.evidence_prefix(shard, cid), dirs_only=True)):
                key = keys.evidence_prefix(shard, cid, name)
                if b.exists(keys.node_metadata_key(key)):
                    yield key


@dataclass(frozen=True)
class EvidenceProblem:
    """Something wrong with one record's evidence."""

    key: str
    cell_id: str
    problem: str
    detail: str

    def line(self) -> str:
        """One line for the terminal."""
        return f"{self.problem:10s} {self.key} (cell {self.cell_id}): {self.detail}"


def verify_evidence(store, records: Iterable[Mapping[str, Any]]) -> tuple[int, list[EvidenceProblem]]:
    """Check every record's evidence: present, complete, chunks intact, SHA-256 as recorded."""
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
    """Store a dense cell's predicted test maps beside its evidence; the record's entry."""
    # Chunked by :data:`MAP_CHUNK_ROWS` images (they are as large as the test targets), through
    # the store's one write path by the holder of the cell's evidence lease.
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
