"""Extraction job: one encoder on one dataset split into the store, every layer at once."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from jobs.config import ExtractConfig
from jobs.early.rows import known_rows
from jobs.extraction.dense_targets import store_targets
from jobs.extraction.forward import (
    decode_mode, forward_chunks, layer_dtype, layer_fingerprints, loader_settings, map_attrs, recorded_spec,
)
from jobs.extraction.labels import store_labels
from jobs.extraction.loaded_weights import load_checked
from pipeline.datasets import DatasetAdapter
from pipeline.encoders import Encoder, EncoderSpec
from pipeline.encoders.spec import is_map_layer
from pipeline.errors import DatasetError
from storage_schema import ArraySpec, ArrayStatus, FeatureStore, feature_key, features_group_key
from storage_schema.leases import Lease
from storage_schema.provenance import WEIGHTS_FIELD, library_versions

log = logging.getLogger(__name__)

@dataclass
class ExtractionReport:
    """What one extraction of an encoder on a split did: its status, the arrays written or
    reused, the work and its speed, the images left out; as plain values (``to_plain``),
    what ``repeval extract --json`` prints and a run's task returns."""

    model: str
    dataset: str
    split: str
    status: str  # "extracted" | "resumed" | "aliased" | "cached" | "busy"
    keys: dict[str, str]
    fingerprints: dict[str, str]
    rows: int
    forward_batches: int = 0
    images: int = 0
    seconds: float = 0.0
    images_per_s: float = 0.0
    skipped_ids: list[str] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # layer -> key of the identical array served
    early_rows: int = 0  # rows copied from the early pass's arrays, not passed through the encoder again


def extract(
    store: FeatureStore,
    encoder: EncoderSpec | Encoder,
    dataset: DatasetAdapter,
    split: str,
    config: ExtractConfig = ExtractConfig(),
    expected_weights: list[int] | None = None,
) -> ExtractionReport:
    """Extract every requested layer of ``encoder`` on ``dataset``/``split`` into ``store``."""
    # Complete arrays with the same fingerprint are reused without a forward pass, also
    # when stored under another model name (identical weights in another file): the layer is
    # then recorded as an alias of that array, with this encoder's own provenance. A partial
    # array is resumed at its first missing chunk; a stale one (other weights, preprocessing
    # or data) is replaced. One process writes a (model, dataset, split) group at a time.
    config.validate()
    store.check_writable()
    if not dataset.has_images:
        raise DatasetError(
            f"dataset {dataset.name!r} holds precomputed features, not images; use import_features"
        )
    if split not in dataset.splits:
        raise DatasetError(f"dataset {dataset.name!r} has no split {split!r}; splits: {', '.join(dataset.splits)}")
    if isinstance(encoder, EncoderSpec):
        encoder = load_checked(encoder, expected_weights, device=config.device, precision=config.precision,
                               channels_last=config.channels_last)
    model = encoder.spec.name
    group = features_group_key(model, dataset.name, split)
    n = dataset.num_samples(split)
    dataset_fp = dataset.fingerprint(split)
    decode = decode_mode(config.decode, dataset, encoder)
    fps = layer_fingerprints(encoder, dataset_fp, split, config.dtype, decode)
    keys = {layer: feature_key(model, dataset.name, split, layer) for layer in encoder.layers}
    report = ExtractionReport(model, dataset.name, split, "cached", keys, fps, n,
                              skipped_ids=list(dataset.skipped(split)))

    def pending() -> dict[str, ArrayStatus | None]:
        out = {}
        for layer, key in keys.items():
            st = store.status(key)
            if st is None or st.fingerprint != fps[layer] or not st.complete:
                out[layer] = st
        return out

    if not pending():
        return report
    labels_keys = _labels_keys(store, encoder, dataset, split, config)
    lease = store.lease(group, ttl=config.lease_ttl)
    if not lease.acquire(wait=config.wait):
        report.status = "busy"
        return report
    try:
        todo_status = pending()  # the previous holder may have finished it
        if not todo_status:
            return report
        todo_status = _alias_identical(store, lease, encoder, report, todo_status)
        if not todo_status:
            report.status = "aliased"
            return report
        _run(store, lease, encoder, dataset, split, config, report, todo_status, labels_keys, decode)
    finally:
        lease.release()
    return report


def _labels_keys(store: FeatureStore, encoder: Encoder, dataset: DatasetAdapter, split: str,
                 config: ExtractConfig) -> dict[str, str]:
    """The labels each layer's array names: the split's labels, or for a map layer of a dense
    dataset its per-pixel targets at the encoder's input geometry (both stored here)."""
    labels = store_labels(store, dataset, split, lease_ttl=config.lease_ttl)
    maps = [layer for layer in encoder.layers if is_map_layer(layer)]
    targets = store_targets(store, dataset, split, encoder.data_config, config.lease_ttl) \
        if maps and dataset.dense_task else labels
    return {layer: targets if layer in maps else labels for layer in encoder.layers}


def _alias_identical(store: FeatureStore, lease: Lease, encoder: Encoder, report: ExtractionReport,
                     todo_status: dict[str, ArrayStatus | None]) -> dict[str, ArrayStatus | None]:
    """Alias every pending layer whose fingerprint a complete array elsewhere holds; the rest."""
    rest = {}
    for layer, st in todo_status.items():
        target = store.find_complete(report.fingerprints[layer])
        if target is None or target.key == report.keys[layer]:
            rest[layer] = st
            continue
        own = {"model": report.model, "encoder": encoder.provenance(), "encoder_spec": recorded_spec(encoder.spec),
               WEIGHTS_FIELD: encoder.weights_fingerprint}
        store.write_alias(lease, report.keys[layer], target, own)
        report.aliases[layer] = target.key
        log.info("%s holds the same features as %s (identical weights): recorded as an alias",
                 report.keys[layer], target.key)
    return rest


def _run(store: FeatureStore, lease: Lease, encoder: Encoder, dataset: DatasetAdapter, split: str,
         config: ExtractConfig, report: ExtractionReport, todo_status: dict[str, ArrayStatus | None],
         labels_keys: dict[str, str], decode: str) -> None:
    n = report.rows
    chunk_rows = config.batch_size * config.chunk_batches
    shapes = encoder.feature_shapes()
    pooling = encoder.layer_pooling()
    # the early pass's rows of this encoder and split, if it extracted them: copied, not computed again
    known = known_rows(store, report.model, report.dataset, split, report.fingerprints)
    if known is not None:
        report.early_rows = int(len(known.rows))
    specs = []
    for layer in todo_status:
        attrs = {
            "fingerprint": report.fingerprints[layer], "kind": "features", "model": report.model,
            "dataset": report.dataset, "split": split, "layer": layer, "pooling": pooling[layer],
            "dtype": layer_dtype(layer, config.dtype), "chunk_rows": chunk_rows, "batch_size": config.batch_size,
            "labels": labels_keys[layer], **map_attrs(layer, shapes[layer], encoder.data_config),
            "encoder": encoder.provenance(), "encoder_spec": recorded_spec(encoder.spec),
            WEIGHTS_FIELD: encoder.weights_fingerprint,  # of the tensors this process loaded
            "dataset_fingerprint": dataset.fingerprint(split), "dataset_params": dataset.describe(),
            "skipped_ids": report.skipped_ids, "libraries": library_versions(), "decode": decode,
            **({"early_rows": {"subset": known.source, "rows": len(known.rows)}} if known is not None else {}),
        }
        specs.append(ArraySpec(report.keys[layer], (n, *shapes[layer]), chunk_rows, attrs["dtype"], attrs))
    layer_of = {report.keys[layer]: layer for layer in todo_status}
    workers, pin = loader_settings(config.num_workers, config.pin_memory, encoder.device)
    started = time.perf_counter()
    bar = tqdm(total=0, unit="img", disable=not config.progress, desc=f"{report.model}/{report.dataset}/{split}",
               leave=False)

    def on_batch(images: int) -> None:
        report.forward_batches += 1
        report.images += images
        bar.update(images)
        bar.set_postfix(img_s=f"{report.images / max(time.perf_counter() - started, 1e-9):.0f}")

    def produce(todo):
        chunks = sorted(set().union(*todo.values()))
        bar.total = sum(min((c + 1) * chunk_rows, n) - c * chunk_rows for c in chunks)
        for chunk, feats in forward_chunks(encoder, dataset, split, chunks, chunk_rows=chunk_rows,
                                           batch_size=config.batch_size, dtype=config.dtype,
                                           num_workers=workers, pin_memory=pin, decode=decode,
                                           on_batch=on_batch, known=known):
            yield chunk, {key: feats[layer] for key, layer in layer_of.items()}

    try:
        result = store.write_arrays(lease, specs, produce)
    finally:
        bar.close()
    report.seconds = time.perf_counter() - started
    report.images_per_s = report.images / max(report.seconds, 1e-9)
    report.status = "resumed" if result.resumed else "extracted"
    log.info("%s/%s/%s: %d images in %.1f s (%.0f img/s)", report.model, report.dataset, split,
             report.images, report.seconds, report.images_per_s)
