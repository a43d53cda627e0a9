"""Evaluation job: one protocol setting on one stored feature array (train and test).

Runs without Prefect. The cell's id is computed from fingerprints alone, so a cell that
the ledger already holds is answered without reading a single feature. The protocol
registry (numerical libraries) is imported only when a cell is identified or evaluated.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import STREAM_BLOCK_ROWS
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
        """The splits the cell reads: train, validation (when there is one), test."""
        return [s for s in (self.train_split, self.val_split, self.test_split) if s]

    def label(self) -> str:
        """``model/dataset/layer:setting``, as failures and progress lines name a cell."""
        return f"{self.model}/{self.dataset}/{self.layer}:{self.setting}"


@dataclass
class CellOutcome:
    """What evaluating a cell gave: its id, ``computed`` or ``cached`` (from the ledger), and its record."""

    cell_id: str
    status: str  # "computed" | "cached"
    record: dict[str, Any]


Arrays = dict[str, tuple[StoredArray, StoredArray]]  # split -> (features, labels)


def cell_arrays(store: FeatureStore, cell: Cell) -> Arrays:
    """The feature and label arrays of every split of ``cell``, metadata read once."""
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


def cell_identity(store: FeatureStore, cell: Cell,
                  arrays: Arrays | None = None) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(cell id, full settings, fingerprints) of ``cell`` from the store's metadata alone."""
    from pipeline.protocols.registry import get_protocol, resolve_settings

    settings = resolve_settings(cell.protocol, cell.settings)
    arrays = cell_arrays(store, cell) if arrays is None else arrays
    fps = {}
    for split, (feats, labels) in arrays.items():
        fps[f"{split}.features"] = feats.fingerprint
        fps[f"{split}.labels"] = labels.fingerprint
    cid = cell_id(fps, cell.protocol, settings, get_protocol(cell.protocol).version)
    return cid, settings, fps


def identify_cells(store: FeatureStore, cells: list[Cell]) -> list[str | None]:
    """The cell id of each cell from metadata alone (None where its features are not all
    extracted), each array's metadata read once however many cells share it."""
    from pipeline.protocols.registry import get_protocol, resolve_settings
    from storage_schema import feature_key

    statuses: dict[str, Any] = {}
    resolved: dict[str, tuple[dict[str, Any], int | str]] = {}

    def status(key: str):
        if key not in statuses:
            statuses[key] = store.status(key)
        return statuses[key]

    out: list[str | None] = []
    for cell in cells:
        fps: dict[str, str] | None = {}
        for split in cell.splits():
            feats = status(feature_key(cell.model, cell.dataset, split, cell.layer))
            labels = status(feats.attrs["labels"]) if feats is not None and feats.complete else None
            if labels is None or not labels.complete:
                fps = None
                break
            fps[f"{split}.features"], fps[f"{split}.labels"] = feats.fingerprint, labels.fingerprint
        if fps is None:
            out.append(None)
            continue
        key = f"{cell.protocol}|{sorted(cell.settings.items())!r}"
        if key not in resolved:
            resolved[key] = (resolve_settings(cell.protocol, cell.settings), get_protocol(cell.protocol).version)
        settings, version = resolved[key]
        out.append(cell_id(fps, cell.protocol, settings, version))
    return out


def evaluate_cell(store: FeatureStore, cell: Cell, *, block_rows: int = DEFAULT_BLOCK_ROWS,
                  record: bool = True, ledger: Ledger | None = None) -> CellOutcome:
    """Evaluate ``cell`` unless the ledger holds it; append the result to the ledger."""
    from pipeline.protocols.registry import get_protocol

    protocol = get_protocol(cell.protocol)
    arrays = cell_arrays(store, cell)
    cid, settings, fps = cell_identity(store, cell, arrays)
    ledger = Ledger(store) if ledger is None else ledger
    if ledger.has(cid):
        return CellOutcome(cid, "cached", ledger.get(cid))
    if record:
        store.check_writable()  # a read-only store answers recorded cells; it must not compute others
    t0 = time.perf_counter()
    if protocol.dense:  # maps and per-pixel targets; training resumes from the cell's scratch folder
        from jobs.evaluation.dense_cells import dense_scratch, load_dense_data

        data = load_dense_data(arrays, cell, protocol, dense_scratch(store, cid) if record else None)
    else:
        data = load_eval_data(arrays, cell, protocol, block_rows=block_rows)
    read_seconds = time.perf_counter() - t0
    result = protocol(data, settings)
    train_feats, test_feats = arrays[cell.train_split][0], arrays[cell.test_split][0]
    enc = train_feats.attrs.get("encoder", {})
    rec = {
        "cell_id": cid, "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
        "setting": cell.setting, "protocol": cell.protocol, "protocol_version": protocol.version,
        "settings": settings, "config_hash": config_hash(settings), "splits": cell.splits(),
        "fingerprints": fps, "metrics": json_ready(result.metrics), "diagnostics": json_ready(result.diagnostics),
        "warnings": result.warnings, "converged": bool(result.diagnostics.get("converged", True)),
        "n_train": int(train_feats.shape[0]), "n_test": int(test_feats.shape[0]), "dim": int(train_feats.shape[-1]),
        **({"n_tokens": int(train_feats.shape[1])} if len(train_feats.shape) == 3 else {}),
        **({"grid": [int(v) for v in train_feats.shape[1:3]]} if len(train_feats.shape) == 4 else {}),
        # the fit's math threads: seconds mean little without them (Dask workers default to one)
        "timings": {"read_s": read_seconds, "fit_s": result.seconds, "threads": _math_threads()},
        "provenance": {
            "arch": enc.get("arch"), "weights_fingerprint": enc.get("weights_fingerprint"),
            "weights": enc.get("weights"), "data_config": enc.get("data_config"),
            "pooling": train_feats.attrs.get("pooling"), "feature_keys": {s: a[0].key for s, a in arrays.items()},
            "store": store.url,
        },
        "recorded": now_iso(),
    }
    if not record:
        return CellOutcome(cid, "computed", rec)
    if result.evidence is None:
        stored = ledger.put(rec)
    else:
        stored = _put_with_evidence(store, ledger, rec, result.evidence, arrays[cell.test_split][1].key, result.maps)
    if protocol.dense:
        from jobs.evaluation.dense_cells import remove_dense_scratch

        remove_dense_scratch(store, cid)
    if not stored:
        log.info("cell %s was recorded by another process meanwhile", cid)
        return CellOutcome(cid, "cached", ledger.get(cid))
    return CellOutcome(cid, "computed", rec)


def _put_with_evidence(store: FeatureStore, ledger: Ledger, rec: dict[str, Any], evidence: Any,
                       labels_key: str, maps: Any = None) -> bool:
    """Store the cell's evidence (and a dense cell's predicted test maps), then its record (a
    record never names evidence that is not there), both under the cell's evidence lease: a
    second process evaluating the same cell finds the record once it gets the lease and
    leaves the evidence alone. ``labels_key``: the test labels the evidence pairs on (a
    comparison reads them back)."""
    from storage_schema.evidence import write_evidence, write_predicted_maps
    from storage_schema.keys import evidence_group_key

    cid = rec["cell_id"]
    with store.lease(evidence_group_key(cid)) as lease:
        if ledger.has(cid):
            return False
        rec["evidence"] = {**write_evidence(store, lease, cid, evidence), "labels": labels_key}
        if maps is not None:
            rec["predicted_maps"] = write_predicted_maps(store, lease, cid, maps)
        return ledger.put(rec)


def evaluate_cells(store: FeatureStore, cells: list[Cell], *, unavailable: dict[tuple[str, str], str] | None = None,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> list[dict[str, Any]]:
    """Evaluate each cell on its own: a cell that fails is reported and the others go on.

    ``unavailable`` maps (model, dataset) to why its features could not be extracted this
    run: those cells fail with that reason instead of a missing-array error. A transient
    I/O error is raised (the task is retried; recorded cells are then answered from the
    ledger). Returns one outcome per cell: its names, ``status`` ("computed", "cached" or
    "failed"), ``cell_id`` and, when failed, ``error_type`` and one-line ``reason``.
    """
    from jobs.failures import cell_failure, is_transient, one_line

    unavailable = unavailable or {}
    ledger = Ledger(store)
    outcomes = []
    for cell in cells:
        names = {"label": cell.label(), "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
                 "setting": cell.setting, "protocol": cell.protocol}
        why = unavailable.get((cell.model, cell.dataset))
        if why is not None:
            outcomes.append(cell_failure(cell, f"not evaluated: {why}", "ExtractionFailed"))
            continue
        try:
            outcome = evaluate_cell(store, cell, block_rows=block_rows, ledger=ledger)
        except Exception as exc:  # noqa: BLE001  one cell's failure must not stop the others
            if is_transient(exc):
                raise
            outcomes.append(cell_failure(cell, one_line(exc), type(exc).__name__))
            continue
        outcomes.append({**names, "cell_id": outcome.cell_id, "status": outcome.status})
    return outcomes


def load_eval_data(arrays: dict[str, tuple[StoredArray, StoredArray]], cell: Cell, protocol: Any, *,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> Any:
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
    from pipeline.protocols.registry import EvalData

    train_feats, train_labels = arrays[cell.train_split]
    test_feats, test_labels = arrays[cell.test_split]
    class_names = train_labels.attrs.get("class_names") or []
    y_train = train_labels.read()
    if y_train.ndim == 2:  # multi-label: one column per class (1, 0, or -1 for difficult)
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


def _math_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def json_ready(value: Any) -> Any:
    """JSON-able copy: numpy scalars and arrays to Python numbers and lists."""
    if isinstance(value, dict):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_ready(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        return json_ready(asdict(value))
    return value
