"""Bring features computed elsewhere (.npz / .npy) into the store, so every protocol and
the ledger work on them as on extracted ones."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jobs.extraction.labels import store_labels
from pipeline.datasets import DatasetAdapter
from pipeline.errors import ConfigError, DatasetError
from pipeline.names import validate_name
from storage_schema import DEFAULT_TTL, ArraySpec, FeatureStore, feature_key, features_group_key, stable_hash
from storage_schema.provenance import library_versions

IMPORT_CHUNK_ROWS = 4096


@dataclass
class ImportReport:
    """What :func:`import_features` did."""

    key: str
    fingerprint: str
    rows: int
    dim: int
    status: str  # "imported" | "cached"


def import_features(store: FeatureStore, model: str, dataset: DatasetAdapter, split: str,
                    layer: str = "pre_logits", lease_ttl: float = DEFAULT_TTL,
                    dtype: str | None = None) -> ImportReport:
    """Store ``dataset``'s precomputed features of ``split`` as ``features/<model>/.../<layer>``."""
    validate_name(model, "model name")
    validate_name(layer, "layer name")
    store.check_writable()
    if dataset.has_images:
        raise DatasetError(f"dataset {dataset.name!r} holds images; extract it with an encoder instead")
    if split not in dataset.splits:
        raise DatasetError(f"dataset {dataset.name!r} has no split {split!r}; splits: {', '.join(dataset.splits)}")
    if dtype not in (None, "float16", "float32"):
        raise ConfigError(f"dtype {dtype!r} is not supported; choose float16 or float32")
    n, dim = dataset.feature_shape(split)
    stored = dtype or ("float16" if dataset.feature_dtype(split) == np.float16 else "float32")
    key = feature_key(model, dataset.name, split, layer)
    data_fp = dataset.fingerprint(split)  # reads (and checks) every row once, before anything is written
    fp = stable_hash({"imported": data_fp, "layer": layer, "model": model, "dtype": stored})
    st = store.status(key)
    if st is not None and st.complete and st.fingerprint == fp:
        return ImportReport(key, fp, n, dim, "cached")
    labels_key = store_labels(store, dataset, split, lease_ttl=lease_ttl)
    attrs = {
        "fingerprint": fp, "kind": "features", "model": model, "dataset": dataset.name, "split": split,
        "layer": layer, "pooling": "as imported", "dtype": stored, "labels": labels_key,
        "encoder": {"name": model, "source": "imported", "dataset_params": dataset.describe()},
        "dataset_fingerprint": data_fp, "libraries": library_versions(),
    }
    rows = min(IMPORT_CHUNK_ROWS, max(n, 1))
    spec = ArraySpec(key, (n, dim), rows, stored, attrs)  # a partial import of the same data resumes

    def produce(todo):
        for c in sorted(todo[key]):
            yield c, {key: dataset.feature_rows(split, c * rows, min((c + 1) * rows, n)).astype(stored, copy=False)}

    with store.lease(features_group_key(model, dataset.name, split), ttl=lease_ttl) as lease:
        store.write_arrays(lease, [spec], produce)
    return ImportReport(key, fp, n, dim, "imported")
