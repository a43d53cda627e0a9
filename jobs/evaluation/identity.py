"""A cell's identity: the ledger key of its record, found from what the cell reads."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from jobs.config.protocols import settings_hash
from storage_schema.backend import store_base
from jobs.evaluation.encoder_identity import belongs, owners, pointed_record, record_identity
from jobs.evaluation.cell import Cell
from pipeline.errors import DataValidationError, WeightsMismatchError
from pipeline.plain import to_plain
from pipeline.protocols.settings import setting_at
from storage_schema import FeatureStore, StoredArray, feature_key, record_keys
from storage_schema.ledger import Ledger, cell_id, encoder_fingerprints
from storage_schema.provenance import array_weights, stable_hash, weights_disagreement

__all__ = ["Arrays", "CellIdentity", "cell_arrays", "cell_identity", "cell_weights", "identify_cells",
           "recorded_cells", "weights_identity"]

Arrays = dict[str, tuple[StoredArray, StoredArray]]  # split -> (features, labels)


# -- cells that read stored features ------------------------------------------------------
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


def cell_weights(cell: Cell, arrays: Arrays) -> str | None:
    """The one weights fingerprint every feature array of ``cell`` came from (None: unknown,
    e.g. imported features)."""
    named = {f"{split} features {feats.key}": array_weights(feats.attrs) for split, (feats, _) in arrays.items()}
    why = weights_disagreement(named)
    if why is not None:
        raise WeightsMismatchError(f"not computed: {why}; the next run re-extracts the features of other weights "
                                   "once the checkpoint stays unchanged")
    return next((fp for fp in named.values() if fp), None)


def cell_identity(store: FeatureStore, cell: Cell,
                  arrays: Arrays | None = None) -> tuple[str, dict[str, Any], dict[str, str]]:
    """(cell id, full settings, fingerprints) of ``cell`` from the store's metadata alone."""
    entry = cell.entry
    settings = entry.resolve(cell.settings)
    arrays = cell_arrays(store, cell) if arrays is None else arrays
    fps = {}
    for split, (feats, labels) in arrays.items():
        fps[f"{split}.features"] = feats.fingerprint
        fps[f"{split}.labels"] = labels.fingerprint
    cid = cell_id(fps, cell.protocol, entry.result_settings(settings), entry.version)
    return cid, settings, fps


def identify_cells(store: FeatureStore, cells: list[Cell]) -> list[str | None]:
    """The cell id of each feature cell from metadata alone (None where its features are
    not all extracted), each array's metadata read once however many cells share it."""
    return [cid for cid, _ in _identify(store, cells)]


def _identify(store: FeatureStore, cells: list[Cell]) -> list[tuple[str | None, bool]]:
    """(cell id, whether its arrays hold what its identity extracts) of each feature cell
    (``jobs.evaluation.encoder_identity.belongs``)."""
    statuses: dict[str, Any] = {}
    resolved: dict[str, tuple[dict[str, Any], int | str]] = {}

    def status(key: str):
        if key not in statuses:
            statuses[key] = store.status(key)
        return statuses[key]

    notes: dict[str, dict[str, str]] = {}

    def owned(cell: Cell, feats) -> bool:
        if cell.identity is None:
            return True
        if feats.key not in notes:
            notes[feats.key] = owners(store, feats.key)
        return belongs(feats, notes[feats.key], cell.identity, cell.encoder_identity, store_base(store))

    out: list[tuple[str | None, bool]] = []
    for cell in cells:
        fps: dict[str, str] | None = {}
        weights: dict[str, str | None] = {}
        own = True
        for split in cell.splits():
            feats = status(feature_key(cell.model, cell.dataset, split, cell.layer))
            labels = status(feats.attrs["labels"]) if feats is not None and feats.complete else None
            if labels is None or not labels.complete:
                fps = None
                break
            own = own and owned(cell, feats)
            fps[f"{split}.features"], fps[f"{split}.labels"] = feats.fingerprint, labels.fingerprint
            weights[split] = array_weights(feats.attrs)
        if fps is None or weights_disagreement(weights) is not None:  # mixed weights: never a recorded cell
            out.append((None, True))
            continue
        key = f"{cell.protocol}|{sorted(cell.settings.items())!r}"
        if key not in resolved:
            entry = cell.entry
            resolved[key] = (entry.result_settings(entry.resolve(cell.settings)), entry.version)
        settings, version = resolved[key]
        out.append((cell_id(fps, cell.protocol, settings, version), own))
    return out


# -- cells that read the encoder's weights ------------------------------------------------
@dataclass(frozen=True)
class CellIdentity:
    """What a weights cell's record is keyed by, and the encoder facts its record keeps."""

    cell_id: str
    settings: dict[str, Any]  # every setting
    result_settings: dict[str, Any]  # those that decide the result (hashed into the id)
    fingerprints: dict[str, str]
    provenance: dict[str, Any]
    weights_signature: list[int] | None = None  # the checkpoint file read (loaded_weights.file_signature)


def weights_identity(cell: Cell, adapter: Any) -> CellIdentity:
    """The cell's id and provenance: builds the encoder on the CPU to fingerprint its weights."""
    # deferred: torch and timm load for a cell that reads an encoder's weights; recorded cells are found
    # without them
    from jobs.extraction.loaded_weights import file_signature, load_checked, weights_file

    entry = cell.entry
    settings = entry.resolve(cell.settings)
    result_settings = entry.result_settings(settings)
    spec = cell.encoder.spec()
    signature = file_signature(weights_file(spec))
    encoder = load_checked(spec, signature, device="cpu", autocast=False)
    prov = encoder.provenance()
    model_input = stable_hash({"arch": cell.encoder.arch, "data_config": prov["data_config"]})
    images = {split: adapter.fingerprint(split) for split in cell.splits()}
    fps = encoder_fingerprints(encoder.weights_fingerprint, model_input, images)
    for name in entry.files:  # a local file it reads: its contents, not its path
        path = setting_at(settings, name)
        if path:
            fps[name] = _file_sha256(path)
    cid = cell_id(fps, cell.protocol, result_settings, entry.version)
    provenance = {"arch": cell.encoder.arch, "weights_fingerprint": encoder.weights_fingerprint,
                  "weights": prov["weights"], "data_config": prov["data_config"], "versions": prov["versions"],
                  "dataset": to_plain(adapter.describe())}
    return CellIdentity(cid, settings, result_settings, fps, provenance, signature)


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- any cell ----------------------------------------------------------------------------
def recorded_cells(store: Any, cells: Iterable[Cell]) -> tuple[list[dict[str, Any]], list[Cell]]:
    """(records found, as ``cell_id`` + names; cells without a record at their current
    settings), without computing anything: a feature cell from its arrays' metadata, a
    weights cell from its name's pointer (no encoder is loaded; a changed checkpoint file
    is seen by the next run, which checks the weights)."""
    # Only records of the cell's own encoder are found (``jobs.evaluation.encoder_identity``): where the
    # name's arrays (or its pointer) hold another config's weights, the cell's identity
    # pointer answers, else the cell is not recorded; never the other config's number.
    cells = list(cells)
    ledger = Ledger(store)
    features = [c for c in cells if c.entry.reads_features]
    weights = [c for c in cells if not c.entry.reads_features]
    ids = [cid if own else _pointed_own(store, ledger, c)
           for c, (cid, own) in zip(features, _identify(store, features))]
    ids += [_pointed(store, ledger, c) for c in weights]
    found, missing = [], []
    for cell, cid in zip(features + weights, ids):  # feature cells first, as listings show them
        if cid is None or not ledger.has(cid):
            missing.append(cell)
            continue
        found.append({"cell_id": cid, "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
                      "setting": cell.setting})
    return found, missing


def _pointed_own(store: Any, ledger: Ledger, cell: Cell) -> str | None:
    """The record of a feature cell whose arrays now hold another config's weights or
    images: the one its identity's last evaluation used, if of its current settings."""
    return pointed_record(store, ledger, cell.identity, cell, settings_hash(cell.protocol, cell.settings))


def _pointed(store: Any, ledger: Ledger, cell: Cell) -> str | None:
    """The record a weights cell's identity (else its name) points at, if it is of the
    cell's current settings and its own encoder's (a record of an older store, without an
    identity, is taken by its name)."""
    wanted = settings_hash(cell.protocol, cell.settings)
    own = pointed_record(store, ledger, cell.identity, cell, wanted)
    if own is not None:
        return own
    raw = store.backend.read(record_keys.encoder_cell_key(cell.model, cell.dataset, cell.setting))
    cid = json.loads(raw).get("cell_id") if raw is not None else None
    rec = ledger.get(cid) if cid and ledger.has(cid) else None
    if rec is None or rec.get("protocol") != cell.protocol or rec.get("config_hash") != wanted:
        return None
    if cell.identity is not None and record_identity(rec) not in (None, cell.identity):
        return None  # another config's encoder of this name
    return cid
