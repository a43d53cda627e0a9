"""Encoder-protocol cells: (encoder, dataset, protocol setting) evaluations that read the
encoder's weights and the dataset's images instead of stored features.

A cell's id comes from the same ``cell_id`` as a feature cell's, over what it reads: the
weights' fingerprint, a hash of the model's input (architecture and data config) and the
images' fingerprints (``storage_schema.ledger.encoder_fingerprints``), so identical weights
under another name find the same record. Computing it builds the model (torch); a pointer
per (encoder, dataset, setting) name in the store says which record a name last used, so a
listing finds it without torch. Resumable training state lives in a scratch folder: under
the store when it is a local (or mounted) folder, else under ``extract.scratch_dir`` or
``$REPEVAL_HOME/scratch``; it is deleted once the record is written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobs.config import BenchmarkConfig, DatasetConfig, EncoderConfig, ExtractConfig
from jobs.config.encoder_protocols import ENCODER_LAYER
from jobs.config.run import repeval_home
from jobs.evaluation.evaluate import json_ready
from jobs.config.typed import from_plain
from pipeline.plain import to_plain
from pipeline.encoder_protocols import FINETUNE, PERCEPTUAL, get_encoder_protocol, is_encoder_protocol
from storage_schema import keys
from storage_schema.ledger import Ledger, cell_id, config_hash, encoder_fingerprints
from storage_schema.provenance import canonical_json, now_iso, stable_hash

__all__ = ["CellIdentity", "EncoderCell", "encoder_cells", "needs_features", "put_record", "recorded_encoder_cells",
           "remove_scratch", "scratch_folder"]


@dataclass(frozen=True)
class EncoderCell:
    """One encoder protocol setting on one (encoder, dataset); plain values, cheap to ship
    to a worker. ``settings`` are the entry's resolved settings; ``model``, ``dataset``,
    ``layer`` and ``setting`` are names, as a feature cell's."""

    encoder: EncoderConfig
    dataset_config: DatasetConfig
    setting: str
    protocol: str
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        """The encoder's name, as a feature cell's ``model``."""
        return self.encoder.name

    @property
    def dataset(self) -> str:
        """The dataset's name."""
        return self.dataset_config.name

    @property
    def layer(self) -> str:
        """The layer its records are filed under: the encoder protocols' features (pre_logits)."""
        return ENCODER_LAYER

    def label(self) -> str:
        """``model/dataset/layer:setting``, as failures and progress lines name a cell."""
        return f"{self.encoder.name}/{self.dataset}/{ENCODER_LAYER}:{self.setting}"

    def splits(self) -> list[str]:
        """The splits it reads: all three for fine-tuning, the test split for a diagnostic."""
        return self.dataset_config.splits() if self.protocol == FINETUNE else [self.dataset_config.test_split]

    def to_dict(self) -> dict[str, Any]:
        """Plain values, to ship the cell to a worker."""
        return to_plain(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EncoderCell:
        """The cell ``to_dict`` gave, its config entries checked again."""
        return cls(from_plain(EncoderConfig, data["encoder"], "cell.encoder"),
                   from_plain(DatasetConfig, data["dataset_config"], "cell.dataset_config"), data["setting"],
                   data["protocol"], dict(data["settings"]))


def encoder_cells(cfg: BenchmarkConfig) -> list[EncoderCell]:
    """Every (encoder, dataset, encoder-protocol setting) the config asks for.

    Parameters
    ----------
    cfg : the config (with the scanned checkpoints among its encoders).

    Returns
    -------
    list of EncoderCell
    """
    return [EncoderCell(e, d, p.name, p.protocol, dict(p.settings))
            for p in cfg.protocols if is_encoder_protocol(p.protocol)
            for d in cfg.datasets if p.datasets is None or d.name in p.datasets
            for e in cfg.encoders if e.extracted]  # a ``source: store`` encoder has features, no weights


def needs_features(cfg: BenchmarkConfig, dataset: DatasetConfig) -> bool:
    """Whether ``dataset``'s features are extracted: not when every protocol reading it is an
    encoder protocol (a dataset no protocol reads is extracted, as always).

    Parameters
    ----------
    cfg : the config.
    dataset : one of its datasets.

    Returns
    -------
    bool
    """
    readers = [p for p in cfg.protocols if p.datasets is None or dataset.name in p.datasets]
    return not readers or any(not is_encoder_protocol(p.protocol) for p in readers)


@dataclass(frozen=True)
class CellIdentity:
    """What a cell's record is keyed by, and the encoder facts its record keeps."""

    cell_id: str
    settings: dict[str, Any]  # every setting
    result_settings: dict[str, Any]  # those that decide the result (hashed into the id)
    fingerprints: dict[str, str]
    provenance: dict[str, Any]


def identify(cell: EncoderCell, adapter: Any) -> CellIdentity:
    """The cell's id and provenance: builds the encoder on the CPU to fingerprint its weights.

    Parameters
    ----------
    cell : the cell.
    adapter : its dataset's adapter.

    Returns
    -------
    CellIdentity
    """
    from pipeline.encoders import load_encoder

    entry = get_encoder_protocol(cell.protocol)
    settings = entry.resolve(cell.settings)
    result_settings = entry.result_settings(settings)
    encoder = load_encoder(cell.encoder.spec(), device="cpu", autocast=False)
    prov = encoder.provenance()
    model_input = stable_hash({"arch": cell.encoder.arch, "data_config": prov["data_config"]})
    images = {split: adapter.fingerprint(split) for split in cell.splits()}
    fps = encoder_fingerprints(encoder.weights_fingerprint, model_input, images)
    net = settings.get(PERCEPTUAL)
    if net:
        fps[f"{PERCEPTUAL}.weights"] = _file_sha256(net["weights"])
    cid = cell_id(fps, cell.protocol, result_settings, entry.version)
    provenance = {"arch": cell.encoder.arch, "weights_fingerprint": encoder.weights_fingerprint,
                  "weights": prov["weights"], "data_config": prov["data_config"], "versions": prov["versions"],
                  "dataset": json_ready(adapter.describe())}
    return CellIdentity(cid, settings, result_settings, fps, provenance)


def _file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def scratch_folder(store: Any, extract: ExtractConfig, kind: str, run_id: str, part: str | None = None) -> Path:
    """Where a run keeps its resumable state (see the module doc).

    Parameters
    ----------
    store : the FeatureStore the record goes to.
    extract : the config's ``extract`` section (its ``scratch_dir``).
    kind : what runs (``finetune``).
    run_id : the run's content id (its cell id: the same work resumes whichever run asks).
    part : one unit of the run (``select-003``, ``refit``), or None for the whole run.

    Returns
    -------
    pathlib.Path
    """
    key = keys.scratch_key(kind, run_id, part)
    if extract.scratch_dir:
        return Path(extract.scratch_dir) / key.removeprefix(keys.SCRATCH + "/")
    if store.backend.local:
        return Path(store.backend.path(key))
    return repeval_home() / "scratch" / stable_hash(store.url, 16) / key.removeprefix(keys.SCRATCH + "/")


def remove_scratch(store: Any, extract: ExtractConfig, kind: str, run_id: str) -> None:
    """Delete a recorded run's scratch folder (its states are no longer needed).

    Parameters
    ----------
    store, extract, kind, run_id : as for :func:`scratch_folder`.
    """
    shutil.rmtree(scratch_folder(store, extract, kind, run_id), ignore_errors=True)


def put_record(store: Any, cell: EncoderCell, record: dict[str, Any], examples_png: bytes | None) -> bool:
    """Write the pictures, then the record, then the name's pointer to it.

    Parameters
    ----------
    store : the FeatureStore.
    cell : the cell recorded.
    record : its ledger record (``cell_id`` set).
    examples_png : its example pictures, or None.

    Returns
    -------
    bool
        False when another process recorded the cell meanwhile (its record is kept).
    """
    cid = record["cell_id"]
    if examples_png is not None:  # first, so that a record never lacks its pictures
        store.backend.write_atomic(keys.examples_key(cid), examples_png)
    added = Ledger(store).put(record)
    point_to(store, cell, cid)
    return added


def point_to(store: Any, cell: EncoderCell, cid: str) -> None:
    """Remember that the cell of these names uses record ``cid`` (a later listing finds it).

    Parameters
    ----------
    store : the FeatureStore.
    cell : the cell.
    cid : its cell id.
    """
    body = {"cell_id": cid, "protocol": cell.protocol, "updated": now_iso()}
    store.backend.write_atomic(keys.encoder_cell_key(cell.model, cell.dataset, cell.setting),
                               canonical_json(body).encode())


def recorded_encoder_cells(store: Any, cells: Iterable[EncoderCell]) -> tuple[list[dict[str, Any]], list[EncoderCell]]:
    """(records found as ``cell_id`` + names, cells without a record at their current
    settings), from the names' pointers alone: no encoder is loaded. A changed checkpoint
    file is seen by the next run, which checks the weights.

    Parameters
    ----------
    store : the FeatureStore.
    cells : the config's encoder cells.

    Returns
    -------
    (list of dict, list of EncoderCell)
    """
    ledger = Ledger(store)
    found, missing = [], []
    for cell in cells:
        raw = store.backend.read(keys.encoder_cell_key(cell.model, cell.dataset, cell.setting))
        cid = json.loads(raw).get("cell_id") if raw is not None else None
        rec = ledger.get(cid) if cid and ledger.has(cid) else None
        entry = get_encoder_protocol(cell.protocol)
        wanted = config_hash(entry.result_settings(entry.resolve(cell.settings)))
        if rec is None or rec.get("protocol") != cell.protocol or rec.get("config_hash") != wanted:
            missing.append(cell)
            continue
        found.append({"cell_id": cid, "model": cell.model, "dataset": cell.dataset, "layer": cell.layer,
                      "setting": cell.setting})
    return found, missing
