"""What one dense cell hands its protocol: maps and per-pixel targets of every split."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError

__all__ = ["DENSE_TASKS", "DenseData", "IGNORE_INDEX", "check_dense_data"]

DENSE_TASKS = ("segmentation", "normals")
IGNORE_INDEX = 255
_CHECK_ROWS = 64  # maps checked for NaN/inf a block of images at a time


@dataclass(frozen=True)
class DenseData:
    """The arrays of one dense cell."""

    task: str
    X_train: Any
    y_train: Any
    X_test: Any
    y_test: Any
    n_classes: int
    X_val: Any = None
    y_val: Any = None
    ignore_index: int = IGNORE_INDEX
    scratch_dir: Path | None = None
    on_step: Callable[[str, int], None] | None = None

    @property
    def target_size(self) -> tuple[int, int]:
        """(H, W) of the targets."""
        return int(np.shape(self.y_test)[1]), int(np.shape(self.y_test)[2])

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w) of the maps."""
        return int(np.shape(self.X_test)[1]), int(np.shape(self.X_test)[2])


def check_dense_data(data: Any, protocol: str, task: str) -> None:
    """Refuse a dense cell's arrays before training, naming the array and what was expected."""
    if not isinstance(data, DenseData):
        raise DataValidationError(f"protocol {protocol!r} reads spatial maps and per-pixel targets of a dense dataset "
                                  f"(a {task} dataset and a layer 'block<i>.map'), not {type(data).__name__}")
    if data.task != task:
        raise DataValidationError(f"protocol {protocol!r} needs {task} targets; this cell's dataset has {data.task} "
                                  "targets")
    width = None
    size = None
    for split, X, y in (("train", data.X_train, data.y_train), ("test", data.X_test, data.y_test),
                        ("val", data.X_val, data.y_val)):
        if X is None and y is None and split == "val":
            continue
        if X is None or y is None:
            raise DataValidationError(f"X_{split} and y_{split} must both be given")
        shape = np.shape(X)
        if len(shape) != 4 or 0 in shape:
            raise DataValidationError(f"X_{split} has shape {shape}; {protocol!r} reads spatial maps (n, h, w, d): "
                                      "evaluate it on a layer extracted as a map, 'block<i>.map'")
        if width is not None and shape[3] != width:
            raise DataValidationError(f"X_{split} has {shape[3]} channels, but X_train has {width}; every split must "
                                      "come from the same layer")
        width = shape[3]
        _check_finite(X, f"X_{split}")
        size = _check_targets(y, shape[0], task, data.n_classes, data.ignore_index, f"y_{split}", size)


def _check_finite(X: Any, name: str) -> None:
    if not np.issubdtype(np.asarray(X[:1]).dtype, np.floating):
        raise DataValidationError(f"{name} has dtype {np.asarray(X[:1]).dtype}; maps must be floating point")
    for start in range(0, len(X), _CHECK_ROWS):
        block = np.asarray(X[start:start + _CHECK_ROWS])
        bad = ~np.isfinite(block)
        if bad.any():
            first = np.argwhere(bad)[0]
            raise DataValidationError(f"{name} contains {int(bad.sum())} NaN or inf value(s) in images "
                                      f"{start}..{start + len(block) - 1}, the first at {tuple(int(v) for v in first)} "
                                      "of that block")


def _check_targets(y: Any, n: int, task: str, n_classes: int, ignore: int, name: str,
                   size: tuple[int, int] | None) -> tuple[int, int]:
    y = np.asarray(y)
    if y.shape[0] != n:
        raise DataValidationError(f"{name} has {y.shape[0]} rows, but its maps have {n}; they must match one to one")
    if task == "segmentation":
        if y.ndim != 3 or y.dtype != np.uint8:
            raise DataValidationError(f"{name} has shape {y.shape} and dtype {y.dtype}; segmentation targets are "
                                      "(n, H, W) uint8 class maps")
        bad = (y >= n_classes) & (y != ignore)
        if bad.any():
            raise DataValidationError(f"{name} holds class {int(y[bad].max())}; classes are 0 to {n_classes - 1} "
                                      f"and {ignore} (ignored)")
    else:
        if y.ndim != 4 or y.shape[3] != 3 or not np.issubdtype(y.dtype, np.floating):
            raise DataValidationError(f"{name} has shape {y.shape} and dtype {y.dtype}; normal targets are "
                                      "(n, H, W, 3) floating-point unit vectors")
        if not np.isfinite(y).all():
            raise DataValidationError(f"{name} contains NaN or inf normals; invalid pixels are the zero vector")
    if size is not None and tuple(y.shape[1:3]) != size:
        raise DataValidationError(f"{name} is {y.shape[1]} x {y.shape[2]} pixels, but y_train is {size[0]} x "
                                  f"{size[1]}; every split's targets must share one resolution")
    return (int(y.shape[1]), int(y.shape[2]))
