"""Evaluation job of a cell whose protocol reads stored features: one protocol setting on
one stored feature array (train and test)."""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from jobs.evaluation.encoder_identity import belongs, owner_of, owners, point_identity
from jobs.evaluation.cell import Cell
from jobs.evaluation.dense_cells import dense_scratch, load_dense_data, remove_dense_scratch
from jobs.evaluation.identity import Arrays, cell_arrays, cell_identity, cell_weights
from storage_schema.backend import store_base
from jobs.evaluation.records import cell_lease, cell_record, write_record
from jobs.run.failures import cell_failure, is_transient, one_line
from pipeline.errors import StaleArrayError, WeightsMismatchError
from pipeline.protocols.blocks import STREAM_BLOCK_ROWS
from pipeline.protocols.registry import EvalData
from storage_schema import FeatureStore
from storage_schema.ledger import Ledger
from storage_schema.provenance import WEIGHTS_FIELD, array_weights, record_weights, weights_disagreement

__all__ = ["DEFAULT_BLOCK_ROWS", "Cell", "CellOutcome", "evaluate_cell", "evaluate_cells", "load_eval_data"]

log = logging.getLogger(__name__)

DEFAULT_BLOCK_ROWS = STREAM_BLOCK_ROWS  # protocols that stream train features read blocks of this many rows


@dataclass
class CellOutcome:
    """What evaluating a cell gave: its id, ``computed`` or ``cached`` (from the ledger), and its record."""

    cell_id: str
    status: str  # "computed" | "cached"
    record: dict[str, Any]


def evaluate_cell(store: FeatureStore, cell: Cell, *, block_rows: int = DEFAULT_BLOCK_ROWS,
                  record: bool = True, ledger: Ledger | None = None) -> CellOutcome:
    """Evaluate ``cell`` unless the ledger holds it; append the result to the ledger."""
    # A recorded evaluation holds the cell's lease (``storage_schema.record_keys.cell_work_key``)
    # while it computes: a second run (or worker) asked for the same cell waits for it, then
    # takes the ledger's answer, so two runs at once compute each cell once.
    arrays = cell_arrays(store, cell)
    weights = cell_weights(cell, arrays)  # arrays of different weights give no cell, no verdict
    cid, settings, fps = cell_identity(store, cell, arrays)
    notes = {feats.key: owners(store, feats.key) for feats, _ in arrays.values()}
    base = store_base(store)
    if not all(belongs(feats, notes[feats.key], cell.identity, cell.encoder_identity, base)
               for feats, _ in arrays.values()):
        # the record and pointer say whose weights and images were read, never this config's
        feats = arrays[cell.test_split][0]
        held = owner_of(feats, notes[feats.key])
        log.warning("%s: the stored features are another config's (an encoder or dataset of the same name: "
                    "identity %s, this config's %s); recorded under theirs", cell.label(), held, cell.identity)
        cell = dataclasses.replace(cell, identity=held)
    ledger = Ledger(store) if ledger is None else ledger
    if ledger.has(cid):
        return _cached(store, ledger, cell, cid, record, weights)
    if not record:
        return _compute(store, ledger, cell, arrays, cid, settings, fps, block_rows, weights, record=False)
    store.check_writable()  # a read-only store answers recorded cells; it must not compute others
    with cell_lease(store, cid, cell.label()):
        if ledger.has(cid):  # the other run recorded it while this one waited
            log.info("cell %s was computed by another run meanwhile: its record is used", cell.label())
            return _cached(store, ledger, cell, cid, record, weights)
        return _compute(store, ledger, cell, arrays, cid, settings, fps, block_rows, weights, record=True)


def _cached(store: FeatureStore, ledger: Ledger, cell: Cell, cid: str, record: bool,
            weights: str | None) -> CellOutcome:
    """The ledger's record of the cell, if its weights are the arrays'; its encoder identity
    now points at it."""
    cached = ledger.get(cid)
    why = weights_disagreement({"features": weights}, record_weights(cached))
    if why is not None:
        raise WeightsMismatchError(f"not answered from the ledger: {why}")
    if record and not store.read_only:
        point_identity(store, cell.identity, cell, cid)
    return CellOutcome(cid, "cached", cached)


def _compute(store: FeatureStore, ledger: Ledger, cell: Cell, arrays: Arrays, cid: str, settings: dict[str, Any],
             fps: dict[str, str], block_rows: int, weights: str | None, *, record: bool) -> CellOutcome:
    protocol = cell.entry
    t0 = time.perf_counter()
    if protocol.dense:  # maps and per-pixel targets; training resumes from the cell's scratch folder
        data = load_dense_data(arrays, cell, protocol, dense_scratch(store, cid) if record else None)
    else:
        data = load_eval_data(arrays, cell, protocol, block_rows=block_rows)
    read_seconds = time.perf_counter() - t0
    result = protocol(data, settings)
    check_unchanged(store, cell, arrays)
    train_feats, test_feats = arrays[cell.train_split][0], arrays[cell.test_split][0]
    enc = train_feats.attrs.get("encoder", {})
    shape = {"dim": int(train_feats.shape[-1]),
             **({"n_tokens": int(train_feats.shape[1])} if len(train_feats.shape) == 3 else {}),
             **({"grid": [int(v) for v in train_feats.shape[1:3]]} if len(train_feats.shape) == 4 else {})}
    rec = cell_record(
        cell, cid, settings, fps, result, n_train=train_feats.shape[0], n_test=test_feats.shape[0], **shape,
        # the fit's math threads: seconds mean little without them (Dask workers default to one)
        timings={"read_s": read_seconds, "fit_s": result.seconds, "threads": _math_threads()},
        provenance={
            "arch": enc.get("arch"), WEIGHTS_FIELD: weights or enc.get(WEIGHTS_FIELD),
            # each array's own, as `repeval verify` checks them against the record
            "feature_weights": {s: array_weights(a[0].attrs) for s, a in arrays.items()},
            "weights": enc.get("weights"), "data_config": enc.get("data_config"),
            "pooling": train_feats.attrs.get("pooling"), "feature_keys": {s: a[0].key for s, a in arrays.items()},
            "store": store.url,
        })
    if not record:
        return CellOutcome(cid, "computed", rec)
    stored = write_record(store, ledger, cell, rec, result, arrays[cell.test_split][1].key)
    if protocol.dense:
        remove_dense_scratch(store, cid)
    if not stored:
        return CellOutcome(cid, "cached", ledger.get(cid))
    return CellOutcome(cid, "computed", rec)


def check_unchanged(store: FeatureStore, cell: Cell, arrays: Arrays) -> None:
    """Refuse to record a cell whose arrays were replaced while it read them (another
    config's encoder of the same name extracted meanwhile, a re-extraction): its rows may
    be of two encoders, and its record would claim the fingerprints it started from."""
    for feats, labels in arrays.values():
        for st in (feats, labels):
            now = store.status(st.key)
            if now is None or now.fingerprint != st.fingerprint or not now.complete:
                raise StaleArrayError(
                    f"{cell.label()}: {st.key} was replaced while the cell read it (fingerprint "
                    f"{st.fingerprint[:12]} -> {now.fingerprint[:12] if now else 'gone'}: another run extracted "
                    "it meanwhile); not recorded, the next run evaluates it again")


def evaluate_cells(store: FeatureStore, cells: list[Cell], *, unavailable: dict[tuple[str, str], str] | None = None,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> list[dict[str, Any]]:
    """Evaluate each cell on its own: a cell that fails is reported and the others go on."""
    # ``unavailable`` maps (model, dataset) to why its features could not be extracted this
    # run: those cells fail with that reason instead of a missing-array error. A transient
    # I/O error is raised (the task is retried; recorded cells are then answered from the
    # ledger). Returns one outcome per cell: its names, ``status`` ("computed", "cached" or
    # "failed"), ``cell_id`` and, when failed, ``error_type`` and one-line ``reason``.
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


def load_eval_data(arrays: Arrays, cell: Cell, protocol: Any, *,
                   block_rows: int = DEFAULT_BLOCK_ROWS) -> Any:
    """The protocol's input for ``cell``: labels and features of every split, read from the store."""
    # Test and validation features are read whole, in their stored dtype. The train
    # features are read whole only for a protocol that does not ``streams_train``; for one
    # that does, ``EvalData.train_blocks`` streams them from Zarr in blocks of whole chunks
    # (about ``block_rows`` rows, no chunk read twice), so memory does not grow with the
    # train split.
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
