"""Input checks shared by the protocols: raise DataValidationError before any work.

Every check names the offending value and what was expected, with numbers, in the style
of scikit-learn ("X has 31 features, but RidgeProbe is expecting 32 features as input").
``DataValidationError`` is also a ``ValueError``, so scikit-learn-style callers still
catch it. Feature arrays are never copied when they already have a float dtype (float16
included: stored features stay in the store's precision), and the finiteness test runs
over row blocks so it needs no full-size temporary.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.exceptions import DataConversionWarning
from sklearn.utils import check_array
from sklearn.utils.validation import validate_data

from pipeline.errors import ConfigError, DataValidationError

__all__ = [
    "FLOAT_DTYPES", "check_class_indices", "check_features", "check_finite", "check_min_classes", "check_number",
    "check_multilabel", "check_train_test", "encode_labels", "encode_targets", "validate_features",
]

# How many offending positions an error message lists.
SHOWN = 5
#: Feature dtypes kept as they are; anything else (ints, bool, object) becomes float64.
FLOAT_DTYPES = (np.float64, np.float32, np.float16)
# Rows per block of the finiteness test: bounds its boolean temporary.
_FINITE_BLOCK_ELEMENTS = 1 << 22


def check_finite(X: np.ndarray, name: str = "X", row_offset: int = 0) -> np.ndarray:
    """Raise if ``X`` holds NaN or +-inf, saying how many and the first positions.

    Parameters
    ----------
    X : numpy.ndarray
        A 1-D or 2-D float array.
    name : str
        The name the message gives the array.
    row_offset : int
        Added to the row numbers in the message (for a block of a larger array).

    Returns
    -------
    numpy.ndarray
        ``X`` itself.
    """
    rows = max(1, _FINITE_BLOCK_ELEMENTS // max(1, X.shape[1] if X.ndim == 2 else 1))
    if all(np.isfinite(X[i:i + rows]).all() for i in range(0, max(len(X), 1), rows)):
        return X
    bad = ~np.isfinite(X)
    n_nan = int(np.isnan(X).sum())
    n_inf = int(bad.sum()) - n_nan
    positions = np.argwhere(bad)[:SHOWN]
    if X.ndim == 2:
        shown = ", ".join(f"({r + row_offset}, {c})" for r, c in positions)
    else:
        shown = ", ".join(str(p[0] + row_offset) for p in positions)
    more = f" (first {SHOWN} of {n_nan + n_inf})" if n_nan + n_inf > SHOWN else ""
    where = "(row, col)" if X.ndim == 2 else "index"
    raise DataValidationError(
        f"Input {name} contains NaN or infinity: {n_nan} NaN and {n_inf} inf value(s) "
        f"among {X.size} entries of shape {X.shape}; at {where}{more}: {shown}. "
        "Features must be finite; fix or drop these rows upstream."
    )


def _float_dtype(X: Any) -> Any:
    return FLOAT_DTYPES if getattr(X, "dtype", None) in FLOAT_DTYPES else np.float64


def check_features(X: Any, name: str = "X") -> np.ndarray:
    """Return ``X`` as a finite 2-D float array without copying a float one.

    Parameters
    ----------
    X : array-like of shape (n_samples, n_features)
        Features; float16/32/64 are kept, other numbers become float64.
    name : str
        The name error messages give the array.

    Returns
    -------
    numpy.ndarray
        The checked array.

    Raises
    ------
    DataValidationError
        For 1-D/3-D input, zero samples or features, complex values and NaN/inf (with
        their count and first (row, col) positions). Non-numeric entries raise
        scikit-learn's TypeError or a DataValidationError.
    """
    try:
        X = check_array(X, dtype=_float_dtype(X), ensure_all_finite=False, input_name=name)
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    return check_finite(X, name)


def validate_features(estimator: Any, X: Any, *, reset: bool) -> np.ndarray:
    """``check_features`` for an estimator; also records or checks its input width.

    Parameters
    ----------
    estimator : object
        A scikit-learn-style estimator.
    X : array-like of shape (n_samples, n_features)
        Features.
    reset : bool
        True in ``fit``: record ``n_features_in_`` (and ``feature_names_in_``); False
        afterwards: check them.

    Returns
    -------
    numpy.ndarray
        The checked array (float, finite, 2-D, not copied when already float).
    """
    try:
        X = validate_data(estimator, X, reset=reset, dtype=_float_dtype(X), ensure_all_finite=False)
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    return check_finite(X, "X")


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
    """Class labels of any sortable kind (ints, strings, ...) as (classes, indices).

    Like scikit-learn classifiers: ``classes`` are the distinct labels as given, sorted;
    ``indices[i]`` is the position of ``y[i]`` in ``classes``.

    Parameters
    ----------
    y : array-like of shape (n_samples,)
        Class labels: integers, integer-valued floats, bools, strings or other mutually
        comparable hashable values. A column vector is flattened with a
        DataConversionWarning.
    n_samples : int or None
        The number of feature rows ``y`` must match.
    name : str
        The name error messages give the labels.

    Returns
    -------
    classes : numpy.ndarray
        The sorted distinct labels, in their own dtype.
    indices : numpy.ndarray of int64
        Class index of every sample.

    Raises
    ------
    DataValidationError
        Fractional floats (continuous targets), NaN/inf, complex values, labels of
        types that cannot be compared with each other (mixed strings and numbers), a
        length other than ``n_samples``.
    """
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
                f"Unknown label type: {name} mixes values that cannot be compared ({shown}); "
                "class labels must all be numbers or all be strings"
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
    """A classifier's targets: class labels (``encode_labels``) or multi-label indicators.

    Parameters
    ----------
    y : array-like of shape (n_samples,) or (n_samples, K)
        Labels of any sortable kind (at least two classes), or a 0/1 array with K >= 2
        columns (multi-label).
    n_samples : int
        The number of feature rows.

    Returns
    -------
    classes : numpy.ndarray
        The sorted labels, or ``arange(K)`` for multi-label targets.
    targets : numpy.ndarray
        (n,) class indices, or the (n, K) uint8 indicators.
    multilabel : bool
    """
    y_arr = None if y is None else np.asarray(y)
    if y_arr is not None and y_arr.ndim == 2 and y_arr.shape[1] > 1:
        indicators = check_multilabel(y_arr, n_samples=n_samples)
        return np.arange(indicators.shape[1]), indicators, True
    classes, indices = encode_labels(y_arr if y_arr is not None else None, n_samples=n_samples)
    check_min_classes(classes)
    return classes, indices, False


def check_class_indices(y: Any, n_samples: int | None = None, name: str = "y") -> np.ndarray:
    """Integer class indices (as the store keeps labels) as a 1-D int64 array.

    Parameters
    ----------
    y : array-like of shape (n_samples,)
        Ints, bools or integer-valued floats.
    n_samples : int or None
        The number of feature rows ``y`` must match.
    name : str
        The name error messages give the labels.

    Returns
    -------
    numpy.ndarray of int64

    Raises
    ------
    DataValidationError
        Strings, fractional floats, NaN/inf or a wrong length.
    """
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


def check_multilabel(Y: Any, n_samples: int | None = None, name: str = "y") -> np.ndarray:
    """A multi-label target: an (n_samples, n_classes) array of 0/1 (or bool) values.

    Parameters
    ----------
    Y : array-like of shape (n_samples, n_classes)
        Binary indicators, one column per class.
    n_samples : int or None
        The number of feature rows ``Y`` must match.
    name : str
        The name error messages give the targets.

    Returns
    -------
    numpy.ndarray of uint8
        The indicators.
    """
    Y = np.asarray(Y)
    if Y.ndim != 2 or Y.shape[1] < 1:
        raise DataValidationError(f"{name} must be multi-label indicators of shape (n_samples, n_classes), "
                                  f"got shape {Y.shape}")
    if n_samples is not None and Y.shape[0] != n_samples:
        raise DataValidationError(f"{name} has {Y.shape[0]} rows, but X has {n_samples} samples; "
                                  "they must match one to one")
    if Y.dtype.kind not in "biuf" or not np.isin(Y, (0, 1)).all():
        raise DataValidationError(f"{name} must hold 0/1 indicators (multi-label targets); got dtype "
                                  f"{Y.dtype} with values such as {np.unique(Y)[:SHOWN].tolist()}")
    return Y.astype(np.uint8, copy=False)


def check_min_classes(classes: np.ndarray, minimum: int = 2, name: str = "y") -> np.ndarray:
    """Raise if fewer than ``minimum`` distinct classes are present.

    Parameters
    ----------
    classes : numpy.ndarray
        The distinct labels (``encode_labels``' first output) or any labels.
    minimum : int
        The least number of classes a classifier needs.
    name : str
        The name the message gives the labels.

    Returns
    -------
    numpy.ndarray
        ``np.unique(classes)``.
    """
    classes = np.unique(classes)
    if classes.size < minimum:
        shown = ", ".join(map(str, classes[:SHOWN]))
        raise DataValidationError(
            f"{name} has {classes.size} class(es) ({shown}), but at least {minimum} classes "
            "are required to fit a classifier"
        )
    return classes


def check_train_test(X_train: Any, y_train: Any, X_test: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate a train/test pair of class-index data.

    Parameters
    ----------
    X_train, X_test : array-like of shape (n, n_features)
        Features of both splits (finite, 2-D, the same width).
    y_train : array-like of shape (n_train,)
        Integer class indices, at least two classes.

    Returns
    -------
    tuple of numpy.ndarray
        (X_train, y_train as int64, X_test).
    """
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


def check_number(value: Any, name: str, low: float | None = None, high: float | None = None, *,
                 low_open: bool = False, high_open: bool = False, integer: bool = False) -> Any:
    """Refuse an estimator parameter that is not a finite number in its range.

    Parameters
    ----------
    value : Any
        The parameter's value.
    name : str
        Its name, for the message.
    low, high : float or None
        The range's ends (None: unbounded).
    low_open, high_open : bool
        Whether the ends are excluded.
    integer : bool
        Whether only integers are valid.

    Returns
    -------
    int or float
        ``value``.
    """
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    ok = isinstance(value, kinds) and not isinstance(value, (bool, np.bool_)) and np.isfinite(value)
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        parts = [f"{'>' if low_open else '>='} {low:g}" if low is not None else "",
                 f"{'<' if high_open else '<='} {high:g}" if high is not None else ""]
        rule = " and ".join(p for p in parts if p)
        kind = "an integer" if integer else "a finite number"
        raise ConfigError(f"The '{name}' parameter must be {kind}{' ' + rule if rule else ''}; got {value!r}")
    return value
