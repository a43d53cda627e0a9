"""Labels of a dataset split, stored once and shared by every encoder's features."""

from __future__ import annotations

from pipeline.datasets import DatasetAdapter
from storage_schema import FeatureStore
from storage_schema.leases import DEFAULT_TTL
from storage_schema.provenance import now_iso


def labels_attrs(dataset: DatasetAdapter, split: str) -> dict:
    """The attributes stored with a split's labels: what the dataset is, how it is scored, what it left out."""
    return {
        "fingerprint": dataset.labels_fingerprint(split), "kind": "labels", "dataset": dataset.name,
        "split": split, "class_names": list(dataset.class_names),
        "mean_per_class": bool(dataset.mean_per_class), "dataset_params": dataset.describe(),
        **dataset.metadata(),  # metric, multi_label, validation source, fingerprint mode, split roles
        "skipped_ids": list(dataset.skipped(split)), "recorded": now_iso(),
        # what the layout left out (hidden folders), for the report; empty classes come from the labels
        "layout_notes": list(getattr(dataset, "layout_notes", list)()),
    }


def store_labels(store: FeatureStore, dataset: DatasetAdapter, split: str,
                 lease_ttl: float = DEFAULT_TTL) -> str:
    """Write the split's labels unless the same fingerprint is already complete; its key."""
    arr = store.write_labels(dataset.name, split, dataset.labels(split), labels_attrs(dataset, split),
                             lease_ttl=lease_ttl)
    return arr.key
