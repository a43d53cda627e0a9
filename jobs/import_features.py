"""Bring features computed elsewhere (.npz / .npy) into the store, so every protocol and
the ledger work on them as on extracted ones."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.datasets import DatasetAdapter
from pipeline.errors import DatasetError
from pipeline.names import validate_name
from storage_schema import FeatureStore, feature_key, features_group_key, stable_hash
from storage_schema.provenance import library_versions
from jobs.labels import store_labels

IMPORT_CHUNK_ROWS = 4096


@dataclass
class ImportReport:
    key: str
    fingerprint: str
    rows: int
    dim: int
    status: str  # "imported" | "cached"


def import_features(store: FeatureStore, model: str, dataset: DatasetAdapter, split: str,
                    layer: str = "pre_logits", lease_ttl: float = 60.0) -> ImportReport:
    """Store ``dataset``'s precomputed features of ``split`` as ``features/model/.../layer``."""
    validate_name(model, "model name")
    validate_name(layer, "layer name")
    store.check_writable()
    if dataset.has_images:
        raise DatasetError(f"dataset {dataset.name!r} holds images; extract it with an encoder instead")
    if split not in dataset.splits:
        raise DatasetError(f"dataset {dataset.name!r} has no split {split!r}; splits: {', '.join(dataset.splits)}")
    feats = np.ascontiguousarray(dataset.features(split), dtype=np.float32)
    key = feature_key(model, dataset.name, split, layer)
    data_fp = dataset.fingerprint(split)
    fp = stable_hash({"imported": data_fp, "layer": layer, "model": model, "dtype": "float32"})
    st = store.status(key)
    if st is not None and st.complete and st.fingerprint == fp:
        return ImportReport(key, fp, feats.shape[0], feats.shape[1], "cached")
    labels_key = store_labels(store, dataset, split, lease_ttl=lease_ttl)
    with store.lease(features_group_key(model, dataset.name, split), ttl=lease_ttl) as lease:
        attrs = {
            "fingerprint": fp, "kind": "features", "model": model, "dataset": dataset.name, "split": split,
            "layer": layer, "pooling": "as imported", "dtype": "float32", "labels": labels_key,
            "encoder": {"name": model, "source": "imported", "dataset_params": dataset.describe()},
            "dataset_fingerprint": data_fp, "libraries": library_versions(),
        }
        rows = min(IMPORT_CHUNK_ROWS, max(feats.shape[0], 1))
        st = store.status(key)  # a partial import of the same data is simply rewritten
        if st is not None and st.fingerprint == fp:
            arr = store.open_writable(key)
        else:
            arr = store.create_array(lease, key, shape=feats.shape, chunk_rows=rows, dtype="float32", attrs=attrs)
        for c, start in enumerate(range(0, feats.shape[0], rows)):
            store.write_chunk(lease, arr, fp, c, feats[start:start + rows])
        store.mark_complete(lease, key, fp)
    return ImportReport(key, fp, feats.shape[0], feats.shape[1], "imported")
