"""Extraction job: one encoder on one dataset split into the store, every layer at once.

Runs without Prefect. Batches are aligned to chunks (a chunk is ``chunk_batches`` whole
batches), so a resumed run feeds the model exactly the batches an uninterrupted run
would have, and the stored array is bitwise the same.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from pipeline.datasets import DatasetAdapter, TorchImageDataset
from pipeline.encoders import Encoder, EncoderSpec, load_encoder
from pipeline.errors import DatasetError
from storage_schema import FeatureStore, array_fingerprint, feature_key, features_group_key
from storage_schema.provenance import library_versions
from jobs.config import DTYPES, ExtractConfig  # noqa: F401  (the config's extract: section)
from jobs.labels import store_labels

log = logging.getLogger(__name__)

@dataclass
class ExtractionReport:
    model: str
    dataset: str
    split: str
    status: str  # "extracted" | "resumed" | "cached" | "busy"
    keys: dict[str, str]
    fingerprints: dict[str, str]
    rows: int
    forward_batches: int = 0
    images: int = 0
    seconds: float = 0.0
    images_per_s: float = 0.0
    skipped_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _layer_fingerprints(encoder: Encoder, dataset_fp: str, split: str, dtype: str) -> dict[str, str]:
    pooling = encoder.layer_pooling()
    return {
        layer: array_fingerprint(
            weights_fingerprint=encoder.weights_fingerprint, data_config=encoder.data_config,
            layer=layer, pooling=pooling[layer], dataset_fingerprint=dataset_fp, split=split,
            dtype=dtype, arch=encoder.spec.arch,
            compute_precision="float16-autocast" if encoder.autocast else "float32",
        )
        for layer in encoder.layers
    }


def _recorded_spec(spec: EncoderSpec) -> dict:
    """The spec as stored for ``repeval repair``: a checkpoint by its absolute path (the
    weights fingerprint in ``encoder`` tells whether the file still holds the same weights)."""
    out = spec.to_dict()
    if spec.weights_kind == "checkpoint":
        out["weights"] = str(Path(spec.weights).expanduser().resolve())
    return out


def _chunk_batches(chunks: list[int], n: int, chunk_rows: int, batch_size: int) -> list[list[int]]:
    """Row indices of every batch of the given chunks, in order; batches never straddle chunks."""
    batches = []
    for c in chunks:
        start, stop = c * chunk_rows, min((c + 1) * chunk_rows, n)
        batches.extend(list(range(s, min(s + batch_size, stop))) for s in range(start, stop, batch_size))
    return batches


class _ChunkWriter:
    """Writes finished chunks on one background thread so the forward pass never waits on I/O."""

    def __init__(self, store: FeatureStore, lease, arrays, fingerprints, todo: dict[str, set[int]]):
        self.store, self.lease, self.arrays, self.fps, self.todo = store, lease, arrays, fingerprints, todo
        self.q: queue.Queue = queue.Queue(maxsize=2)  # bounds memory: at most 2 chunks in flight
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="repeval-chunk-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.q.get()) is not None:
            if self.error is not None:
                continue  # drain after a failure
            chunk, blocks = item
            try:
                for layer, rows in blocks.items():
                    if chunk in self.todo[layer]:
                        self.store.write_chunk(self.lease, self.arrays[layer], self.fps[layer], chunk, rows)
            except BaseException as exc:  # re-raised on the main thread
                self.error = exc

    def put(self, chunk: int, blocks: dict[str, np.ndarray]) -> None:
        if self.error is not None:
            raise self.error
        self.q.put((chunk, blocks))

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error


def extract(
    store: FeatureStore,
    encoder: EncoderSpec | Encoder,
    dataset: DatasetAdapter,
    split: str,
    config: ExtractConfig = ExtractConfig(),
) -> ExtractionReport:
    """Extract every requested layer of ``encoder`` on ``dataset``/``split`` into ``store``.

    Complete arrays with the same fingerprint are reused without a forward pass; a partial
    one is resumed at its first missing chunk; a stale one (other weights, preprocessing
    or data) is replaced. One process writes a (model, dataset, split) group at a time.
    """
    config.validate()
    store.check_writable()
    if not dataset.has_images:
        raise DatasetError(
            f"dataset {dataset.name!r} holds precomputed features, not images; use import_features"
        )
    if split not in dataset.splits:
        raise DatasetError(f"dataset {dataset.name!r} has no split {split!r}; splits: {', '.join(dataset.splits)}")
    if isinstance(encoder, EncoderSpec):
        encoder = load_encoder(encoder, device=config.device)
    model = encoder.spec.name
    group = features_group_key(model, dataset.name, split)
    n = dataset.num_samples(split)
    dataset_fp = dataset.fingerprint(split)
    fps = _layer_fingerprints(encoder, dataset_fp, split, config.dtype)
    keys = {layer: feature_key(model, dataset.name, split, layer) for layer in encoder.layers}
    report = ExtractionReport(model, dataset.name, split, "cached", keys, fps, n,
                              skipped_ids=list(dataset.skipped(split)))

    def pending() -> dict[str, object]:
        out = {}
        for layer, key in keys.items():
            st = store.status(key)
            if st is None or st.fingerprint != fps[layer] or not st.complete:
                out[layer] = st
        return out

    if not pending():
        return report
    labels_key = store_labels(store, dataset, split, lease_ttl=config.lease_ttl)
    lease = store.lease(group, ttl=config.lease_ttl)
    if not lease.acquire(wait=config.wait):
        report.status = "busy"
        return report
    try:
        todo_status = pending()  # the previous holder may have finished it
        if not todo_status:
            return report
        _run(store, lease, encoder, dataset, split, config, report, todo_status, labels_key)
    finally:
        lease.release()
    return report


def _run(store, lease, encoder, dataset, split, config, report, todo_status, labels_key) -> None:
    n = report.rows
    chunk_rows = config.batch_size * config.chunk_batches
    n_chunks = -(-n // chunk_rows)
    dims = encoder.feature_dims()
    pooling = encoder.layer_pooling()
    arrays, todo = {}, {}
    resumed = False
    for layer, st in todo_status.items():
        key, fp = report.keys[layer], report.fingerprints[layer]
        if st is not None and st.fingerprint == fp and st.chunk_rows == chunk_rows:
            arrays[layer] = store.open_writable(key)
            todo[layer] = set(range(n_chunks)) - set(st.done_chunks)
            resumed = resumed or bool(st.done_chunks)
        else:  # new, stale, or written with another chunking: (re)create
            attrs = {
                "fingerprint": fp, "kind": "features", "model": report.model, "dataset": report.dataset,
                "split": split, "layer": layer, "pooling": pooling[layer], "dtype": config.dtype,
                "chunk_rows": chunk_rows, "batch_size": config.batch_size, "labels": labels_key,
                "encoder": encoder.provenance(), "encoder_spec": _recorded_spec(encoder.spec),
                "dataset_fingerprint": dataset.fingerprint(split),
                "dataset_params": dataset.describe(), "skipped_ids": report.skipped_ids,
                "libraries": library_versions(),
            }
            arrays[layer] = store.create_array(lease, key, shape=(n, dims[layer]), chunk_rows=chunk_rows,
                                               dtype=config.dtype, attrs=attrs)
            todo[layer] = set(range(n_chunks))
    chunks = sorted(set().union(*todo.values()))
    batches = _chunk_batches(chunks, n, chunk_rows, config.batch_size)
    loader = DataLoader(
        TorchImageDataset(dataset, split, encoder.transform()), batch_sampler=batches,
        num_workers=config.num_workers, pin_memory=encoder.device.type == "cuda",
        persistent_workers=False,
        # its own generator: each iterator draws a seed, which from torch's global RNG could
        # land inside another thread's seeded model init (pipeline.encoders._INIT_LOCK)
        generator=torch.Generator(),
    )
    writer = _ChunkWriter(store, lease, arrays, report.fingerprints, todo)
    out_dtype = np.dtype(config.dtype)
    buffers: dict[str, list[np.ndarray]] = {layer: [] for layer in arrays}
    started = time.perf_counter()
    bar = tqdm(total=sum(len(b) for b in batches), unit="img", disable=not config.progress,
               desc=f"{report.model}/{report.dataset}/{split}", leave=False)
    try:
        for images, index in loader:
            feats = encoder.forward(images)
            report.forward_batches += 1
            report.images += len(index)
            for layer in arrays:
                buffers[layer].append(feats[layer].astype(out_dtype, copy=False))
            last_row = int(index[-1])
            chunk = last_row // chunk_rows
            if last_row + 1 == min((chunk + 1) * chunk_rows, n):  # chunk full: hand it over
                writer.put(chunk, {layer: np.concatenate(buffers[layer]) for layer in arrays})
                buffers = {layer: [] for layer in arrays}
            bar.update(len(index))
            bar.set_postfix(img_s=f"{report.images / max(time.perf_counter() - started, 1e-9):.0f}")
    finally:
        bar.close()
        writer.close()
    for layer in arrays:
        store.mark_complete(lease, report.keys[layer], report.fingerprints[layer])
    report.seconds = time.perf_counter() - started
    report.images_per_s = report.images / max(report.seconds, 1e-9)
    report.status = "resumed" if resumed else "extracted"
    log.info("%s/%s/%s: %d images in %.1f s (%.0f img/s)", report.model, report.dataset, split,
             report.images, report.seconds, report.images_per_s)


def iter_batches_for_benchmark(dataset: DatasetAdapter, split: str, encoder: Encoder,
                               batch_size: int) -> Iterator[torch.Tensor]:
    """The same batches the job feeds the model, for a bare-loop comparison."""
    n = dataset.num_samples(split)
    loader = DataLoader(TorchImageDataset(dataset, split, encoder.transform()),
                        batch_sampler=_chunk_batches(list(range(-(-n // batch_size))), n, batch_size, batch_size))
    for images, _ in loader:
        yield images
