"""What a protocol keeps of one cell so that two encoders can later be compared, example by
example: its evidence.

- ``predictions``: the predicted class of every test example, in the test split's stored
  order (int16, or int32 beyond 32,767 classes);
- ``scores``: multi-label per-class scores of every test example (float16; the cell's mAP
  is computed from these very float16 values, so a comparison and the record agree);
- ``episodes``: few-shot accuracy of every episode (float64: a few kilobytes, and their
  mean is exactly the cell's score);
- ``fits``: low-shot predictions of every fit, one row per (N, repetition) (int16/int32);
- ``pixel_counts``: a dense cell's per-test-image counts (int64): true positives, false
  positives and false negatives per class (segmentation), or valid pixels and pixels
  within each angle (normals); summed over images they give the cell's metric exactly.

The evidence carries the fingerprint that says what it can be paired with: the test
labels' (classification, low-shot: same examples in the same order) or the episodes'
(few-shot: same sampler, seed, labels and episode shape) or the test targets' (dense:
the SHA-256 of the per-pixel targets): ``labels_fingerprint``, ``episodes_fingerprint``
and ``evidence_sha256`` (a stored array's digest) make them. A protocol that keeps none
(the invariance audit) returns ``evidence=None``; a registered protocol may do the same
and its cells are then left out of comparisons.
"""

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
           "float16_scores", "headline_rows", "labels_fingerprint", "prediction_dtype"]

EVIDENCE_KINDS = ("predictions", "scores", "episodes", "fits", "pixel_counts")
#: Largest class index an int16 prediction holds.
INT16_CLASSES = int(np.iinfo(np.int16).max)
_FLOAT16_MAX = float(np.finfo(np.float16).max)


def prediction_dtype(n_classes: int) -> np.dtype:
    """int16 when every class index fits, else int32.

    Parameters
    ----------
    n_classes : int
        Number of classes (indices 0 .. n_classes - 1).

    Returns
    -------
    numpy.dtype
    """
    return np.dtype(np.int16) if int(n_classes) <= INT16_CLASSES + 1 else np.dtype(np.int32)


def float16_scores(scores: Any) -> np.ndarray:
    """Scores as stored: float16, with values beyond float16's range clipped to it.

    Clipping keeps the order of every score within +-65504 (a probe's logits or ridge
    outputs); larger magnitudes would become infinite and tie.

    Parameters
    ----------
    scores : array-like of float

    Returns
    -------
    numpy.ndarray of float16
    """
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
    """One cell's per-example (or per-episode) outputs and what they can be paired with.

    Parameters
    ----------
    kind : str
        One of ``EVIDENCE_KINDS``.
    values : numpy.ndarray
        The array to store (its dtype is the stored dtype).
    fingerprint : str
        ``labels_fingerprint`` of the test labels, ``episodes_fingerprint``, or the test
        targets' ``evidence_sha256`` (pixel counts).
    metric : str
        What the cell's comparison tests: ``top1``, ``mean_per_class``, ``mAP``,
        ``episode_accuracy``, ``top1`` over fits, or a dense metric (``miou``,
        ``within_11_25``).
    fits : tuple of str
        For ``fits``: each row's ``"<N>/<repetition>"``.
    headline : str or None
        For ``fits``: the N the cell's score reports.
    """

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
        return {"episodes": "episodes", "pixel_counts": "targets"}.get(self.kind, "labels")

    def record(self, key: str, sha256: str) -> dict[str, Any]:
        """The ledger record's ``evidence`` entry once the array is stored at ``key``.

        Parameters
        ----------
        key : str
            The stored array's key.
        sha256 : str
            ``evidence_sha256`` of the stored array.

        Returns
        -------
        dict
            ``key``, ``kind``, ``sha256``, ``labels_fingerprint``,
            ``episodes_fingerprint`` or ``targets_fingerprint``, ``metric``, ``shape``, ``dtype`` (and ``fits``,
            ``headline`` for low-shot).
        """
        out: dict[str, Any] = {"key": key, "kind": self.kind, "sha256": sha256,
                               f"{self.fingerprint_of}_fingerprint": self.fingerprint, "metric": self.metric,
                               "shape": list(self.values.shape), "dtype": str(self.values.dtype)}
        if self.kind == "fits":
            out.update(fits=list(self.fits), headline=self.headline)
        return out

    @classmethod
    def of_predictions(cls, y_test: Any, predictions: Any, n_classes: int, mean_per_class: bool = False) -> Evidence:
        """Evidence of a single-label classifier: its test predictions.

        Parameters
        ----------
        y_test : array-like of int, shape (n,)
            The test labels, in stored order.
        predictions : array-like of int, shape (n,)
            The predicted class of each test example.
        n_classes : int
            Number of classes (sets the stored dtype).
        mean_per_class : bool
            The cell's score is the mean per-class accuracy (else top-1).

        Returns
        -------
        Evidence
        """
        y = np.asarray(y_test)
        values = _predictions(predictions, n_classes, y.shape[0], "predictions")
        if values.ndim != 1:
            raise DataValidationError(f"predictions must be 1-D, got shape {values.shape}")
        return cls("predictions", values, labels_fingerprint(y), "mean_per_class" if mean_per_class else "top1")

    @classmethod
    def of_scores(cls, y_test: Any, scores: Any) -> Evidence:
        """Evidence of a multi-label cell: per-class scores, as float16.

        Parameters
        ----------
        y_test : array-like of int, shape (n, C)
            Test labels: 1 present, 0 absent, -1 difficult.
        scores : array-like of float, shape (n, C)
            Per-class scores; store :func:`float16_scores` of them and score the cell on
            those same values.

        Returns
        -------
        Evidence
        """
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
        """Evidence of a few-shot cell: each episode's accuracy.

        Parameters
        ----------
        pool_labels : array-like of int, shape (n,)
            The labels of the pool the episodes were drawn from, in pool order.
        accuracies : array-like of float, shape (n_episodes,)
            Accuracy of each episode.
        seed, n_way, n_shot, n_query : int
            The sampler's settings.

        Returns
        -------
        Evidence
        """
        values = np.asarray(accuracies, dtype=np.float64)
        if values.ndim != 1 or values.size == 0:
            raise DataValidationError(f"episode accuracies must be a non-empty 1-D array, got shape {values.shape}")
        fingerprint = episodes_fingerprint(pool_labels, seed, n_way, n_shot, n_query, values.size)
        return cls("episodes", values, fingerprint, "episode_accuracy")

    @classmethod
    def of_fits(cls, y_test: Any, fits: Sequence[tuple[Any, int, Any]], n_classes: int, headline: Any) -> Evidence:
        """Evidence of a low-shot cell: the test predictions of every fit.

        Parameters
        ----------
        y_test : array-like of int, shape (n,)
            The test labels, in stored order.
        fits : sequence of (N, repetition, predictions)
            Every fit, in the order run.
        n_classes : int
            Number of classes.
        headline : int or str
            The N whose accuracy is the cell's score.

        Returns
        -------
        Evidence
        """
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
        """Evidence of a dense cell: per-image pixel counts (see the module doc).

        Parameters
        ----------
        y_test : array-like
            The test targets (their SHA-256 is what the evidence pairs on).
        counts : array-like of int, shape (n, K, 3) or (n, 4)
            Per-image counts, one row per test image in stored order.
        metric : str
            The cell's headline metric, computed from the summed counts.

        Returns
        -------
        Evidence
        """
        values = np.asarray(counts)
        y = np.asarray(y_test)
        if values.shape[:1] != y.shape[:1] or values.dtype.kind not in "iu" or values.ndim < 2:
            raise DataValidationError(f"pixel counts must be integers, one row per test image ({y.shape[0]}), got "
                                      f"{values.dtype} {values.shape}")
        return cls("pixel_counts", values.astype(np.int64), evidence_sha256(y), metric)


def headline_rows(fits: Sequence[str], headline: str) -> np.ndarray:
    """Rows of low-shot evidence that hold the fits of the headline N.

    Parameters
    ----------
    fits : sequence of str
        Each row's ``"<N>/<repetition>"`` (``Evidence.fits``, or a record's ``fits``).
    headline : str
        The N the cell's score reports.

    Returns
    -------
    numpy.ndarray of int
    """
    rows = [i for i, name in enumerate(fits) if str(name).split("/")[0] == str(headline)]
    if not rows:
        raise DataValidationError(f"no fit of N = {headline!r} among {list(fits)[:10]}")
    return np.array(rows, dtype=np.int64)


def class_evidence(data: Any, predictions: Any) -> Evidence | None:
    """The predictions as evidence when the labels are class indices 0 .. n_classes - 1 (as
    stored); None for other labels (a protocol called directly on names), which no stored
    cell has.

    Parameters
    ----------
    data : EvalData
        The cell's arrays.
    predictions : array-like, shape (n_test,)
        The predicted label of each test example.

    Returns
    -------
    Evidence or None
    """
    pred, y = np.asarray(predictions), np.asarray(data.y_test)
    if not class_indices(y, data.n_classes) or not class_indices(pred, data.n_classes):
        return None
    return Evidence.of_predictions(y, pred, data.n_classes, data.mean_per_class)


def class_indices(values: Any, n_classes: int) -> bool:
    """Whether ``values`` are integer class indices in [0, n_classes).

    Parameters
    ----------
    values : numpy.ndarray
    n_classes : int

    Returns
    -------
    bool
    """
    values = np.asarray(values)
    integral = values.dtype != bool and np.issubdtype(values.dtype, np.integer)
    return bool(integral and (values.size == 0 or (values.min() >= 0 and values.max() < max(n_classes, 1))))
