"""The forward pass over a subset's early rows of each split, into early arrays."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from jobs.config import ExtractConfig
from jobs.early.rows import early_fingerprint
from jobs.early.subsets import Subset, rows_sha256
from jobs.extraction.forward import (
    batch_loader, decode_mode, layer_dtype, layer_fingerprints, loader_settings, recorded_spec,
)
from jobs.extraction.loaded_weights import load_checked
from pipeline.datasets import DatasetAdapter
from pipeline.encoders import Encoder, EncoderSpec
from pipeline.encoders.device_preprocess import DevicePreprocess
from storage_schema import ArraySpec, FeatureStore
from storage_schema.keys import early_feature_key, early_group_key, labels_key
from storage_schema.provenance import WEIGHTS_FIELD, library_versions

__all__ = ["extract_early"]

log = logging.getLogger(__name__)


def extract_early(store: FeatureStore, encoder: EncoderSpec | Encoder, dataset: DatasetAdapter, subset: Subset,
                  config: ExtractConfig = ExtractConfig(),
                  expected_weights: list[int] | None = None) -> dict[str, Any]:
    """Extract every layer of ``encoder`` on the early rows of each split of ``subset``."""
    config.validate()
    store.check_writable()
    if isinstance(encoder, EncoderSpec):
        encoder = load_checked(encoder, expected_weights, device=config.device, precision=config.precision,
                               channels_last=config.channels_last)
    started = time.perf_counter()
    out: dict[str, Any] = {"model": encoder.spec.name, "dataset": dataset.name, "images": 0, "rows": subset.size(),
                           WEIGHTS_FIELD: encoder.weights_fingerprint, "keys": {}}
    decode = decode_mode(config.decode, dataset, encoder)
    for split, rows in subset.rows.items():
        out["keys"][split] = _split(store, encoder, dataset, subset, split, rows, config, decode, out)
    out["seconds"] = time.perf_counter() - started
    return out


def _split(store: FeatureStore, encoder: Encoder, dataset: DatasetAdapter, subset: Subset, split: str,
           rows: np.ndarray, config: ExtractConfig, decode: str, out: dict[str, Any]) -> dict[str, str]:
    model = encoder.spec.name
    fps = layer_fingerprints(encoder, dataset.fingerprint(split), split, config.dtype, decode)
    keys = {layer: early_feature_key(model, dataset.name, subset.id, split, layer) for layer in encoder.layers}
    wanted = {layer: early_fingerprint(fps[layer], subset, split) for layer in encoder.layers}

    def pending() -> list[str]:
        todo = []
        for layer, key in keys.items():
            st = store.status(key)
            if st is None or st.fingerprint != wanted[layer] or not st.complete:
                todo.append(layer)
        return todo

    if not pending():
        return keys
    chunk_rows = config.batch_size * config.chunk_batches
    shapes = encoder.feature_shapes()
    pooling = encoder.layer_pooling()
    with store.lease(early_group_key(model, dataset.name, subset.id, split), ttl=config.lease_ttl) as lease:
        todo = pending()  # another process may have written them meanwhile
        if not todo:
            return keys
        specs = []
        for layer in todo:
            attrs = {
                "fingerprint": wanted[layer], "source_fingerprint": fps[layer], "kind": "early_features",
                "model": model, "dataset": dataset.name, "split": split, "layer": layer, "subset": subset.id,
                "rows_sha256": rows_sha256(rows), "pooling": pooling[layer], "dtype": layer_dtype(layer, config.dtype),
                "chunk_rows": chunk_rows, "batch_size": config.batch_size, "labels": labels_key(dataset.name, split),
                "encoder": encoder.provenance(), "encoder_spec": recorded_spec(encoder.spec),
                WEIGHTS_FIELD: encoder.weights_fingerprint, "dataset_fingerprint": dataset.fingerprint(split),
                "libraries": library_versions(), "decode": decode,
            }
            specs.append(ArraySpec(keys[layer], (len(rows), *shapes[layer]), chunk_rows, attrs["dtype"], attrs))
        layer_of = {keys[layer]: layer for layer in todo}

        def produce(needed):
            chunks = sorted(set().union(*needed.values()))
            for chunk, feats in _forward(encoder, dataset, split, rows, chunks, chunk_rows, config, decode, out):
                yield chunk, {key: feats[layer] for key, layer in layer_of.items()}

        store.write_arrays(lease, specs, produce)
    log.info("%s/%s/%s: %d early rows extracted (subset %s)", model, dataset.name, split, len(rows), subset.id[:12])
    return keys


def _forward(encoder: Encoder, dataset: DatasetAdapter, split: str, rows: np.ndarray, chunks: list[int],
             chunk_rows: int, config: ExtractConfig, decode: str, out: dict[str, Any]):
    """Yield ``(chunk, {layer: rows})`` of the early array: its chunk ``c`` holds the subset's
    rows ``c * chunk_rows`` onwards, fed in batches that never straddle two chunks."""
    workers, pin = loader_settings(config.num_workers, config.pin_memory, encoder.device)
    plan = []
    for c in chunks:
        start, stop = c * chunk_rows, min((c + 1) * chunk_rows, len(rows))
        plan.append((c, [rows[s:min(s + config.batch_size, stop)].tolist()
                         for s in range(start, stop, config.batch_size)]))
    batches = [b for _, bs in plan for b in bs]
    loader = batch_loader(dataset, split, encoder, batches, workers, pin, decode)
    preprocess = None
    if decode == "device":
        preprocess = DevicePreprocess(encoder.data_config, encoder.device, lambda i: dataset.load_image(split, i))
    out_dtype = {layer: np.dtype(layer_dtype(layer, config.dtype)) for layer in encoder.layers}
    loaded = iter(loader)
    for chunk, chunk_batches in plan:
        parts: dict[str, list[np.ndarray]] = {layer: [] for layer in encoder.layers}
        for _ in chunk_batches:
            images, index = next(loaded)
            if preprocess is not None:
                images = preprocess(images, index.tolist())
            feats = encoder.forward_tensors(images)
            for layer, t in feats.items():
                parts[layer].append(t.to("cpu").float().numpy().astype(out_dtype[layer], copy=False))
            out["images"] += len(index)
        yield chunk, {layer: np.concatenate(p) for layer, p in parts.items()}
