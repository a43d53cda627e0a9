"""Input checks shared by the protocols: raise DataValidationError before any work.

Every check names the offending value and what was expected, with numbers, in the style
of sklearn ("X has 31 features, but RidgeProbe is expecting 32 features as input").
``DataValidationError`` is also a ``ValueError``, so sklearn-style callers still catch it.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.exceptions import DataConversionWarning
from sklearn.utils import check_array
from sklearn.utils.validation import validate_data

from pipeline.errors import DataValidationError

# How many offending positions an error message lists.
_SHOWN = 5
# Feature dtypes kept as they are; anything else (float16, ints, bool, object) becomes
# float64, except float16 which becomes float32 to keep large stored arrays small.
_FLOAT_DTYPES = (np.float64, np.float32)


def _as_float_dtype(X: Any) -> Any:
    return np.float32 if getattr(X, "dtype", None) == np.float16 else _FLOAT_DTYPES


def _check_finite(X: np.ndarray, name: str) -> np.ndarray:
    """Raise if ``X`` holds NaN or +-inf, saying how many and the first positions."""
    if np.isfinite(X).all():  # the fast path: one pass, no index arrays
        return X
    bad = ~np.isfinite(X)
    n_nan = int(np.isnan(X).sum())
    n_inf = int(bad.sum()) - n_nan
    positions = np.argwhere(bad)[:_SHOWN]
    shown = ", ".join(f"({r}, {c})" for r, c in positions) if X.ndim == 2 else ", ".join(
        str(p[0]) for p in positions
    )
    more = f" (first {_SHOWN} of {n_nan + n_inf})" if n_nan + n_inf > _SHOWN else ""
    raise DataValidationError(
        f"Input {name} contains NaN or infinity: {n_nan} NaN and {n_inf} inf value(s) "
        f"among {X.size} entries of shape {X.shape}; at (row, col){more}: {shown}. "
        "Features must be finite; fix or drop these rows upstream."
    )


def check_features(X: Any, name: str = "X") -> np.ndarray:
    """Return ``X`` as a finite 2-D float array (float64, or float32 kept as is).

    Raises DataValidationError (a ValueError) for 1-D/3-D input, zero samples or features,
    complex values and NaN/inf (with their count and first (row, col) positions);
    non-numeric entries raise sklearn's TypeError.
    """
    try:
        X = check_array(X, dtype=_as_float_dtype(X), ensure_all_finite=False, input_name=name)
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    return _check_finite(X, name)


def validate_features(estimator: Any, X: Any, *, reset: bool) -> np.ndarray:
    """``check_features`` for an estimator: also records (``reset=True``) or checks
    ``n_features_in_`` and ``feature_names_in_``, via sklearn's ``validate_data``."""
    try:
        X = validate_data(
            estimator, X, reset=reset, dtype=_as_float_dtype(X), ensure_all_finite=False
        )
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    return _check_finite(X, "X")


def check_labels(y: Any, n_samples: int | None = None, name: str = "y") -> np.ndarray:
    """Return integer class labels as a 1-D int64 array.

    Accepts ints, bools and integer-valued floats; a column vector is flattened with a
    DataConversionWarning (sklearn's convention). Strings, fractional floats, NaN/inf and
    a length other than ``n_samples`` raise DataValidationError.
    """
    if y is None:
        raise DataValidationError(f"This estimator requires y to be passed, but the target {name} is None")
    y_arr = np.asarray(y)
    if y_arr.ndim == 2 and y_arr.shape[1] == 1:
        warnings.warn(
            f"A column-vector {name} was passed when a 1d array was expected. Please "
            "change the shape of y to (n_samples,), for example using ravel().",
            DataConversionWarning,
            stacklevel=3,
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
    if y_arr.dtype == object:
        try:  # object arrays of numbers are fine; of strings or mixed types are not
            y_arr = y_arr.astype(np.float64)
        except (TypeError, ValueError):
            example = next((v for v in y_arr if not isinstance(v, (int, float, np.number))), y_arr[0])
            raise DataValidationError(
                f"Unknown label type: {name} must hold integer class indices, got "
                f"{type(example).__name__} values such as {example!r}"
            ) from None
    if y_arr.dtype.kind == "b":
        return y_arr.astype(np.int64)
    if y_arr.dtype.kind in "iu":
        return y_arr.astype(np.int64, copy=False)
    if y_arr.dtype.kind == "c":
        raise DataValidationError(f"Complex data not supported: {name} has dtype {y_arr.dtype}")
    if y_arr.dtype.kind != "f":
        example = f" such as {y_arr[0].item()!r}" if y_arr.size else ""
        raise DataValidationError(
            f"Unknown label type: {name} must hold integer class indices, got dtype "
            f"{y_arr.dtype} values{example}"
        )
    finite = np.isfinite(y_arr)
    if not finite.all():
        where = np.flatnonzero(~finite)
        raise DataValidationError(
            f"Input {name} contains NaN or infinity: {where.size} value(s), first at "
            f"index {', '.join(map(str, where[:_SHOWN]))}"
        )
    fractional = np.flatnonzero(y_arr != np.round(y_arr))
    if fractional.size:
        i = fractional[0]
        raise DataValidationError(
            f"Unknown label type: {name} looks continuous, {fractional.size} of "
            f"{y_arr.size} values are not integers (first {y_arr[i].item()!r} at index {i}); "
            "class labels must be integer class indices"
        )
    return y_arr.astype(np.int64)


def check_min_classes(y: np.ndarray, minimum: int = 2) -> np.ndarray:
    """Return ``np.unique(y)``, raising if fewer than ``minimum`` classes are present."""
    classes = np.unique(y)
    if classes.size < minimum:
        shown = ", ".join(map(str, classes[:_SHOWN]))
        raise DataValidationError(
            f"y has {classes.size} class(es) ({shown}), but at least {minimum} classes "
            "are required to fit a classifier"
        )
    return classes


def check_train_test(
    X_train: Any, y_train: Any, X_test: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate a train/test pair: finite 2-D features, one label per train row, at
    least two classes, and the same number of features in both splits."""
    X_train = check_features(X_train, "X_train")
    y_train = check_labels(y_train, n_samples=X_train.shape[0], name="y_train")
    check_min_classes(y_train)
    X_test = check_features(X_test, "X_test")
    if X_test.shape[1] != X_train.shape[1]:
        raise DataValidationError(
            f"X_test has {X_test.shape[1]} features, but X_train has {X_train.shape[1]}; "
            "both splits must come from the same layer"
        )
    return X_train, y_train, X_test

