"""Targets: class labels of any sortable hashable type, the store's integer class indices,
multi-label arrays, the validation split."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.exceptions import DataConversionWarning
from sklearn.model_selection import ShuffleSplit, StratifiedShuffleSplit

from pipeline.errors import DataValidationError
from pipeline.protocols.inputs.features import SHOWN, check_features

__all__ = ["check_class_indices", "check_min_classes", "check_multilabel", "check_train_test", "encode_labels",
           "encode_targets", "validation_split"]


def _as_1d(y: Any, n_samples: int | None, name: str) -> np.ndarray:
    if y is None:
        raise DataValidationError(f"This estimator requires y to be passed, but the target {name} is None")
    y_arr = np.asarray(y)
    if y_arr.ndim == 2 and y_arr.shape[1] == 1:
        warnings.warn(
            f"A column-vector {name} was passed when a 1d array was expected. Please "
            "change the shape of y to (n_samples,), for example using ravel().",
            DataConversionWarning,
            stacklevel=4,
        )
        y_arr = y_arr.ravel()
    if y_arr.ndim != 1:
        raise DataValidationError(
            f"{name} must be 1-D class labels of shape (n_samples,), got shape {y_arr.shape}"
        )
    if n_samples is not None and y_arr.shape[0] != n_samples:
        raise DataValidationError(
            f"{name} has {y_arr.shape[0]} labels, but X has {n_samples} samples; "
            "they must match one to one"
        )
    return y_arr


def _check_numeric_labels(y_arr: np.ndarray, name: str) -> None:
    """Refuse complex, non-finite and fractional (continuous) numeric labels."""
    if y_arr.dtype.kind == "c":
        raise DataValidationError(f"Complex data not supported: {name} has dtype {y_arr.dtype}")
    if y_arr.dtype.kind != "f":
        return
    finite = np.isfinite(y_arr)
    if not finite.all():
        where = np.flatnonzero(~finite)
        raise DataValidationError(
            f"Input {name} contains NaN or infinity: {where.size} value(s), first at "
            f"index {', '.join(map(str, where[:SHOWN]))}"
        )
    fractional = np.flatnonzero(y_arr != np.round(y_arr))
    if fractional.size:
        i = fractional[0]
        raise DataValidationError(
            f"Unknown label type: {name} looks continuous, {fractional.size} of "
            f"{y_arr.size} values are not integers (first {y_arr[i].item()!r} at index {i}); "
            "class labels must be discrete"
        )


def encode_labels(y: Any, n_samples: int | None = None, name: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """Class labels of any sortable kind (ints, strings, ...) as (classes, indices)."""
    # Like scikit-learn classifiers: ``classes`` are the distinct labels as given, sorted;
    # ``indices[i]`` is the position of ``y[i]`` in ``classes``. How many classes a fit
    # needs is ``check_min_classes``' question.
    y_arr = _as_1d(y, n_samples, name)
    if y_arr.dtype == object:
        kinds = {type(v) for v in y_arr}
        if all(issubclass(k, (int, float, np.number, bool, np.bool_)) for k in kinds):
            try:
                numeric = y_arr.astype(np.float64)
            except (TypeError, ValueError):
                numeric = None
            if numeric is not None:
                _check_numeric_labels(numeric, name)
        try:
            classes, indices = np.unique(y_arr, return_inverse=True)
        except TypeError:
            shown = ", ".join(sorted(k.__name__ for k in kinds))
            raise DataValidationError(
                f"Unknown label type: {name} mixes values that cannot be compared ({shown}). "
                "Unusable class labels: they must all be numbers or all be strings"
            ) from None
    else:
        _check_numeric_labels(y_arr, name)
        if y_arr.dtype.kind not in "biufUS":
            raise DataValidationError(
                f"Unknown label type: {name} has dtype {y_arr.dtype}; class labels must be "
                "numbers or strings"
            )
        classes, indices = np.unique(y_arr, return_inverse=True)
    return classes, indices.reshape(-1).astype(np.int64)


def encode_targets(y: Any, n_samples: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """A classifier's targets: class labels (``encode_labels``) or multi-label indicators."""
    y_arr = None if y is None else np.asarray(y)
    if y_arr is not None and y_arr.ndim == 2 and y_arr.shape[1] > 1:
        indicators = check_multilabel(y_arr, n_samples=n_samples)
        return np.arange(indicators.shape[1]), indicators, True
    classes, indices = encode_labels(y_arr, n_samples=n_samples)
    check_min_classes(classes)
    return classes, indices, False


def check_class_indices(y: Any, n_samples: int | None = None, name: str = "y") -> np.ndarray:
    """Integer class indices (as the store keeps labels) as a 1-D int64 array."""
    y_arr = _as_1d(y, n_samples, name)
    if y_arr.dtype == object:
        try:  # object arrays of numbers are fine; of strings or mixed types are not
            y_arr = y_arr.astype(np.float64)
        except (TypeError, ValueError):
            example = next((v for v in y_arr if not isinstance(v, (int, float, np.number))), y_arr[0])
            raise DataValidationError(
                f"Unknown label type: {name} must hold integer class indices, got "
                f"{type(example).__name__} values such as {example!r}"
            ) from None
    if y_arr.dtype.kind in "biu":
        return y_arr.astype(np.int64, copy=False)
    if y_arr.dtype.kind not in "fc":
        example = f" such as {y_arr[0].item()!r}" if y_arr.size else ""
        raise DataValidationError(
            f"Unknown label type: {name} must hold integer class indices, got dtype "
            f"{y_arr.dtype} values{example}"
        )
    _check_numeric_labels(y_arr, name)
    return y_arr.astype(np.int64)


def check_multilabel(Y: Any, n_samples: int | None = None, name: str = "y", *, difficult: bool = False) -> np.ndarray:
    """A multi-label array (n_samples, n_classes): a classifier's 0/1 indicators, or the
    store's labels with -1 for "difficult" (VOC)."""
    Y = np.asarray(Y)
    if Y.ndim != 2 or Y.shape[1] < 1:
        raise DataValidationError(f"{name} must be a multi-label array of shape (n_samples, n_classes), got "
                                  f"{Y.dtype} {Y.shape}")
    if n_samples is not None and Y.shape[0] != n_samples:
        raise DataValidationError(f"{name} has {Y.shape[0]} rows, but X has {n_samples} samples; "
                                  "they must match one to one")
    if difficult:
        if Y.dtype.kind not in "iub":
            raise DataValidationError(f"{name} must hold integer multi-label entries, got dtype {Y.dtype}")
        Y = Y.astype(np.int64)
        bad = ~np.isin(Y, (-1, 0, 1))
        if bad.any():
            i, c = np.argwhere(bad)[0]
            raise DataValidationError(f"{name}[{i}, {c}] = {Y[i, c]}; multi-label entries are 1 (present), "
                                      "0 (absent) or -1 (difficult)")
        return Y
    if Y.dtype.kind not in "biuf" or not np.isin(Y, (0, 1)).all():
        raise DataValidationError(f"{name} must hold 0/1 indicators (multi-label targets); got dtype "
                                  f"{Y.dtype} with values such as {np.unique(Y)[:SHOWN].tolist()}")
    return Y.astype(np.uint8, copy=False)


def check_min_classes(classes: np.ndarray, minimum: int = 2, name: str = "y") -> np.ndarray:
    """Raise if fewer than ``minimum`` distinct classes are present."""
    classes = np.unique(classes)
    if classes.size < minimum:
        shown = ", ".join(map(str, classes[:SHOWN]))
        raise DataValidationError(
            f"{name} has {classes.size} class(es) ({shown}), but at least {minimum} classes "
            "are required to fit a classifier"
        )
    return classes


def check_train_test(X_train: Any, y_train: Any, X_test: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate a train/test pair of class-index data."""
    X_train = check_features(X_train, "X_train")
    y_train = check_class_indices(y_train, n_samples=X_train.shape[0], name="y_train")
    check_min_classes(y_train, name="y_train")
    X_test = check_features(X_test, "X_test")
    if X_test.shape[1] != X_train.shape[1]:
        raise DataValidationError(
            f"X_test has {X_test.shape[1]} features, but X_train has {X_train.shape[1]}; "
            "both splits must come from the same layer"
        )
    return X_train, y_train, X_test


def validation_split(codes: np.ndarray, val_fraction: float, random_state: Any, val_mask: Any = None, *,
                     stratify: bool = True,
                     hint: str = "Pass a dataset-defined val_mask or use more samples per class.",
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, validation): the given ``val_mask`` or a seeded (stratified) draw."""
    n = len(codes)
    if val_mask is not None:
        mask = np.asarray(val_mask)
        if mask.dtype != bool or mask.shape != (n,):
            raise DataValidationError(f"val_mask must be a boolean array of shape {(n,)}, got "
                                      f"{mask.dtype} {mask.shape}")
        if mask.all() or not mask.any():
            raise DataValidationError(f"val_mask marks {int(mask.sum())} of {n} rows; both the train "
                                      "and the validation part need rows")
        return np.flatnonzero(~mask), np.flatnonzero(mask)
    splitter = (StratifiedShuffleSplit if stratify else ShuffleSplit)(1, test_size=val_fraction,
                                                                      random_state=random_state)
    try:
        train, val = next(splitter.split(np.zeros((n, 1)), codes if stratify else None))
    except ValueError as exc:
        counts = np.bincount(codes) if stratify else np.array([n])
        raise DataValidationError(
            f"Cannot draw a stratified {val_fraction:g} validation split from {n} samples of "
            f"{counts.size} classes (smallest class: {counts.min()} samples): {exc}. {hint}"
        ) from None
    return np.sort(train), np.sort(val)
