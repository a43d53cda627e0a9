"""What a protocol keeps of one cell so that two encoders can later be compared, example by
example: its evidence."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.episodic.fewshot import EPISODE_SAMPLER_VERSION

__all__ = ["EVIDENCE_KINDS", "Evidence", "class_evidence", "class_indices", "episodes_fingerprint", "evidence_sha256",
           "float16_scores", "headline_rows", "labels_fingerprint", "prediction_dtype", "values_fingerprint"]

EVIDENCE_KINDS = ("predictions", "scores", "episodes", "fits", "pixel_counts", "values")
#: Largest class index an int16 prediction holds.
INT16_CLASSES = int(np.iinfo(np.int16).max)
_FLOAT16_MAX = float(np.finfo(np.float16).max)


def prediction_dtype(n_classes: int) -> np.dtype:
    """int16 when every class index fits, else int32."""
    return np.dtype(np.int16) if int(n_classes) <= INT16_CLASSES + 1 else np.dtype(np.int32)


def float16_scores(scores: Any) -> np.ndarray:
    """Scores as stored: float16, with values beyond float16's range clipped to it."""
    # Clipping keeps the order of every score within +-65504 (a probe's logits or ridge
    # outputs); larger magnitudes would become infinite and tie.
    arr = np.asarray(scores, dtype=np.float64)
    if not np.all(np.isfinite(arr)):
        raise DataValidationError("multi-label scores contain NaN or inf; nothing can be stored or ranked")
    return np.clip(arr, -_FLOAT16_MAX, _FLOAT16_MAX).astype(np.float16)


def labels_fingerprint(y_true: object) -> str:
    """SHA-256 of a label array: its shape and its values as little-endian int64.

    Integer and boolean arrays with the same values give the same fingerprint whatever
    their dtype (int16 class indices hash like int64 ones); a multi-label indicator matrix
    hashes with its (examples, classes) shape.

    Parameters
    ----------
    y_true : array-like of int or bool
        Class indices (n,) or a 0/1 indicator matrix (n, n_classes).

    Returns
    -------
    str
        Hex digest.
    """
    y = np.asarray(y_true)
    if not (y.dtype == bool or np.issubdtype(y.dtype, np.integer)):
        raise DataValidationError(f"labels must be integers or booleans, got dtype {y.dtype}")
    digest = hashlib.sha256(f"labels\x00{y.shape}\n".encode())
    digest.update(np.ascontiguousarray(y, dtype="<i8").tobytes())
    return digest.hexdigest()


def episodes_fingerprint(
    labels: object, seed: int, n_way: int, n_shot: int, n_query: int, n_episodes: int
) -> str:
    """SHA-256 identifying a set of few-shot episodes.

    Parameters
    ----------
    labels : array-like of int, shape (n,)
        Label of each image of the pool the episodes are drawn from, in pool order.
    seed : int
        The sampler's seed.
    n_way, n_shot, n_query, n_episodes : int
        The episode shape and count.

    Returns
    -------
    str
        Hex digest over the sampler version, these settings and :func:`labels_fingerprint`.
    """
    settings = {
        "sampler": EPISODE_SAMPLER_VERSION,
        "seed": int(seed),
        "n_way": int(n_way),
        "n_shot": int(n_shot),
        "n_query": int(n_query),
        "n_episodes": int(n_episodes),
        "labels": labels_fingerprint(labels),
    }
    return hashlib.sha256(("episodes\x00" + json.dumps(settings, sort_keys=True)).encode()).hexdigest()


def values_fingerprint(*label_arrays: object) -> str:
    """SHA-256 of what decides per-unit ``values`` evidence: several label arrays in order
    (a retrieval's query labels, then its gallery's)."""
    parts = [labels_fingerprint(y) for y in label_arrays]
    return hashlib.sha256(("values\x00" + "\x00".join(parts)).encode()).hexdigest()


def evidence_sha256(values: object) -> str:
    """SHA-256 of a stored evidence array: its dtype, its shape and its bytes (little-endian).

    Recomputed from the array read back, it tells whether stored predictions, scores or
    episode accuracies are still the ones a record was made from.

    Parameters
    ----------
    values : numpy.ndarray
        The array as stored (its dtype is part of the digest).

    Returns
    -------
    str
        Hex digest.
    """
    arr = np.asarray(values)
    little = arr.dtype.newbyteorder("<")
    digest = hashlib.sha256(f"evidence\x00{little.str}\x00{arr.shape}\n".encode())
    digest.update(np.ascontiguousarray(arr, dtype=little).tobytes())
    return digest.hexdigest()

def _predictions(values: Any, n_classes: int, n_test: int, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.shape[-1:] != (n_test,) or arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise DataValidationError(f"{what} must be integer class indices for the {n_test} test examples, "
                                  f"got {arr.dtype} {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() >= max(int(n_classes), 1)):
        raise DataValidationError(f"{what} hold class indices outside 0..{int(n_classes) - 1}")
    return arr.astype(prediction_dtype(n_classes))


@dataclass(frozen=True)
class Evidence:
    """One cell's per-example (or per-episode) outputs and what they can be paired with."""

    kind: str
    values: np.ndarray = field(repr=False)
    fingerprint: str
    metric: str
    fits: tuple[str, ...] = ()
    headline: str | None = None

    @property
    def fingerprint_of(self) -> str:
        """``episodes`` for few-shot evidence, ``targets`` for pixel counts, ``labels``
        otherwise (the record's key)."""
        return {"episodes": "episodes", "pixel_counts": "targets", "values": "values"}.get(self.kind, "labels")

    def record(self, key: str, sha256: str) -> dict[str, Any]:
        """The ledger record's ``evidence`` entry once the array is stored at ``key``."""
        out: dict[str, Any] = {"key": key, "kind": self.kind, "sha256": sha256,
                               f"{self.fingerprint_of}_fingerprint": self.fingerprint, "metric": self.metric,
                               "shape": list(self.values.shape), "dtype": str(self.values.dtype)}
        if self.kind == "fits":
            out.update(fits=list(self.fits), headline=self.headline)
        return out

    @classmethod
    def of_predictions(cls, y_test: Any, predictions: Any, n_classes: int, mean_per_class: bool = False) -> Evidence:
        """Evidence of a single-label classifier: its test predictions."""
        y = np.asarray(y_test)
        values = _predictions(predictions, n_classes, y.shape[0], "predictions")
        if values.ndim != 1:
            raise DataValidationError(f"predictions must be 1-D, got shape {values.shape}")
        return cls("predictions", values, labels_fingerprint(y), "mean_per_class" if mean_per_class else "top1")

    @classmethod
    def of_scores(cls, y_test: Any, scores: Any) -> Evidence:
        """Evidence of a multi-label cell: per-class scores, as float16."""
        y = np.asarray(y_test)
        values = np.asarray(scores)
        if values.dtype != np.float16:
            values = float16_scores(values)
        if values.shape != y.shape:
            raise DataValidationError(f"scores have shape {values.shape} but the test labels {y.shape}")
        return cls("scores", values, labels_fingerprint(y), "mAP")

    @classmethod
    def of_episodes(cls, pool_labels: Any, accuracies: Any, *, seed: int, n_way: int, n_shot: int,
                    n_query: int) -> Evidence:
        """Evidence of a few-shot cell: each episode's accuracy."""
        values = np.asarray(accuracies, dtype=np.float64)
        if values.ndim != 1 or values.size == 0:
            raise DataValidationError(f"episode accuracies must be a non-empty 1-D array, got shape {values.shape}")
        fingerprint = episodes_fingerprint(pool_labels, seed, n_way, n_shot, n_query, values.size)
        return cls("episodes", values, fingerprint, "episode_accuracy")

    @classmethod
    def of_fits(cls, y_test: Any, fits: Sequence[tuple[Any, int, Any]], n_classes: int, headline: Any) -> Evidence:
        """Evidence of a low-shot cell: the test predictions of every fit."""
        y = np.asarray(y_test)
        if not fits:
            raise DataValidationError("a low-shot cell without any fit has no evidence")
        names = tuple(f"{shots}/{rep}" for shots, rep, _ in fits)
        if str(headline) not in {str(shots) for shots, _, _ in fits}:
            raise DataValidationError(f"headline N {headline!r} is not among the fits {names}")
        values = _predictions(np.stack([np.asarray(p) for _, _, p in fits]), n_classes, y.shape[0], "fit predictions")
        return cls("fits", values, labels_fingerprint(y), "top1", names, str(headline))

    @classmethod
    def of_pixel_counts(cls, y_test: Any, counts: Any, metric: str) -> Evidence:
        """Evidence of a dense cell: per-image pixel counts (see the module doc)."""
        values = np.asarray(counts)
        y = np.asarray(y_test)
        if values.shape[:1] != y.shape[:1] or values.dtype.kind not in "iu" or values.ndim < 2:
            raise DataValidationError(f"pixel counts must be integers, one row per test image ({y.shape[0]}), got "
                                      f"{values.dtype} {values.shape}")
        return cls("pixel_counts", values.astype(np.int64), evidence_sha256(y), metric)


    @classmethod
    def of_values(cls, values: Any, fingerprint: str, metric: str) -> Evidence:
        """Evidence of one value per paired unit (see the module doc), float64."""
        arr = np.asarray(values, dtype=np.float64)
        if arr.ndim != 1 or arr.size == 0 or np.isinf(arr).any():
            raise DataValidationError(f"per-unit values must be a non-empty 1-D array without inf, got {arr.shape}")
        return cls("values", arr, fingerprint, metric)


def headline_rows(fits: Sequence[str], headline: str) -> np.ndarray:
    """Rows of low-shot evidence that hold the fits of the headline N."""
    rows = [i for i, name in enumerate(fits) if str(name).split("/")[0] == str(headline)]
    if not rows:
        raise DataValidationError(f"no fit of N = {headline!r} among {list(fits)[:10]}")
    return np.array(rows, dtype=np.int64)


def class_evidence(data: Any, predictions: Any) -> Evidence | None:
    """The predictions as evidence when the labels are class indices 0 .. n_classes - 1 (as
    stored); None for other labels (a protocol called directly on names), which no stored
    cell has."""
    pred, y = np.asarray(predictions), np.asarray(data.y_test)
    if not class_indices(y, data.n_classes) or not class_indices(pred, data.n_classes):
        return None
    return Evidence.of_predictions(y, pred, data.n_classes, data.mean_per_class)


def class_indices(values: Any, n_classes: int) -> bool:
    """Whether ``values`` are integer class indices in [0, n_classes)."""
    values = np.asarray(values)
    integral = values.dtype != bool and np.issubdtype(values.dtype, np.integer)
    return bool(integral and (values.size == 0 or (values.min() >= 0 and values.max() < max(n_classes, 1))))
