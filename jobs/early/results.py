"""A readout fitted on the early rows: of a new encoder (its early arrays), or of an encoder
already extracted (its stored features at the same rows), which is what calibrates an
estimate and what an early verdict is paired with."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from jobs.early.rows import read_early
from jobs.early.subsets import Subset
from jobs.evaluation.cell import Cell
from pipeline.errors import DataValidationError, WeightsMismatchError
from pipeline.plain import to_plain
from pipeline.protocols.fit_warnings import UNRELIABLE, WARNING_CODES
from pipeline.protocols.registry import EvalData
from storage_schema import FeatureStore
from storage_schema.early import EarlyRecords, early_id
from storage_schema.ledger import config_hash
from storage_schema.provenance import WEIGHTS_FIELD, array_weights

__all__ = ["SOURCES", "early_result", "early_score"]

log = logging.getLogger(__name__)

#: Where an early fit reads its features: the early arrays (a new encoder) or the stored
#: full arrays at the same rows (an encoder already extracted).
SOURCES = ("early", "store")


def early_score(predictions: np.ndarray, labels: np.ndarray, weights: np.ndarray | None,
                mean_per_class: bool) -> float:
    """Top-1 (or mean per-class) accuracy of predictions, each row weighed by ``weights``."""
    correct = (np.asarray(predictions) == np.asarray(labels)).astype(np.float64)
    w = np.ones_like(correct) if weights is None else np.asarray(weights, dtype=np.float64)
    if not mean_per_class:
        return float(np.sum(w * correct) / np.sum(w))
    classes = np.unique(labels)
    return float(np.mean([np.sum((w * correct)[labels == c]) / np.sum(w[labels == c]) for c in classes]))


def _arrays(store: FeatureStore, cell: Cell, subset: Subset, source: str):
    """Split -> (features StoredArray, labels StoredArray) of the cell, from the early or
    the full arrays; their fingerprints by name."""
    out, fps = {}, {}
    for split in cell.splits():
        if split not in subset.rows:
            raise DataValidationError(f"the early subset of {cell.dataset} has no rows of split {split!r}")
        labels = store.labels(cell.dataset, split)
        if labels.fingerprint != subset.labels[split]:
            raise DataValidationError(f"the labels of {cell.dataset}/{split} changed since its early subset was "
                                      "chosen; a new subset is chosen on the next run")
        feats = read_early(store, cell.model, subset, split, cell.layer) if source == "early" else \
            store.features(cell.model, cell.dataset, split, cell.layer)
        out[split] = (feats, labels)
        fps[f"{split}.features"], fps[f"{split}.labels"] = feats.fingerprint, labels.fingerprint
    return out, fps


def _weights_of(arrays) -> str | None:
    seen = {array_weights(feats.attrs) for feats, _ in arrays.values()} - {None}
    if len(seen) > 1:
        raise WeightsMismatchError("the early features of one cell come from different weights (a checkpoint "
                                   "rewritten between the splits' extractions); not evaluated")
    return next(iter(seen), None)


def _read(feats, rows: np.ndarray, source: str) -> np.ndarray:
    return feats.read() if source == "early" else feats.read_rows(rows)


def early_result(store: FeatureStore, cell: Cell, subset: Subset, source: str, *,
                 record: bool = True) -> dict[str, Any]:
    """The early fit of ``cell`` on ``subset``'s rows (recorded once, then found again)."""
    if source not in SOURCES:
        raise ValueError(f"source {source!r} is not one of {', '.join(SOURCES)}")
    entry = cell.entry
    settings = entry.resolve(cell.settings)
    arrays, fps = _arrays(store, cell, subset, source)
    weights_fp = _weights_of(arrays)
    rid = early_id("result", subset.id, source, fps, cell.protocol, config_hash(entry.result_settings(settings)),
                   str(entry.version))
    records = EarlyRecords(store)
    found = records.get("results", rid)
    if found is not None:
        return found
    started = time.perf_counter()
    test = cell.test_split
    test_rows = subset.rows[test]
    y = {split: labels.read() for split, (_, labels) in arrays.items()}
    labels_attrs = arrays[test][1].attrs
    n_classes = max(len(labels_attrs.get("class_names") or []), int(max(v.max(initial=-1) for v in y.values())) + 1)
    mean_per_class = bool(labels_attrs.get("mean_per_class", False))
    train, val = cell.train_split, cell.val_split
    whole_test = source == "store"  # the fit scored on every test row too, where it returns predictions

    def fit(test_x: np.ndarray, test_y: np.ndarray):
        data = EvalData(
            y_train=y[train][subset.rows[train]], X_train=_read(arrays[train][0], subset.rows[train], source),
            X_test=test_x, y_test=test_y, n_classes=n_classes,
            X_val=_read(arrays[val][0], subset.rows[val], source) if val else None,
            y_val=y[val][subset.rows[val]] if val else None, mean_per_class=mean_per_class)
        return entry(data, settings)

    full_split = None
    if whole_test:
        result = fit(arrays[test][0].read(), y[test])
        if result.evidence is not None and result.evidence.kind == "predictions":
            predictions_all = np.asarray(result.evidence.values)
            full_split = float(early_score(predictions_all, y[test], None, mean_per_class))
            predictions = predictions_all[test_rows]
        else:  # scored some other way (episodes, fits): scored on the early rows alone, as a new encoder's is
            result = fit(_read(arrays[test][0], test_rows, source), y[test][test_rows])
            predictions = None
    else:
        result = fit(_read(arrays[test][0], test_rows, source), y[test][test_rows])
        predictions = np.asarray(result.evidence.values) if (result.evidence is not None and
                                                             result.evidence.kind == "predictions") else None
    metric = entry.primary_metric
    if predictions is not None:
        score = early_score(predictions, y[test][test_rows], subset.weights, mean_per_class)
    else:
        score = result.metrics.get(metric)  # the entry's headline, the one name every reader uses
    warnings = list(result.warnings or [])
    rec = to_plain({
        "id": rid, "subset": subset.id, "source": source, "model": cell.model, "dataset": cell.dataset,
        "layer": cell.layer, "setting": cell.setting, "protocol": cell.protocol, "protocol_version": entry.version,
        "config_hash": config_hash(entry.result_settings(settings)), "metric": "mean_per_class" if (
            predictions is not None and mean_per_class) else ("top1" if predictions is not None else metric),
        "score": None if score is None else float(score), "full_split_score": full_split,
        "predictions": None if predictions is None else np.asarray(predictions).astype(np.int64).tolist(),
        "evidence_kind": None if result.evidence is None else result.evidence.kind,
        "warnings": warnings,
        "unreliable": [f"{w['code']}: {w['message']}" for w in warnings
                       if WARNING_CODES.get(w.get("code"), ("",))[0] == UNRELIABLE],
        "fingerprints": fps, WEIGHTS_FIELD: weights_fp,
        "n_train": int(len(subset.rows[train])), "n_test": int(len(test_rows)),
        "seconds": time.perf_counter() - started,
    })
    if record and not store.read_only:
        records.put("results", rec)
    return rec
