"""Units of work of the cells whose protocol reads the encoder's weights, each runnable
without Prefect."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from jobs.config.run import ExtractConfig
from jobs.evaluation.encoder_identity import point_identity
from jobs.evaluation.cell import Cell
from jobs.evaluation.identity import CellIdentity, weights_identity
from jobs.evaluation.records import cell_lease, cell_record, point_to, work_lease, write_record
from jobs.evaluation.scratch import remove_scratch, scratch_folder
from jobs.extraction.loaded_weights import file_signature, weights_file
from jobs.run.plan import make_adapter
from pipeline.errors import DataValidationError, WeightsChangedError
from pipeline.protocols.cell import ImageData
from storage_schema import record_keys
from storage_schema.ledger import Ledger

__all__ = ["DONE", "grid_finish", "grid_point", "weights_cell"]

DONE = "done"  # a grid point trained and scored (not a cell status)
_ONE_RUN = threading.Lock()


def _outcome(cell: Cell, cid: str, status: str) -> dict[str, Any]:
    return {"label": cell.label(), "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
            "setting": cell.setting, "protocol": cell.protocol, "cell_id": cid, "status": status}


def _cached(store: Any, cell: Cell, ident: CellIdentity, ledger: Ledger) -> dict[str, Any] | None:
    """The cached outcome when the ledger holds the cell (its name now points at it)."""
    if not ledger.has(ident.cell_id):
        return None
    if not store.read_only:
        point_to(store, cell, ident.cell_id)
        point_identity(store, cell.identity, cell, ident.cell_id)
    return _outcome(cell, ident.cell_id, "cached")


def _image_data(store: Any, cell: Cell, adapter: Any, ident: CellIdentity, extract: ExtractConfig) -> ImageData:
    d = cell.dataset_config
    return ImageData(cell.encoder.spec(), adapter, d.train_split, d.test_split, d.val_split, extract.device,
                     scratch_folder(store, extract, cell.protocol, ident.cell_id))


def grid_point(store: Any, cell: Cell, index: int, extract: ExtractConfig) -> dict[str, Any]:
    """Train and score grid point ``index`` of a cell, resuming a saved state."""
    adapter = make_adapter(cell.dataset_config)
    ident = weights_identity(cell, adapter)
    cached = _cached(store, cell, ident, Ledger(store))
    if cached is not None:
        return {**cached, "index": index}
    store.check_writable()
    # two runs at once train a point once: the second waits, then resumes the first's final state
    with work_lease(store, record_keys.grid_point_work_key(ident.cell_id, index),
                    f"grid point {index} of {cell.label()} is training in another run: waiting for it"):
        cached = _cached(store, cell, ident, Ledger(store))
        if cached is not None:
            return {**cached, "index": index}
        data = _image_data(store, cell, adapter, ident, extract)
        with _ONE_RUN:
            result = cell.entry.grid.run_point(data, ident.settings, index)
    return {"status": DONE, "cell_id": ident.cell_id, "index": index, "result": result}


def grid_finish(store: Any, cell: Cell, points: Sequence[Mapping[str, Any]], extract: ExtractConfig) -> dict[str, Any]:
    """Select the best grid point, refit it, test it, record the cell."""
    adapter = make_adapter(cell.dataset_config)
    ident = weights_identity(cell, adapter)
    cached = _cached(store, cell, ident, Ledger(store))
    if cached is not None:
        return cached
    store.check_writable()
    failed = [p for p in points if p.get("status") == "failed"]
    if failed:
        raise DataValidationError(f"{len(failed)} of {len(points)} grid points failed, e.g. point "
                                  f"{failed[0].get('index')}: {failed[0].get('reason')}")
    done = {int(p["index"]): p["result"] for p in points if p.get("status") == DONE and p["cell_id"] == ident.cell_id}
    return _record_once(store, cell, adapter, ident, extract,
                        lambda data: cell.entry.grid.finish(data, ident.settings, done))


def weights_cell(store: Any, cell: Cell, extract: ExtractConfig) -> dict[str, Any]:
    """Run a cell whose protocol reads the encoder's weights in one unit (a diagnostic), and
    record it with its example pictures."""
    adapter = make_adapter(cell.dataset_config)
    ident = weights_identity(cell, adapter)
    cached = _cached(store, cell, ident, Ledger(store))
    if cached is not None:
        return cached
    store.check_writable()
    return _record_once(store, cell, adapter, ident, extract, lambda data: cell.entry(data, ident.settings))


def _record_once(store: Any, cell: Cell, adapter: Any, ident: Any, extract: ExtractConfig,
                 compute: Any) -> dict[str, Any]:
    """``compute(data)`` and its record, under the cell's lease: of two runs at once, the
    second waits and takes the first's record."""
    with cell_lease(store, ident.cell_id, cell.label()):
        cached = _cached(store, cell, ident, Ledger(store))
        if cached is not None:
            return cached
        data = _image_data(store, cell, adapter, ident, extract)
        with _ONE_RUN:
            result = compute(data)
        return _record(store, cell, ident, result, extract)


def _record(store: Any, cell: Cell, ident: CellIdentity, result: Any, extract: ExtractConfig) -> dict[str, Any]:
    """Write the record of a weights cell (of the same shape as a feature cell's, plus the
    device it ran on), then delete its scratch state. A checkpoint rewritten while the cell
    ran (its protocol loads the file again) gives no record: its weights are not the ones
    the cell id and provenance name."""
    now = file_signature(weights_file(cell.encoder.spec()))
    if ident.weights_signature is not None and now != ident.weights_signature:
        raise WeightsChangedError(f"checkpoint {cell.encoder.weights} was rewritten while {cell.label()} ran: "
                                  "no record is made from mixed weights; the next run or scan takes it")
    gpu = dict(result.device_use or {})
    record = cell_record(cell, ident.cell_id, ident.settings, ident.fingerprints, result, n_train=result.n_train or 0,
                         n_test=result.n_test or 0, gpu=gpu,
                         timings={"read_s": 0.0, "fit_s": gpu.get("train_seconds", gpu.get("seconds"))},
                         provenance={**ident.provenance, "encoder_protocol": True, "store": store.url})
    added = write_record(store, Ledger(store), cell, record, result)
    remove_scratch(store, extract, cell.protocol, ident.cell_id)
    return _outcome(cell, ident.cell_id, "computed" if added else "cached")
