"""Feature arrays: pooled (n, d) rows and token (n, T, d) rows, checked before any work."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from sklearn.utils import check_array
from sklearn.utils.validation import validate_data

from pipeline.errors import DataValidationError

__all__ = ["FLOAT_DTYPES", "SHOWN", "as_cpu_tensor", "check_features", "check_finite", "check_tokens", "validate_features"]

#: How many offending positions an error message lists.
SHOWN = 5
#: Feature dtypes kept as they are; anything else (ints, bool, object) becomes float64.
FLOAT_DTYPES = (np.float64, np.float32, np.float16)
# Elements per block of the finiteness test: bounds its boolean temporary.
_FINITE_BLOCK_ELEMENTS = 1 << 22
# How the message names an offending position, by the array's number of axes.
_POSITION = {1: "index", 2: "(row, col)", 3: "(sample, token, feature)"}


def check_finite(X: np.ndarray, name: str = "X", row_offset: int = 0) -> np.ndarray:
    """Raise if ``X`` holds NaN or +-inf, saying how many and the first positions."""
    rows = max(1, _FINITE_BLOCK_ELEMENTS // max(1, int(np.prod(X.shape[1:]))))
    if all(np.isfinite(X[i:i + rows]).all() for i in range(0, max(len(X), 1), rows)):
        return X
    bad = ~np.isfinite(X)
    n_nan = int(np.isnan(X).sum())
    n_inf = int(bad.sum()) - n_nan
    positions = np.argwhere(bad)[:SHOWN]
    if X.ndim == 1:
        shown = ", ".join(str(p[0] + row_offset) for p in positions)
    else:
        shown = ", ".join("(" + ", ".join(map(str, (p[0] + row_offset, *p[1:]))) + ")" for p in positions)
    more = f" (first {SHOWN} of {n_nan + n_inf})" if n_nan + n_inf > SHOWN else ""
    where = _POSITION.get(X.ndim, "position")
    raise DataValidationError(
        f"Input {name} contains NaN or infinity: {n_nan} NaN and {n_inf} inf value(s) "
        f"among {X.size} entries of shape {X.shape}; at {where}{more}: {shown}. "
        "Features must be finite; fix or drop these rows upstream."
    )


def _float_dtype(X: Any) -> Any:
    return FLOAT_DTYPES if getattr(X, "dtype", None) in FLOAT_DTYPES else np.float64


def check_features(X: Any, name: str = "X") -> np.ndarray:
    """Return ``X`` as a finite 2-D float array without copying a float one."""
    try:
        X = check_array(X, dtype=_float_dtype(X), ensure_all_finite=False, input_name=name)
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    return check_finite(X, name)


def validate_features(estimator: Any, X: Any, *, reset: bool) -> np.ndarray:
    """``check_features`` for an estimator; also records or checks its input width."""
    try:
        X = validate_data(estimator, X, reset=reset, dtype=_float_dtype(X), ensure_all_finite=False)
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    return check_finite(X, "X")


def check_tokens(X: Any, name: str = "X") -> np.ndarray:
    """Token features as a finite (n, T, d) float array (float16/32/64 kept; others float32)."""
    # Token arrays are T times larger than pooled ones, so integers become float32 (not
    # float64 as in ``check_features``).
    X = np.asarray(X)
    if X.ndim != 3:
        raise DataValidationError(f"{name} must be token features of shape (n_samples, n_tokens, n_features), "
                                  f"got shape {X.shape}")
    if 0 in X.shape:
        raise DataValidationError(f"{name} has shape {X.shape}; every axis needs at least one entry")
    if X.dtype.kind in "biu":
        X = X.astype(np.float32)
    elif X.dtype.kind != "f":
        raise DataValidationError(f"{name} must hold real numbers, got dtype {X.dtype}")
    return check_finite(X, name)


def as_cpu_tensor(X: np.ndarray) -> Any:
    """A CPU tensor over ``X`` without a copy where numpy allows."""
    import torch  # deferred: only the torch probes need it; the checks above run without

    with warnings.catch_warnings():  # a read-only array (memmap) is only ever read here
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(X))
