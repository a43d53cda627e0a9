"""Inputs and outputs shared by the torch probes (MLP, attentive): devices, labels of any
sortable type, the validation split, setting checks, softmax outputs.

Settings are checked in ``fit`` (sklearn's convention: ``__init__`` only stores them), each
failing with a ConfigError that names the setting, the value and what is valid.
"""

from __future__ import annotations

import warnings
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
from sklearn.exceptions import DataConversionWarning
from sklearn.model_selection import StratifiedShuffleSplit
from sklearn.utils.multiclass import type_of_target

from pipeline.errors import ConfigError, DataValidationError

__all__ = [
    "DEVICE_CHOICES", "SoftmaxOutputMixin", "as_cpu_tensor", "check_fraction", "check_grid", "check_positive_int",
    "check_seed", "encode_labels", "resolve_device", "validation_split",
]

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:<index>")
def resolve_device(device: Any) -> torch.device:
    """The torch device named by ``device``.

    Parameters
    ----------
    device : str or torch.device
        ``"auto"`` (CUDA when available, else the CPU), ``"cpu"``, ``"cuda"`` or
        ``"cuda:<index>"``, or a ``torch.device``.

    Returns
    -------
    torch.device
        The device; a CUDA device only when CUDA is available and the index exists.

    Raises
    ------
    ConfigError
        For any other value, or CUDA asked on a machine without it.
    """
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise ConfigError(f"device={device!r} is not a device; valid choices: {', '.join(DEVICE_CHOICES)}")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"device={device!r} is not a device; valid choices: {', '.join(DEVICE_CHOICES)}") from None
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device={device!r}: only {', '.join(DEVICE_CHOICES)} are supported")
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device={device!r} asked for CUDA, but torch.cuda.is_available() is False; "
                              "use device='cpu' or 'auto'")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ConfigError(f"device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return resolved


def encode_labels(y: Any, n_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """Class labels of any sortable hashable type as (classes, integer codes).

    Parameters
    ----------
    y : array-like of shape (n_samples,)
        Class labels: integers, strings, booleans...; a column vector is flattened with a
        ``DataConversionWarning`` (sklearn's convention).
    n_samples : int
        Number of feature rows the labels must match.

    Returns
    -------
    classes : ndarray
        The sorted distinct labels (at least two).
    codes : ndarray of int64
        Index of each sample's label in ``classes``.

    Raises
    ------
    DataValidationError
        Continuous or multi-output targets, a length mismatch, labels that cannot be
        sorted together, or fewer than two classes.
    """
    if y is None:
        raise DataValidationError("This estimator requires y to be passed, but the target y is None")
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        warnings.warn("A column-vector y was passed when a 1d array was expected. Please change the shape of y "
                      "to (n_samples,), for example using ravel().", DataConversionWarning, stacklevel=3)
        y = y.ravel()
    if y.ndim != 1:
        raise DataValidationError(f"y must be 1-D class labels of shape (n_samples,), got shape {y.shape}")
    if y.shape[0] != n_samples:
        raise DataValidationError(f"y has {y.shape[0]} labels, but X has {n_samples} samples; they must match "
                                  "one to one")
    try:
        kind = type_of_target(y, input_name="y")
        classes, codes = np.unique(y, return_inverse=True)
    except (TypeError, ValueError) as exc:
        raise DataValidationError(f"Unusable class labels y: {exc}") from None
    if kind not in ("binary", "multiclass"):
        raise DataValidationError(f"Unknown label type: y is {kind!r}; a classifier needs discrete class labels")
    if classes.size < 2:
        raise DataValidationError(f"y has {classes.size} class(es) ({classes[:5].tolist()}), but at least 2 "
                                  "classes are required to fit a classifier")
    return classes, codes.astype(np.int64).ravel()


def validation_split(codes: np.ndarray, val_fraction: float, random_state: Any,
                     val_mask: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """Row indices (train, validation): the given ``val_mask`` or a seeded stratified draw.

    Parameters
    ----------
    codes : ndarray of int
        Class code per row.
    val_fraction : float
        Share of the rows drawn for validation when ``val_mask`` is None.
    random_state : int or None
        Seed of the stratified draw.
    val_mask : array-like of bool, optional
        Rows of a dataset-defined validation split.

    Returns
    -------
    train, val : ndarray of int
        Sorted row indices of the two parts.
    """
    if val_mask is not None:
        mask = np.asarray(val_mask)
        if mask.dtype != bool or mask.shape != codes.shape:
            raise DataValidationError(f"val_mask must be a boolean array of shape {codes.shape}, got "
                                      f"{mask.dtype} {mask.shape}")
        if mask.all() or not mask.any():
            raise DataValidationError(f"val_mask marks {int(mask.sum())} of {codes.size} rows; both the train "
                                      "and the validation part need rows")
        return np.flatnonzero(~mask), np.flatnonzero(mask)
    splitter = StratifiedShuffleSplit(1, test_size=val_fraction, random_state=random_state)
    try:
        train, val = next(splitter.split(np.zeros((codes.size, 1)), codes))
    except ValueError as exc:
        counts = np.bincount(codes)
        raise DataValidationError(
            f"Cannot draw a stratified {val_fraction:g} validation split from {codes.size} samples of "
            f"{counts.size} classes (smallest class: {counts.min()} samples): {exc}. Pass a dataset-defined "
            "val_mask or use more samples per class."
        ) from None
    return np.sort(train), np.sort(val)


def check_grid(values: Any, name: str, low_open: bool) -> np.ndarray:
    """A hyperparameter grid, checked.

    Parameters
    ----------
    values : sequence of float
    name : str
        The setting's name, for the error.
    low_open : bool
        Values must be > 0 (True) or >= 0 (False).

    Returns
    -------
    ndarray
        The distinct values, ascending.

    Raises
    ------
    ConfigError
        An empty grid, a non-number, NaN/inf or a value out of range.
    """
    try:
        grid = np.asarray(values, dtype=np.float64).ravel()
    except (TypeError, ValueError):
        grid = np.array([np.nan])
    ok = grid.size > 0 and np.all(np.isfinite(grid)) and np.all(grid > 0 if low_open else grid >= 0)
    if not ok:
        rule = "> 0" if low_open else ">= 0"
        raise ConfigError(f"{name} must be a non-empty list of finite numbers {rule}, got {values!r}")
    return np.unique(grid)


def check_positive_int(value: Any, name: str) -> int:
    """``value`` as an int >= 1, or a ConfigError naming it.

    Parameters
    ----------
    value : object
    name : str
        The setting's name, for the error.

    Returns
    -------
    int
    """
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_fraction(value: Any, name: str) -> float:
    """``value`` as a float strictly between 0 and 1, or a ConfigError naming it.

    Parameters
    ----------
    value : object
    name : str
        The setting's name, for the error.

    Returns
    -------
    float
    """
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < value < 1:
        raise ConfigError(f"{name} must be a number in (0, 1), got {value!r}")
    return float(value)


def check_seed(value: Any) -> int:
    """``value`` as a seed (an integer in [0, 2**32)), or a ConfigError naming it.

    Parameters
    ----------
    value : object

    Returns
    -------
    int
    """
    if isinstance(value, bool) or not isinstance(value, Integral) or not 0 <= value < 2**32:
        raise ConfigError(f"random_state must be an integer in [0, 2**32), got {value!r}")
    return int(value)


class SoftmaxOutputMixin:
    """decision_function / predict_proba / predict of a classifier from its ``_logits(X)`` (n, K)."""

    def decision_function(self, X: Any) -> np.ndarray:
        """Class scores.

        Parameters
        ----------
        X : array-like
            Features, as in ``fit``.

        Returns
        -------
        ndarray
            Logits (n, K); z_1 - z_0 (n,) for two classes.
        """
        Z = self._logits(X)
        return Z[:, 1] - Z[:, 0] if self.classes_.size == 2 else Z

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities.

        Parameters
        ----------
        X : array-like
            Features, as in ``fit``.

        Returns
        -------
        ndarray of shape (n, K)
            Softmax of the logits; columns in ``classes_`` order.
        """
        Z = self._logits(X).astype(np.float64)
        Z -= Z.max(axis=1, keepdims=True)
        P = np.exp(Z)
        return P / P.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """Predicted labels.

        Parameters
        ----------
        X : array-like
            Features, as in ``fit``.

        Returns
        -------
        ndarray of shape (n,)
            The most probable class label (the first in ``classes_`` on exact ties).
        """
        Z = self._logits(X)  # first: it raises NotFittedError before classes_ is read
        return self.classes_[np.argmax(Z, axis=1)]


def as_cpu_tensor(X: np.ndarray) -> torch.Tensor:
    """A CPU tensor over ``X`` without a copy where numpy allows.

    Parameters
    ----------
    X : ndarray
        Features; float16 stays float16 (batches are cast to float32 on their way to
        the device).

    Returns
    -------
    Tensor
    """
    with warnings.catch_warnings():  # a read-only array (memmap) is only ever read here
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.ascontiguousarray(X))
