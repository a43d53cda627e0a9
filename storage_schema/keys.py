"""Key layout of the store (ARCHITECTURE.md): one function per kind of key."""

from __future__ import annotations

from pipeline.names import validate_name

FEATURES = "features"
DATASETS = "datasets"


def features_group_key(model: str, dataset: str, split: str) -> str:
    """The group holding every layer of one encoder on one split; the unit of a lease."""
    return "/".join(
        (FEATURES, validate_name(model, "model name"), validate_name(dataset, "dataset name"),
         validate_name(split, "split name"))
    )


def feature_key(model: str, dataset: str, split: str, layer: str) -> str:
    return f"{features_group_key(model, dataset, split)}/{validate_name(layer, 'layer name')}"


def labels_key(dataset: str, split: str) -> str:
    return "/".join(
        (DATASETS, validate_name(dataset, "dataset name"), validate_name(split, "split name"), "labels")
    )


def parse_feature_key(key: str) -> tuple[str, str, str, str]:
    parts = key.strip("/").split("/")
    if len(parts) != 5 or parts[0] != FEATURES:
        raise ValueError(f"{key!r} is not a feature key: expected features/<model>/<dataset>/<split>/<layer>")
    return parts[1], parts[2], parts[3], parts[4]
