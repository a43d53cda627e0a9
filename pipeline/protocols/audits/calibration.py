"""Expected calibration error and temperature scaling (Guo et al. 2017; Ericsson et al. 4.7)."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from scipy import optimize
from scipy.special import log_softmax, softmax

from pipeline.errors import DataValidationError
from pipeline.protocols.inputs.features import check_features
from pipeline.protocols.inputs.labels import check_class_indices

#: A callable returning an iterable of (logits (b, K), class indices (b,)) torch blocks.
LogitBlocks = Callable[[], Iterable[tuple[torch.Tensor, torch.Tensor]]]

DEFAULT_N_BINS = 15
DEFAULT_T_BOUNDS = (1e-3, 1e3)
_PROB_SUM_TOL = 1e-3

__all__ = [
    "CalibrationReport",
    "apply_temperature",
    "calibration_report",
    "calibration_report_blocks",
    "expected_calibration_error",
    "fit_temperature",
    "negative_log_likelihood",
]


def _check_n_bins(n_bins: int) -> int:
    if isinstance(n_bins, bool) or not isinstance(n_bins, (int, np.integer)) or n_bins < 1:
        raise DataValidationError(f"n_bins must be a positive integer, got {n_bins!r}")
    return int(n_bins)


def _check_logits_labels(logits: object, y: object, name: str) -> tuple[np.ndarray, np.ndarray]:
    z = np.asarray(check_features(logits, name), dtype=np.float64)
    labels = check_class_indices(y, n_samples=z.shape[0], name=f"labels of {name}")
    _check_label_range(labels, z.shape[1], name)
    return z, labels


def _check_label_range(labels: np.ndarray, n_classes: int, name: str) -> None:
    bad = np.flatnonzero((labels < 0) | (labels >= n_classes))
    if bad.size:
        raise DataValidationError(
            f"{name} has {n_classes} class columns, so labels must lie in [0, {n_classes - 1}]; "
            f"{bad.size} label(s) do not, e.g. {labels[bad[:5]].tolist()} at position(s) {bad[:5].tolist()}"
        )


def _bin_index(confidences: np.ndarray, n_bins: int) -> np.ndarray:
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    # searchsorted 'left' on the inner edges puts a value equal to an edge in the bin
    # below it: bins are (lo, hi], and 0 lands in bin 0.
    return np.searchsorted(edges[1:-1], confidences, side="left")


def expected_calibration_error(
    probs_or_confidences: object,
    y_true: object,
    n_bins: int = DEFAULT_N_BINS,
) -> float:
    """ECE with ``n_bins`` equal-width, right-closed confidence bins (see the module doc).

    Either ``probs_or_confidences`` is an (n, K) array of class probabilities (rows summing
    to 1) and ``y_true`` the class labels, or it is a 1-D array of the confidences of the
    predicted classes and ``y_true`` says whether each prediction was correct (bool or 0/1).

    Parameters
    ----------
    probs_or_confidences : array-like of shape (n, K) or (n,)
    y_true : array-like of shape (n,)
        Class indices, or correctness flags for 1-D confidences.
    n_bins : int

    Returns
    -------
    float
    """
    n_bins = _check_n_bins(n_bins)
    arr = np.asarray(probs_or_confidences, dtype=np.float64)
    if arr.ndim == 2:
        probs = np.asarray(check_features(arr, "probs"), dtype=np.float64)
        labels = check_class_indices(y_true, n_samples=probs.shape[0], name="y_true")
        _check_label_range(labels, probs.shape[1], "probs")
        sums = probs.sum(axis=1)
        off = np.flatnonzero(np.abs(sums - 1.0) > _PROB_SUM_TOL)
        if off.size:
            raise DataValidationError(
                f"probs rows must sum to 1 (within {_PROB_SUM_TOL:g}); {off.size} row(s) do not, "
                f"e.g. row {off[0]} sums to {sums[off[0]]:.6g}. Pass softmax probabilities, not logits "
                "(apply_temperature(logits, 1.0) gives them)"
            )
        _check_unit_interval(probs, "probs")
        confidences = probs.max(axis=1)
        correct = probs.argmax(axis=1) == labels
    elif arr.ndim == 1:
        confidences = arr
        bad = np.flatnonzero(~np.isfinite(confidences))
        if bad.size:
            raise DataValidationError(
                f"confidences have {bad.size} non-finite value(s) at position(s) {bad[:10].tolist()}"
            )
        _check_unit_interval(confidences, "confidences")
        correct_arr = np.asarray(y_true)
        if correct_arr.shape != confidences.shape:
            raise DataValidationError(
                f"with 1-D confidences, y_true must say per prediction whether it was correct: "
                f"expected shape {confidences.shape}, got {correct_arr.shape}"
            )
        if correct_arr.dtype != bool:
            vals = np.unique(correct_arr)
            if not np.all(np.isin(vals, (0, 1))):
                raise DataValidationError(
                    "with 1-D confidences, y_true must be correctness flags (bool or 0/1), "
                    f"got values {vals[:10].tolist()}; pass (n, K) probabilities to give class labels"
                )
        correct = correct_arr.astype(bool)
    else:
        raise DataValidationError(
            f"probs_or_confidences must be (n, K) probabilities or (n,) confidences, got shape {arr.shape}"
        )
    n = confidences.size
    if n == 0:
        raise DataValidationError("expected_calibration_error needs at least one prediction, got 0")
    bins = _bin_index(confidences, n_bins)
    conf_sum = np.bincount(bins, weights=confidences, minlength=n_bins)
    acc_sum = np.bincount(bins, weights=correct.astype(np.float64), minlength=n_bins)
    # sum_b (n_b / n) |acc_b - conf_b| = sum_b |acc_sum_b - conf_sum_b| / n
    return float(np.abs(acc_sum - conf_sum).sum() / n)


def _check_unit_interval(values: np.ndarray, name: str) -> None:
    out = np.flatnonzero((values.reshape(-1) < 0.0) | (values.reshape(-1) > 1.0))
    if out.size:
        raise DataValidationError(
            f"{name} must lie in [0, 1]; {out.size} value(s) do not, e.g. {values.reshape(-1)[out[0]]:g} "
            f"at flat position {out[0]}"
        )


def _check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not np.isfinite(t) or t <= 0.0:
        raise DataValidationError(f"temperature must be a finite number > 0, got {temperature!r}")
    return t


def apply_temperature(logits: object, temperature: float) -> np.ndarray:
    """softmax(logits / temperature) row-wise, as float64 probabilities.

    Parameters
    ----------
    logits : array-like of shape (n, K)
    temperature : float
        T > 0.

    Returns
    -------
    numpy.ndarray of shape (n, K)
    """
    t = _check_temperature(temperature)
    z = np.asarray(check_features(logits, "logits"), dtype=np.float64)
    return softmax(z / t, axis=1)


def negative_log_likelihood(logits: object, y: object, temperature: float = 1.0) -> float:
    """Mean cross-entropy of softmax(logits / temperature) against the labels."""
    t = _check_temperature(temperature)
    z, labels = _check_logits_labels(logits, y, "logits")
    return _nll(z / t, labels)


def _nll(z: np.ndarray, labels: np.ndarray) -> float:
    return float(-np.mean(log_softmax(z, axis=1)[np.arange(z.shape[0]), labels]))


def fit_temperature(
    logits_val: object,
    y_val: object,
    bounds: tuple[float, float] = DEFAULT_T_BOUNDS,
) -> float:
    """The T in ``bounds`` minimising the mean NLL of softmax(logits_val / T) on y_val.

    Solved exactly (see the module doc). If the minimum lies outside ``bounds`` (e.g. every
    validation prediction is right and the NLL keeps falling as T -> 0), the nearest bound
    is returned with a RuntimeWarning saying so.

    Parameters
    ----------
    logits_val : array-like of shape (n, K)
    y_val : array-like of shape (n,)
        Class indices.
    bounds : tuple of float
        (low, high) for T.

    Returns
    -------
    float
        T.
    """
    t, at_bound = _fit_temperature(logits_val, y_val, bounds)
    if at_bound:
        warnings.warn(_bound_message(t, bounds), RuntimeWarning, stacklevel=2)
    return t


def _bound_message(t: float, bounds: tuple[float, float]) -> str:
    if t == float(bounds[0]):
        return (
            f"the NLL-optimal temperature is at or below the lower bound {t:g} (the validation "
            f"logits are separable); returning {t:g}"
        )
    return f"the NLL-optimal temperature is at or above the upper bound {t:g}; returning {t:g}"


def _check_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    if len(bounds) != 2:
        raise DataValidationError(f"bounds must be (low, high), got {bounds!r}")
    lo, hi = float(bounds[0]), float(bounds[1])
    if not (np.isfinite(lo) and np.isfinite(hi) and 0.0 < lo < hi):
        raise DataValidationError(f"bounds must be two finite numbers 0 < low < high, got {bounds!r}")
    return lo, hi


def _check_val_blocks(blocks: LogitBlocks) -> int:
    """Number of classes of the validation logits; refuse ones that cannot fix T."""
    width, varies = None, False
    for Z, y in blocks():
        width = Z.shape[1]
        bad = torch.nonzero((y < 0) | (y >= width)).flatten()
        if bad.numel():
            raise DataValidationError(
                f"logits_val has {width} class columns, so labels must lie in [0, {width - 1}]; "
                f"{bad.numel()} label(s) do not, e.g. {y[bad[:5]].tolist()}")
        varies = varies or bool((Z.max(dim=1).values > Z.min(dim=1).values).any())
    if width is None or width < 2:
        raise DataValidationError(f"temperature scaling needs at least 2 classes, logits_val has {width}")
    if not varies:
        raise DataValidationError(
            "logits_val are constant within every row: the likelihood does not depend on T"
        )
    return width


def _fit_temperature_blocks(blocks: LogitBlocks, bounds: tuple[float, float]) -> tuple[float, bool]:
    """(T, whether T is a bound because the optimum lies outside ``bounds``)."""
    lo, hi = _check_bounds(bounds)
    _check_val_blocks(blocks)

    def grad_beta(beta: float) -> float:
        # d/d beta of mean(logsumexp(beta z) - beta z_y) = mean(E_softmax(beta z)[z] - z_y),
        # increasing in beta (the NLL is convex in beta = 1 / T); one pass over the blocks.
        total, n = 0.0, 0
        for Z, y in blocks():
            P = torch.softmax(beta * Z, dim=1)
            total += float(((P * Z).sum(dim=1) - Z.gather(1, y[:, None])[:, 0]).sum())
            n += y.shape[0]
        return total / n

    b_lo, b_hi = 1.0 / hi, 1.0 / lo
    if grad_beta(b_lo) >= 0.0:
        return hi, True
    if grad_beta(b_hi) <= 0.0:
        return lo, True
    beta = optimize.brentq(grad_beta, b_lo, b_hi, xtol=1e-14, rtol=4 * np.finfo(float).eps, maxiter=500)
    return float(1.0 / beta), False


def _array_blocks(logits: Any, y: Any, name: str) -> LogitBlocks:
    """One block of checked array logits and labels, as ``LogitBlocks``."""
    z, labels = _check_logits_labels(logits, y, name)
    Z, Y = torch.from_numpy(z), torch.from_numpy(labels)
    return lambda: [(Z, Y)]


def _fit_temperature(logits_val: object, y_val: object, bounds: tuple[float, float]) -> tuple[float, bool]:
    _check_bounds(bounds)
    return _fit_temperature_blocks(_array_blocks(logits_val, y_val, "logits_val"), bounds)


@dataclass(frozen=True)
class CalibrationReport:
    """Test-split calibration before and after temperature scaling fitted on validation."""

    temperature: float
    ece_before: float
    ece_after: float
    nll_before: float
    nll_after: float
    accuracy: float
    n_bins: int
    temperature_at_bound: bool


def _test_sums(blocks: LogitBlocks, temperature: float, n_bins: int) -> tuple[float, float, float]:
    """(ECE, mean NLL, accuracy) of softmax(logits / T) over the test blocks."""
    edges = None
    conf_sum = acc_sum = None
    nll, hits, n = 0.0, 0, 0
    for Z, y in blocks():
        if edges is None:
            edges = torch.linspace(0.0, 1.0, n_bins + 1, dtype=torch.float64, device=Z.device)[1:-1]
            conf_sum = torch.zeros(n_bins, dtype=torch.float64, device=Z.device)
            acc_sum = torch.zeros_like(conf_sum)
        Zt = Z.to(torch.float64) / temperature
        P = torch.softmax(Zt, dim=1)
        conf, pred = P.max(dim=1)
        correct = (pred == y).to(torch.float64)
        bins = torch.bucketize(conf, edges, right=False)  # bins are (lo, hi]; 0 lands in bin 0
        conf_sum.index_add_(0, bins, conf)
        acc_sum.index_add_(0, bins, correct)
        nll += float((torch.logsumexp(Zt, dim=1) - Zt.gather(1, y[:, None])[:, 0]).sum())
        hits += int(correct.sum())
        n += y.shape[0]
    if n == 0:
        raise DataValidationError("calibration needs at least one test prediction, got 0")
    return float((acc_sum - conf_sum).abs().sum()) / n, nll / n, hits / n


def calibration_report_blocks(val_blocks: LogitBlocks, test_blocks: LogitBlocks, n_bins: int = DEFAULT_N_BINS,
                              bounds: tuple[float, float] = DEFAULT_T_BOUNDS) -> CalibrationReport:
    """``calibration_report`` over logit blocks (never an (n x K) array of a whole split)."""
    n_bins = _check_n_bins(n_bins)
    t, at_bound = _fit_temperature_blocks(val_blocks, bounds)
    ece_before, nll_before, accuracy = _test_sums(test_blocks, 1.0, n_bins)
    ece_after, nll_after, _ = _test_sums(test_blocks, t, n_bins)
    return CalibrationReport(temperature=t, ece_before=ece_before, ece_after=ece_after, nll_before=nll_before,
                             nll_after=nll_after, accuracy=accuracy, n_bins=n_bins, temperature_at_bound=at_bound)


def calibration_report(
    logits_val: object,
    y_val: object,
    logits_test: object,
    y_test: object,
    n_bins: int = DEFAULT_N_BINS,
    bounds: tuple[float, float] = DEFAULT_T_BOUNDS,
) -> CalibrationReport:
    """Fit T on the validation logits; report test ECE and NLL at T = 1 and at the fitted T.

    An optimum outside ``bounds`` is not warned about here but recorded as
    ``temperature_at_bound`` in the report.

    Parameters
    ----------
    logits_val : array-like of shape (n_val, K)
    y_val : array-like of shape (n_val,)
    logits_test : array-like of shape (n_test, K)
    y_test : array-like of shape (n_test,)
    n_bins : int
    bounds : tuple of float

    Returns
    -------
    CalibrationReport
    """
    n_bins = _check_n_bins(n_bins)
    test = _array_blocks(logits_test, y_test, "logits_test")
    z_val = np.asarray(check_features(logits_val, "logits_val"))
    width = next(iter(test()))[0].shape[1]
    if z_val.shape[1] != width:
        raise DataValidationError(
            f"logits_val has {z_val.shape[1]} classes but logits_test has {width}; they must match"
        )
    _check_bounds(bounds)
    return calibration_report_blocks(_array_blocks(logits_val, y_val, "logits_val"), test, n_bins, bounds)
