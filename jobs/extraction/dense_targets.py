"""Per-pixel targets of a dense dataset's split, stored once per input geometry."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from pipeline.datasets import DatasetAdapter
from pipeline.datasets.dense_geometry import geometry_tag, resample_target, target_geometry
from pipeline.datasets.inspection import bad_targets
from pipeline.errors import DatasetError
from storage_schema import ArraySpec, FeatureStore
from storage_schema.keys import labels_group_key, targets_key
from storage_schema.leases import DEFAULT_TTL
from storage_schema.provenance import now_iso, stable_hash

__all__ = ["TARGET_CHUNK_ROWS", "TARGETS_FORMAT", "check_every_target", "store_targets", "target_chunks",
           "targets_layout"]

#: Images per chunk of a targets array.
TARGET_CHUNK_ROWS = 64
#: Bumped when the stored form of targets changes (their fingerprints change with it).
TARGETS_FORMAT = 1


def targets_layout(dataset: DatasetAdapter, geometry: dict[str, Any]) -> tuple[tuple[int, ...], str]:
    """(shape of one image's target, stored dtype) of a dense dataset at ``geometry``."""
    h, w = geometry["size"]
    if dataset.dense_task == "segmentation":
        return (h, w), "uint8"
    if dataset.dense_task == "normals":
        return (h, w, 3), "float16"
    raise DatasetError(f"dataset {dataset.name!r} ({dataset.adapter}) has no per-pixel targets")


def target_chunks(dataset: DatasetAdapter, split: str, geometry: dict[str, Any], chunk_rows: int,
                  chunks: Iterable[int]) -> Iterator[tuple[int, np.ndarray]]:
    """The rows of the given chunks of a split's targets, each chunk whole."""
    n = dataset.num_samples(split)
    _, dtype = targets_layout(dataset, geometry)
    for chunk in chunks:
        rows = [resample_target(dataset.load_target(split, i), geometry)
                for i in range(chunk * chunk_rows, min((chunk + 1) * chunk_rows, n))]
        yield chunk, np.stack(rows).astype(dtype)


_CHECKED: set[str] = set()  # datasets (by their splits' fingerprints) whose every target read, in this process


def check_every_target(dataset: DatasetAdapter) -> None:
    """Refuse a dense dataset any of whose targets (every split) a run would refuse, naming
    the files, before any target or feature array is made: a label out of range in the test
    split is found before the train split is extracted, and leaves no partial array."""
    # Checked once per process and dataset state (its splits' fingerprints).
    state = stable_hash({split: dataset.fingerprint(split) for split in dataset.splits
                         if split != dataset.pooled_split})
    if state in _CHECKED:
        return
    bad = [message for messages in bad_targets(dataset).values() for message in messages]
    if bad:
        more = f" (and {len(bad) - 1} other bad target(s); `repeval datasets show` names each)" if len(bad) > 1 else ""
        raise DatasetError(f"{bad[0]}{more}")
    _CHECKED.add(state)


def store_targets(store: FeatureStore, dataset: DatasetAdapter, split: str, data_config: dict[str, Any],
                  lease_ttl: float = DEFAULT_TTL) -> str:
    """Write the split's targets at the geometry of ``data_config`` unless they are stored; their key."""
    geometry = target_geometry(data_config)
    key = targets_key(dataset.name, split, geometry_tag(geometry))
    fingerprint = stable_hash({"format": TARGETS_FORMAT, "dataset": dataset.fingerprint(split), "geometry": geometry,
                               "task": dataset.dense_task})

    def done() -> bool:
        st = store.status(key)
        return st is not None and st.complete and st.fingerprint == fingerprint

    if done():
        return key
    check_every_target(dataset)  # a bad file of any split is named before a first array is made
    shape, dtype = targets_layout(dataset, geometry)
    n = dataset.num_samples(split)
    attrs = {
        "fingerprint": fingerprint, "kind": "targets", "dataset": dataset.name, "split": split,
        "task": dataset.dense_task, "geometry": geometry, "class_names": list(dataset.class_names),
        "ignore_index": int(dataset.ignore_index), "dataset_fingerprint": dataset.fingerprint(split),
        "dataset_params": dataset.describe(), **dataset.metadata(), "skipped_ids": list(dataset.skipped(split)),
        "format": TARGETS_FORMAT, "recorded": now_iso(),
    }
    spec = ArraySpec(key, (n, *shape), min(TARGET_CHUNK_ROWS, max(n, 1)), dtype, attrs)
    with store.lease(labels_group_key(dataset.name, split), ttl=lease_ttl) as lease:
        if not done():  # another process may have finished while we waited
            store.write_arrays(lease, [spec], lambda todo: (
                (c, {key: rows}) for c, rows in target_chunks(dataset, split, geometry, spec.chunk_rows,
                                                              sorted(todo[key]))))
    return key
