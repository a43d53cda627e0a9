"""A dense cell's input: the map layer's splits and their per-pixel targets, read from the store."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from jobs.config.run import ExtractConfig
from jobs.evaluation.scratch import scratch_folder
from pipeline.errors import DataValidationError
from pipeline.protocols.dense.data import DenseData
from storage_schema import FeatureStore, StoredArray

__all__ = ["DENSE_SCRATCH", "dense_scratch", "load_dense_data", "remove_dense_scratch"]

#: The scratch kind of dense training runs.
DENSE_SCRATCH = "dense"


def dense_scratch(store: FeatureStore, cell_id: str) -> Path:
    """Where the dense cell ``cell_id`` keeps its training state."""
    return scratch_folder(store, ExtractConfig(), DENSE_SCRATCH, cell_id)


def remove_dense_scratch(store: FeatureStore, cell_id: str) -> None:
    """Delete a recorded dense cell's training state."""
    shutil.rmtree(dense_scratch(store, cell_id), ignore_errors=True)


def load_dense_data(arrays: dict[str, tuple[StoredArray, StoredArray]], cell: Any, protocol: Any,
                    scratch_dir: Path | None = None) -> Any:
    """The ``DenseData`` of ``cell``: every split's maps and targets."""
    train_maps, train_targets = arrays[cell.train_split]
    attrs = train_targets.attrs
    if attrs.get("kind") != "targets":
        raise DataValidationError(
            f"{train_maps.key} has no per-pixel targets (its labels are {train_targets.key}): protocol "
            f"{protocol.name!r} reads a map layer of a dense dataset (ade20k, voc2012_segmentation, nyuv2_normals)")
    if attrs.get("task") != protocol.dense:
        raise DataValidationError(f"protocol {protocol.name!r} needs {protocol.dense} targets; dataset "
                                  f"{cell.dataset!r} has {attrs.get('task')} targets ({train_targets.key})")
    test_maps, test_targets = arrays[cell.test_split]
    val = arrays.get(cell.val_split) if cell.val_split else None
    n_classes = len(attrs.get("class_names") or ()) if protocol.dense == "segmentation" else 3
    return DenseData(task=str(attrs["task"]), X_train=train_maps.read(), y_train=train_targets.read(),
                     X_test=test_maps.read(), y_test=test_targets.read(), n_classes=n_classes,
                     X_val=val[0].read() if val else None, y_val=val[1].read() if val else None,
                     ignore_index=int(attrs.get("ignore_index", 255)), scratch_dir=scratch_dir)
