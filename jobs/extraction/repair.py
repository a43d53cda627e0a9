"""Repair: recompute exactly the chunks of stored arrays that fail their checksum."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch

from jobs.extraction.dense_targets import target_chunks
from jobs.extraction.forward import forward_chunks, layer_fingerprints
from pipeline.datasets import DatasetAdapter, make_dataset
from pipeline.encoders import Encoder, EncoderSpec, load_encoder
from pipeline.errors import (
    ArrayNotFoundError, CheckpointError, ConfigError, CorruptChunkError, RepevalError, StaleArrayError, StoreError,
)
from pipeline.plain import to_plain
from storage_schema import DEFAULT_TTL, ArraySpec, FeatureStore, parse_feature_key
from storage_schema.keys import group_of
from storage_schema.provenance import canonical_json, library_versions

log = logging.getLogger(__name__)

# Keys of DatasetAdapter.describe() that are derived, not constructor parameters.
_DESCRIBED_ONLY = ("adapter", "version", "name", "class_names", "splits", "feature_dim")


@dataclass
class ArrayRepair:
    """One repaired array: its key and the chunks recomputed."""

    key: str
    chunks: list[int]


@dataclass
class RepairSummary:
    """What ``repeval repair`` did: arrays checked, chunks recomputed, what it could not repair."""

    checked: int = 0
    repaired: list[ArrayRepair] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)  # resumed by extraction, not here
    failed: list[str] = field(default_factory=list)  # "<key(s)>: <why>"
    forward_batches: int = 0
    images: int = 0

    @property
    def chunks(self) -> int:
        """Chunks recomputed in all."""
        return sum(len(r.chunks) for r in self.repaired)

    def to_dict(self) -> dict:
        """Plain values (``repeval repair --json``), with the chunk count: ``to_plain`` and
        the derived ``chunks``, which ``to_plain`` cannot add."""
        return {**to_plain(self), "chunks": self.chunks}


def find_damage(store: FeatureStore, keys: list[str] | None = None) -> tuple[dict[str, list[int]], list[str], int]:
    """Find the damaged chunks of stored arrays (reads every chunk)."""
    # An alias is checked (and repaired) through the array holding its rows, once.
    listed = store.list_arrays() if keys is None else [_status(store, k) for k in keys]
    stored = {st.storage_key: st for st in listed if st.alias_of is None}
    for st in listed:
        if st.alias_of is not None and st.alias_of not in stored:
            stored[st.alias_of] = _status(store, st.alias_of)
    statuses = list(stored.values())
    damaged, incomplete = {}, []
    for st in statuses:
        if not st.complete:
            incomplete.append(st.key)
        elif bad := store.damaged_chunks(st.key):
            damaged[st.key] = bad
    return damaged, incomplete, len(statuses)


def repair(store: FeatureStore, keys: list[str] | None = None, *, weights: str | None = None,
           device: str | None = None, lease_ttl: float = DEFAULT_TTL, num_workers: int = 0) -> RepairSummary:
    """Recompute the damaged chunks of ``keys`` (default: every array of the store)."""
    # Arrays that cannot be recomputed are listed in ``failed`` with the reason; the others
    # are still repaired.
    store.check_writable()
    summary = RepairSummary()
    damaged, summary.incomplete, summary.checked = find_damage(store, keys)
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for key in damaged:
        groups[(group_of(key), _recipe(store.status(key).attrs))].append(key)
    for (group, _), group_keys in groups.items():
        try:
            kind = store.status(group_keys[0]).attrs.get("kind")
            if kind == "labels":
                _repair_labels(store, group_keys[0], lease_ttl, summary)
            elif kind == "targets":
                for key in group_keys:
                    _repair_targets(store, key, lease_ttl, summary)
            else:
                _repair_features(store, group, group_keys, weights, device, lease_ttl, num_workers, summary)
        except RepevalError as exc:
            summary.failed.append(f"{', '.join(group_keys)}: {exc}")
    return summary


def _status(store: FeatureStore, key: str):
    st = store.status(key)
    if st is None:
        raise ArrayNotFoundError(f"no array {key!r} in store {store.url!r}")
    return st


def _recipe(attrs: dict) -> str:
    """What decides how an array's rows are computed; layers sharing it share a forward pass."""
    spec = {k: v for k, v in (attrs.get("encoder_spec") or attrs.get("encoder") or {}).items() if k != "layers"}
    return canonical_json([attrs.get("kind"), spec, attrs.get("dataset_params"), attrs.get("split"),
                           attrs.get("batch_size"), attrs.get("chunk_rows"), attrs.get("dtype")])


# -- rebuilding the recipe -------------------------------------------------------------------
def _dataset(attrs: dict, key: str) -> DatasetAdapter:
    params = dict(attrs.get("dataset_params") or {})
    if "adapter" not in params:
        raise StoreError(f"cannot repair {key!r}: its attributes hold no dataset parameters; re-extract it")
    kwargs = {k: v for k, v in params.items() if k not in _DESCRIBED_ONLY}
    try:
        return make_dataset(params["adapter"], name=params["name"], **kwargs)
    except RepevalError as exc:
        raise type(exc)(f"cannot repair {key!r}: its dataset cannot be rebuilt: {exc}") from exc


def _spec(attrs: dict, layers: list[str], weights: str | None, key: str) -> EncoderSpec:
    prov = attrs.get("encoder") or {}
    if prov.get("source") == "imported":
        raise StoreError(f"cannot repair {key!r}: it holds imported features; import them again "
                         "with `repeval import-features`")
    record = attrs.get("encoder_spec") or _spec_from_provenance(prov, weights, key)
    record = {**record, "layers": list(layers)}
    if weights is not None:
        record["weights"] = weights
    return EncoderSpec.from_dict(record)


def _spec_from_provenance(prov: dict, weights: str | None, key: str) -> dict:
    """Arrays written before the spec was recorded: rebuild it from the encoder provenance."""
    source = (prov.get("weights") or {}).get("source")
    record = {"name": prov["name"], "arch": prov["arch"], "input_size": prov["data_config"]["input_size"][-1]}
    if source == "random":
        return {**record, "weights": "random", "seed": prov["weights"].get("seed", 0)}
    if source == "timm-pretrained":
        tag = prov["weights"]["tag"]
        return {**record, "weights": f"timm:{tag.split('.', 1)[1]}" if "." in tag else "pretrained"}
    if weights is None:
        raise CheckpointError(
            f"cannot repair {key!r}: it was extracted from checkpoint {prov['weights'].get('file')!r} before "
            "checkpoint paths were recorded; pass the file with --weights PATH"
        )
    return record


def _encoder(spec: EncoderSpec, attrs: dict, device: str | None, key: str) -> Encoder:
    prov = attrs["encoder"]
    wanted = prov.get("device", "cpu")
    device = torch.device(device or wanted)
    if device.type != wanted:
        raise ConfigError(f"cannot repair {key!r} on {device.type}: it was extracted on {wanted}, and rows "
                          f"computed on {device.type} differ in the last bits; repair it on a {wanted} device")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"cannot repair {key!r}: it was extracted on cuda and no GPU is visible here")
    try:
        amp = prov.get("autocast_dtype") or ("float16" if prov.get("autocast") else "float32")
        encoder = load_encoder(spec, device=device, precision=amp, channels_last=bool(prov.get("channels_last")))
    except CheckpointError as exc:
        raise CheckpointError(
            f"cannot repair {key!r}: {exc}. Restore that checkpoint (or pass the moved file with "
            "--weights PATH), or re-extract the array"
        ) from exc
    if encoder.weights_fingerprint != prov.get("weights_fingerprint"):
        raise CheckpointError(
            f"cannot repair {key!r}: {spec.weights!r} now holds other weights (fingerprint "
            f"{encoder.weights_fingerprint[:12]}; the array was extracted from "
            f"{str(prov.get('weights_fingerprint'))[:12]}); restore the original checkpoint or re-extract"
        )
    then, now = attrs.get("libraries") or {}, library_versions()
    changed = [f"{lib} {then[lib]} -> {now[lib]}" for lib in ("torch", "timm") if lib in then and then[lib] != now[lib]]
    if changed:
        log.warning("%s: libraries changed since extraction (%s): repaired rows may differ in the last bits",
                    key, ", ".join(changed))
    return encoder


# -- writing -------------------------------------------------------------------------------------
def _repair_features(store: FeatureStore, group: str, keys: list[str], weights: str | None,
                     device: str | None, lease_ttl: float, num_workers: int, summary: RepairSummary) -> None:
    attrs = store.status(keys[0]).attrs
    layers = {parse_feature_key(k)[3]: k for k in keys}
    split, dtype = attrs["split"], attrs["dtype"]
    dataset = _dataset(attrs, keys[0])
    encoder = _encoder(_spec(attrs, sorted(layers), weights, keys[0]), attrs, device, keys[0])
    decode = attrs.get("decode", "pil")
    fps = layer_fingerprints(encoder, dataset.fingerprint(split), split, dtype, decode)
    for layer, key in layers.items():
        stored = store.status(key).fingerprint
        if fps[layer] != stored:
            raise StaleArrayError(
                f"cannot repair {key!r}: the rebuilt encoder and dataset give fingerprint {fps[layer][:12]}, "
                f"the array holds {stored[:12]} (weights, preprocessing or data changed); re-extract it"
            )
    chunk_rows, batch_size = int(attrs["chunk_rows"]), int(attrs["batch_size"])

    def count(images: int) -> None:
        summary.forward_batches += 1
        summary.images += images

    def produce(todo):
        chunks = sorted(set().union(*todo.values()))
        for chunk, feats in forward_chunks(encoder, dataset, split, chunks, chunk_rows=chunk_rows,
                                           batch_size=batch_size, dtype=dtype, num_workers=num_workers,
                                           on_batch=count, decode=decode):
            yield chunk, {key: feats[layer] for layer, key in layers.items()}

    with store.lease(group, ttl=lease_ttl) as lease:
        todo = {}  # read again under the lease: another process may have rewritten the array meanwhile
        for layer, key in layers.items():
            st = store.status(key)
            if st is not None and st.complete and st.fingerprint == fps[layer]:
                todo[key] = (st, store.damaged_chunks(key))
        store.write_arrays(lease, [ArraySpec.of(st) for st, _ in todo.values()], produce,
                           chunks={key: bad for key, (_, bad) in todo.items()})
    for key, (_, bad) in todo.items():
        _check_repaired(store, key, bad, summary)


def _repair_labels(store: FeatureStore, key: str, lease_ttl: float, summary: RepairSummary) -> None:
    st = store.status(key)
    split = st.attrs["split"]
    dataset = _dataset(st.attrs, key)
    if dataset.labels_fingerprint(split) != st.fingerprint:
        raise StaleArrayError(f"cannot repair {key!r}: the rebuilt dataset's labels have fingerprint "
                              f"{dataset.labels_fingerprint(split)[:12]}, the stored labels {st.fingerprint[:12]}")
    labels = np.asarray(dataset.labels(split), dtype=np.int64)
    rows = st.chunk_rows
    with store.lease(group_of(key), ttl=lease_ttl) as lease:
        bad = store.damaged_chunks(key)
        store.write_arrays(lease, [ArraySpec.of(st)],
                           lambda todo: ((c, {key: labels[c * rows:(c + 1) * rows]}) for c in sorted(todo[key])),
                           chunks={key: bad})
    _check_repaired(store, key, bad, summary)


def _repair_targets(store: FeatureStore, key: str, lease_ttl: float, summary: RepairSummary) -> None:
    """A dense split's targets, recomputed from its dataset at their recorded geometry."""
    st = store.status(key)
    split = st.attrs["split"]
    dataset = _dataset(st.attrs, key)
    if dataset.fingerprint(split) != st.attrs.get("dataset_fingerprint"):
        raise StaleArrayError(f"cannot repair {key!r}: the rebuilt dataset has fingerprint "
                              f"{dataset.fingerprint(split)[:12]}, the targets were made from "
                              f"{str(st.attrs.get('dataset_fingerprint'))[:12]}")
    with store.lease(group_of(key), ttl=lease_ttl) as lease:
        bad = store.damaged_chunks(key)
        store.write_arrays(lease, [ArraySpec.of(st)], lambda todo: (
            (c, {key: rows}) for c, rows in target_chunks(dataset, split, st.attrs["geometry"], st.chunk_rows,
                                                          sorted(todo[key]))), chunks={key: bad})
    _check_repaired(store, key, bad, summary)


def _check_repaired(store: FeatureStore, key: str, chunks: list[int], summary: RepairSummary) -> None:
    still = store.damaged_chunks(key)
    if still:
        raise CorruptChunkError(f"{key!r}: chunk(s) {still} still fail their checksum after rewriting; "
                                "the storage itself may be failing")
    if chunks:
        summary.repaired.append(ArrayRepair(key, chunks))
