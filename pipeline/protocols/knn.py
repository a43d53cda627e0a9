"""k-nearest-neighbour classification over streamed train blocks (PROTOCOLS.md section 5).

Weighted cosine k-NN (Wu et al. 2018, DINO): s_i = cosine similarity, keep the k most
similar train rows, class weight w_c = sum_i exp(s_i / tau) [y_i = c]. Plain k-NN:
Euclidean distance and a uniform vote. The core is ``topk_blocks``: train features arrive
as (block, row_offset) pairs and a running top-k is merged block by block, so memory is
O(queries x (block + k)) whatever the train size. Ties: equal scores are taken in train
row order; equal class weights go to the smallest class index.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import ConfigError, DataValidationError, unknown_name
from pipeline.protocols._validation import (
    check_features,
    check_labels,
    check_min_classes,
    validate_features,
)
from pipeline.protocols.transforms import l2_normalize

__all__ = ["KNNClassifier", "topk_blocks", "knn_class_weights", "knn_predict_from_topk", "METRICS"]

#: Supported metrics and the weightings valid with each.
METRICS: dict[str, tuple[str, ...]] = {"cosine": ("exp", "uniform"), "euclidean": ("uniform",)}

# Elements of one (queries x train rows) score matrix KNNClassifier.predict allows (128 MiB
# in float64); queries are processed in chunks to stay under it.
_SCORE_BUDGET = 2**24


def check_metric_weights(metric: str, weights: str) -> None:
    """Refuse a metric/weights pair that has no meaning (exp weights need cosine)."""
    if metric not in METRICS:
        raise unknown_name("metric", metric, METRICS)
    if weights not in METRICS[metric]:
        raise ConfigError(
            f"weights={weights!r} is not defined for metric={metric!r}; valid weights for "
            f"{metric!r}: {', '.join(METRICS[metric])} ('exp' weights exp(s / tau) need "
            "cosine similarities s)"
        )


def _block_scores(query: np.ndarray, block: np.ndarray, metric: str) -> np.ndarray:
    """Scores where larger is nearer: cosine similarity, or for Euclidean
    2 q.x - ||x||^2 = ||q||^2 - ||q - x||^2 (||q||^2 is the same for every train row)."""
    S = query @ block.T
    if metric == "euclidean":
        S *= 2
        S -= np.einsum("ij,ij->i", block, block)
    return S


def _block_topk(S: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the k largest scores in each row of S, ties to the lower index.

    torch.topk is ~20x faster than np.argpartition but picks arbitrarily among equal
    scores. Asking for k + 1 shows whether the k-th and (k+1)-th scores are equal, i.e.
    whether a tie straddles the cut; only such rows are redone with a stable sort.
    """
    if k >= S.shape[1]:
        return np.broadcast_to(np.arange(S.shape[1]), S.shape).copy()
    values, idx = torch.topk(torch.from_numpy(S), k + 1, dim=1, largest=True, sorted=True)
    values, idx = values.numpy(), idx.numpy()[:, :k]
    tied = np.flatnonzero(values[:, k] == values[:, k - 1])
    if tied.size:
        idx[tied] = np.argsort(-S[tied], axis=1, kind="stable")[:, :k]
    return idx


def _sort_best_first(keys: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort each row by key descending, equal keys by train index ascending."""
    order = np.lexsort((idx, -keys), axis=-1)
    return np.take_along_axis(keys, order, 1), np.take_along_axis(idx, order, 1)


def topk_blocks(
    query: np.ndarray,
    blocks: Iterable[tuple[np.ndarray, int]],
    k: int,
    metric: str = "cosine",
    *,
    blocks_normalized: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest train rows of every query row, merged over streamed train blocks.

    ``blocks`` yields (train_features_block, row_offset); row indices in the result are
    ``row_offset`` + the row within the block. Blocks may come in any order and be of any
    size. Returns (scores, indices), each (n_queries, k), best first: cosine similarity
    (descending) for ``cosine``, Euclidean distance (ascending) for ``euclidean``. Equal
    computed scores are ordered by train index (the BLAS may round the same dot product
    one ulp apart in blocks of different shapes, which then decides instead). Features
    are L2-normalised here for ``cosine`` (the store keeps raw features) unless
    ``blocks_normalized`` says the train blocks already are. Arithmetic is in the
    inputs' common float dtype.
    """
    if metric not in METRICS:
        raise unknown_name("metric", metric, METRICS)
    if not isinstance(k, Integral) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    query = check_features(query, "query")
    if metric == "cosine":
        query = l2_normalize(query, "query")
    m, d = query.shape
    best_keys = np.empty((m, 0), dtype=query.dtype)
    best_idx = np.empty((m, 0), dtype=np.int64)
    n_seen = 0
    for block, offset in blocks:
        block = np.asarray(block)
        if block.ndim != 2 or block.shape[1] != d:
            raise DataValidationError(
                f"train block at row {offset} has shape {block.shape}, but the query has "
                f"{d} features; expected ({block.shape[0] if block.ndim else '?'}, {d})"
            )
        if block.shape[0] == 0:
            continue
        if not np.isfinite(block).all():
            rows = np.flatnonzero(~np.isfinite(block).all(axis=1))
            raise DataValidationError(
                f"train features contain NaN or infinity in {rows.size} row(s), first at "
                f"row(s) {', '.join(str(r + offset) for r in rows[:5])}"
            )
        dtype = np.result_type(query.dtype, block.dtype, np.float32)
        block = block.astype(dtype, copy=False)
        if metric == "cosine" and not blocks_normalized:
            block = l2_normalize(block, "train features", row_offset=offset)
        S = _block_scores(query.astype(dtype, copy=False), block, metric)
        kk = min(k, block.shape[0])
        local = _block_topk(S, kk)
        keys = np.concatenate([best_keys, np.take_along_axis(S, local, 1)], axis=1)
        idx = np.concatenate([best_idx, local.astype(np.int64) + offset], axis=1)
        best_keys, best_idx = (a[:, :k] for a in _sort_best_first(keys, idx))
        n_seen += block.shape[0]
    if n_seen < k:
        raise DataValidationError(
            f"k={k} neighbours requested, but the blocks held only {n_seen} train rows"
        )
    if metric == "euclidean":
        sq_q = np.einsum("ij,ij->i", query, query).astype(best_keys.dtype)
        best_keys = np.sqrt(np.maximum(sq_q[:, None] - best_keys, 0.0))
    return best_keys, best_idx


def knn_class_weights(
    scores: np.ndarray,
    indices: np.ndarray,
    y_train: np.ndarray,
    n_classes: int,
    weights: str = "exp",
    temperature: float = 0.07,
) -> np.ndarray:
    """Per-class vote weights (n_queries, n_classes) from a top-k result.

    ``y_train`` holds class indices 0..n_classes-1 of the train rows. ``exp``:
    w_c = sum exp(s_i / temperature) over kept neighbours of class c (``scores`` are
    cosine similarities); ``uniform``: neighbour counts.
    """
    if weights not in ("exp", "uniform"):
        raise unknown_name("weights", weights, ("exp", "uniform"))
    labels = np.asarray(y_train)[indices]  # (m, k)
    if weights == "exp":
        if not temperature > 0:
            raise ConfigError(f"temperature must be > 0, got {temperature!r}")
        with np.errstate(over="ignore"):
            w = np.exp(np.asarray(scores, dtype=np.float64) / temperature)
        if not np.isfinite(w).all():
            raise ConfigError(
                f"exp(s / temperature) overflows float64 for temperature={temperature} "
                f"(max score {float(np.max(scores)):.4g}); use temperature >= 0.0015"
            )
    else:
        w = np.ones(labels.shape)
    m = labels.shape[0]
    flat = (np.arange(m)[:, None] * n_classes + labels).ravel()
    return np.bincount(flat, weights=w.ravel(), minlength=m * n_classes).reshape(m, n_classes)


def knn_predict_from_topk(
    scores: np.ndarray,
    indices: np.ndarray,
    y_train: np.ndarray,
    n_classes: int,
    weights: str = "exp",
    temperature: float = 0.07,
) -> np.ndarray:
    """Predicted class indices (n_queries,): argmax of ``knn_class_weights``, ties to the
    smallest class index."""
    return np.argmax(knn_class_weights(scores, indices, y_train, n_classes, weights, temperature), axis=1)


class KNNClassifier(ClassifierMixin, BaseEstimator):
    """Weighted cosine k-NN (default) or plain Euclidean k-NN, via ``topk_blocks``.

    Parameters
    ----------
    n_neighbors : k, at most the number of train rows.
    metric : ``cosine`` (on L2-normalised features) or ``euclidean``.
    weights : ``exp`` (exp(s / temperature), cosine only) or ``uniform`` (majority vote).
    temperature : tau of the ``exp`` weighting.
    block_size : train rows scored at once; memory is O(query chunk x block_size).

    ``decision_function`` returns the class weights w_c (n, K); for two classes it
    returns w_1 - w_0 (n,), positive for classes_[1], as sklearn expects.
    """

    _parameter_constraints: dict[str, list[Any]] = {
        "n_neighbors": [Interval(Integral, 1, None, closed="left")],
        "metric": [StrOptions(set(METRICS))],
        "weights": [StrOptions({"exp", "uniform"})],
        "temperature": [Interval(Real, 0, None, closed="neither")],
        "block_size": [Interval(Integral, 1, None, closed="left")],
    }

    def __init__(
        self,
        n_neighbors: int = 20,
        metric: str = "cosine",
        weights: str = "exp",
        temperature: float = 0.07,
        block_size: int = 8192,
    ):
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.weights = weights
        self.temperature = temperature
        self.block_size = block_size

    def fit(self, X: Any, y: Any) -> KNNClassifier:
        """Store the train features and labels (checked; nothing else is computed)."""
        self._validate_params()
        check_metric_weights(self.metric, self.weights)
        X = validate_features(self, X, reset=True)
        y = check_labels(y, n_samples=X.shape[0])
        self.classes_ = check_min_classes(y)
        if self.n_neighbors > X.shape[0]:
            raise DataValidationError(
                f"n_neighbors={self.n_neighbors} is larger than the {X.shape[0]} train "
                f"samples; use n_neighbors <= {X.shape[0]}"
            )
        # cosine: normalised once here (a zero row is an error now, not at predict time)
        self._fit_X = l2_normalize(X, "X") if self.metric == "cosine" else X
        self._y = np.searchsorted(self.classes_, y)
        return self

    def _train_blocks(self) -> Iterator[tuple[np.ndarray, int]]:
        for start in range(0, self._fit_X.shape[0], self.block_size):
            yield self._fit_X[start : start + self.block_size], start

    def kneighbors(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """(scores, train indices) of the k nearest train rows, best first (see topk_blocks)."""
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        chunk = max(1, _SCORE_BUDGET // min(self.block_size, self._fit_X.shape[0]))
        parts = [
            topk_blocks(
                X[i : i + chunk], self._train_blocks(), self.n_neighbors, self.metric,
                blocks_normalized=self.metric == "cosine",
            )
            for i in range(0, X.shape[0], chunk)
        ]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def _class_weights(self, X: Any) -> np.ndarray:
        scores, indices = self.kneighbors(X)
        return knn_class_weights(
            scores, indices, self._y, self.classes_.size, self.weights, self.temperature
        )

    def decision_function(self, X: Any) -> np.ndarray:
        """Class weights (n, K); w_1 - w_0 (n,) for two classes."""
        check_is_fitted(self)
        w = self._class_weights(X)
        return w[:, 1] - w[:, 0] if self.classes_.size == 2 else w

    def predict(self, X: Any) -> np.ndarray:
        """Class with the largest weight, the smallest class on ties."""
        check_is_fitted(self)
        return self.classes_[np.argmax(self._class_weights(X), axis=1)]
