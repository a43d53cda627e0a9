"""Bring features computed elsewhere (.npz / .npy) into the store, so every protocol and
the ledger work on them as on extracted ones."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.datasets import DatasetAdapter
from pipeline.errors import DatasetError
from pipeline.names import validate_name
from storage_schema import DEFAULT_TTL, ArraySpec, FeatureStore, feature_key, features_group_key, stable_hash
from storage_schema.provenance import library_versions
from jobs.labels import store_labels

IMPORT_CHUNK_ROWS = 4096


@dataclass
class ImportReport:
    """What :func:`import_features` did.

    Parameters
    ----------
    key, fingerprint : str
        The stored array's key and fingerprint.
    rows, dim : int
        Its shape.
    status : str
        ``imported`` or ``cached`` (already complete).
    """

    key: str
    fingerprint: str
    rows: int
    dim: int
    status: str  # "imported" | "cached"


def import_features(store: FeatureStore, model: str, dataset: DatasetAdapter, split: str,
                    layer: str = "pre_logits", lease_ttl: float = DEFAULT_TTL) -> ImportReport:
    """Store ``dataset``'s precomputed features of ``split`` as ``features/<model>/.../<layer>``.

    Parameters
    ----------
    store : FeatureStore
        A writable store.
    model : str
        The name the features are stored under.
    dataset : DatasetAdapter
        A dataset of precomputed features (not images).
    split : str
        One of its splits.
    layer : str
        The layer name to store them as.
    lease_ttl : float
        TTL of the write lease, in seconds.

    Returns
    -------
    ImportReport
        The key, fingerprint and size, and whether they were imported or already there.
    """
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
    attrs = {
        "fingerprint": fp, "kind": "features", "model": model, "dataset": dataset.name, "split": split,
        "layer": layer, "pooling": "as imported", "dtype": "float32", "labels": labels_key,
        "encoder": {"name": model, "source": "imported", "dataset_params": dataset.describe()},
        "dataset_fingerprint": data_fp, "libraries": library_versions(),
    }
    rows = min(IMPORT_CHUNK_ROWS, max(feats.shape[0], 1))
    spec = ArraySpec(key, feats.shape, rows, "float32", attrs)  # a partial import of the same data resumes
    with store.lease(features_group_key(model, dataset.name, split), ttl=lease_ttl) as lease:
        store.write_arrays(lease, [spec], lambda todo: ((c, {key: feats[c * rows:(c + 1) * rows]})
                                                        for c in sorted(todo[key])))
    return ImportReport(key, fp, feats.shape[0], feats.shape[1], "imported")
