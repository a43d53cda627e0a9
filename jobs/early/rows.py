"""The early feature arrays, and the early rows a full extraction copies."""

from __future__ import annotations

import logging

import numpy as np

from jobs.early.subsets import Subset, rows_sha256
from jobs.extraction.forward import KnownRows
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords, early_id
from storage_schema.keys import EARLY, early_feature_key
from pipeline.errors import RepevalError
from pipeline.names import validate_name

__all__ = ["early_fingerprint", "known_rows", "read_early", "rows_of"]

log = logging.getLogger(__name__)


def early_fingerprint(source_fingerprint: str, subset: Subset, split: str) -> str:
    """The fingerprint of an early array: its full array's and its rows'."""
    return early_id("early-features", source_fingerprint, subset.id, split, rows_sha256(subset.rows[split]))


def read_early(store: FeatureStore, model: str, subset: Subset, split: str, layer: str,
               source_fingerprint: str | None = None):
    """The complete early array of one layer (``StoredArray``)."""
    arr = store.open_array(early_feature_key(model, subset.dataset, subset.id, split, layer))
    if arr.attrs.get("rows_sha256") != rows_sha256(subset.rows[split]):
        raise ValueError(f"{arr.key} does not hold the rows of subset {subset.id[:12]}")
    if source_fingerprint is not None and arr.attrs.get("source_fingerprint") != source_fingerprint:
        raise ValueError(f"{arr.key} holds features of other weights or data than the full array's")
    return arr


def known_rows(store: FeatureStore, model: str, dataset: str, split: str,
               fingerprints: dict[str, str]) -> KnownRows | None:
    """The early rows of ``split`` a full extraction of these layers can copy: from a subset
    whose early array of every layer is complete and of the same full fingerprint."""
    folder = "/".join((EARLY, validate_name(model, "model name"), validate_name(dataset, "dataset name")))
    records = EarlyRecords(store)
    for sid in store.backend.list(folder, dirs_only=True):
        rec = records.get("subsets", sid, dataset)
        if rec is None or split not in rec.get("rows", {}):
            continue
        subset = Subset.from_record(rec)
        try:
            arrays = {layer: read_early(store, model, subset, split, layer, fp) for layer, fp in fingerprints.items()}
        except (RepevalError, ValueError, OSError) as exc:  # not this subset's (or not complete)
            log.debug("early rows of %s/%s/%s in subset %s not usable: %s", model, dataset, split, sid[:12], exc)
            continue
        return KnownRows(subset.rows[split], {layer: arr.read() for layer, arr in arrays.items()}, subset.id)
    return None


def rows_of(store: FeatureStore, model: str, subset: Subset, split: str, layer: str) -> np.ndarray:
    """The early features of one layer (rows in the subset's order)."""
    return read_early(store, model, subset, split, layer).read()
