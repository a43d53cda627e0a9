"""Evaluation job: one protocol setting on one stored feature array (train and test).

Runs without Prefect. The cell's id is computed from fingerprints alone, so a cell that
the ledger already holds is answered without reading a single feature.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import STREAM_BLOCK_ROWS
from pipeline.protocols.registry import EvalData, Protocol, get_protocol, resolve_settings
from storage_schema import FeatureStore, StoredArray
from storage_schema.ledger import Ledger, cell_id, config_hash
from storage_schema.provenance import now_iso

log = logging.getLogger(__name__)

DEFAULT_BLOCK_ROWS = STREAM_BLOCK_ROWS  # protocols that stream train features read blocks of this many rows


@dataclass(frozen=True)
class Cell:
    """What to evaluate: a (model, dataset, layer) feature array under one protocol setting."""

    model: str
    dataset: str
    layer: str
    setting: str  # the config's name for this protocol setting, e.g. "knn20"
    protocol: str  # registry name, e.g. "knn"
    settings: dict[str, Any] = field(default_factory=dict)
    train_split: str = "train"
    test_split: str = "test"
    val_split: str | None = None

    def splits(self) -> list[str]:
        return [s for s in (self.train_split, self.val_split, self.test_split) if s]

    def label(self) -> str:
        return f"{self.model}/{self.dataset}/{self.layer}:{self.setting}"


@dataclass
class CellOutcome:
    cell_id: str
    status: str  # "computed" | "cached"
    record: dict[str, Any]


def _arrays(store: FeatureStore, cell: Cell) -> dict[str, tuple[StoredArray, StoredArray]]:
    out = {}
    for split in cell.splits():
        feats = store.features(cell.model, cell.dataset, split, cell.layer)
        labels = store.open_array(feats.attrs["labels"])
        if labels.shape[0] != feats.shape[0]:
            raise DataValidationError(
                f"{feats.key} has {feats.shape[0]} rows but its labels {labels.key} have {labels.shape[0]}"
            )
        out[split] = (feats, labels)
    return out


def cell_identity(store: FeatureStore, cell: Cell) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(cell id, full settings, fingerprints) of ``cell`` from the store's metadata alone."""
    settings = resolve_settings(cell.protocol, cell.settings)
    arrays = _arrays(store, cell)
    fps = {}
    for split, (feats, labels) in arrays.items():
        fps[f"{split}.features"] = feats.fingerprint
        fps[f"{split}.labels"] = labels.fingerprint
    cid = cell_id(fps, cell.protocol, settings, get_protocol(cell.protocol).version)
    return cid, settings, fps


def evaluate_cell(store: FeatureStore, cell: Cell, *, block_rows: int = DEFAULT_BLOCK_ROWS,
                  record: bool = True) -> CellOutcome:
    """Evaluate ``cell`` unless the ledger holds it; append the result to the ledger."""
    protocol = get_protocol(cell.protocol)
    cid, settings, fps = cell_identity(store, cell)
    ledger = Ledger(store)
    if ledger.has(cid):
        return CellOutcome(cid, "cached", ledger.get(cid))
    if record:
        store.check_writable()  # a read-only store answers recorded cells; it must not compute others
    arrays = _arrays(store, cell)
    train_feats, test_feats = arrays[cell.train_split][0], arrays[cell.test_split][0]
    t0 = time.perf_counter()
    data = load_eval_data(arrays, cell, protocol, block_rows=block_rows)
    read_seconds = time.perf_counter() - t0
    result = protocol(data, settings)
    enc = train_feats.attrs.get("encoder", {})
    rec = {
        "cell_id": cid, "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
        "setting": cell.setting, "protocol": cell.protocol, "protocol_version": protocol.version,
        "settings": settings, "config_hash": config_hash(settings), "splits": cell.splits(),
        "fingerprints": fps, "metrics": _plain(result.metrics), "diagnostics": _plain(result.diagnostics),
        "warnings": result.warnings, "converged": bool(result.diagnostics.get("converged", True)),
        "n_train": int(train_feats.shape[0]), "n_test": int(test_feats.shape[0]), "dim": int(train_feats.shape[1]),
        "timings": {"read_s": read_seconds, "fit_s": result.seconds},
        "provenance": {
            "arch": enc.get("arch"), "weights_fingerprint": enc.get("weights_fingerprint"),
            "weights": enc.get("weights"), "data_config": enc.get("data_config"),
            "pooling": train_feats.attrs.get("pooling"), "feature_keys": {s: a[0].key for s, a in arrays.items()},
            "store": store.url,
        },
        "recorded": now_iso(),
    }
    if record and not ledger.put(rec):
        log.info("cell %s was recorded by another process meanwhile", cid)
        return CellOutcome(cid, "cached", ledger.get(cid))
    return CellOutcome(cid, "computed", rec)


def load_eval_data(arrays: dict[str, tuple[StoredArray, StoredArray]], cell: Cell, protocol: Protocol, *,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> EvalData:
    """The protocol's input for ``cell``: labels and features of every split, read from the store.

    Test and validation features are read whole, in their stored dtype. The train
    features are read whole only for a protocol that does not ``streams_train``; for one
    that does, ``EvalData.train_blocks`` streams them from Zarr in blocks of whole chunks
    (about ``block_rows`` rows, no chunk read twice), so memory does not grow with the
    train split.

    Parameters
    ----------
    arrays : dict
        Split -> (features, labels) stored arrays of the cell.
    cell : Cell
    protocol : Protocol
        The protocol that will run (its ``streams_train`` flag decides).
    block_rows : int
        Rows per streamed block (rounded to whole chunks).

    Returns
    -------
    EvalData
    """
    train_feats, train_labels = arrays[cell.train_split]
    test_feats, test_labels = arrays[cell.test_split]
    class_names = train_labels.attrs.get("class_names") or []
    y_train = train_labels.read()
    if y_train.ndim == 2:  # multi-label: one 0/1 column per class
        n_classes = int(y_train.shape[1])
    else:
        n_classes = max(len(class_names), int(y_train.max(initial=-1)) + 1)
    chunk_rows = train_feats.status.chunk_rows
    train_dask = train_feats.to_dask(rows_per_block=max(1, block_rows // chunk_rows) * chunk_rows)

    def train_blocks():
        # One block in memory at a time (synchronous: this already runs inside a Dask
        # task, and nesting schedulers would oversubscribe the worker).
        offsets = np.cumsum((0,) + train_dask.chunks[0][:-1])
        for i, offset in enumerate(offsets):
            yield train_dask.blocks[i].compute(scheduler="synchronous"), int(offset)

    val = arrays.get(cell.val_split) if cell.val_split else None
    return EvalData(
        y_train=y_train, X_test=test_feats.read(), y_test=test_labels.read(), n_classes=n_classes,
        X_train=None if protocol.streams_train else train_feats.read(), train_blocks=train_blocks,
        X_val=val[0].read() if val else None, y_val=val[1].read() if val else None,
        mean_per_class=bool(train_labels.attrs.get("mean_per_class", False)),
    )


def _plain(value: Any) -> Any:
    """JSON-able copy: numpy scalars and arrays to Python numbers and lists."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        return _plain(asdict(value))
    return value
