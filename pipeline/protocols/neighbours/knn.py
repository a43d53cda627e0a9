"""k-nearest-neighbour classification over streamed train blocks, in torch on any device.

Weighted cosine k-NN (Wu et al. 2018, DINO): s_i = cosine similarity, keep the k most
similar train rows, class weight w_c = sum_i exp(s_i / tau) [y_i = c]. Plain k-NN:
Euclidean distance and a uniform vote. The core is ``topk_blocks``: train features arrive
as (block, row_offset) pairs, each block is scored against chunks of the queries with one
matrix product and a top-k, and a running top-k per query is merged block by block, so
memory is O(queries x k + query chunk x block) whatever the train size; the queries are
normalised chunk by chunk, not copied. Ties: equal scores are taken in train row order;
equal class weights go to the smallest class index.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from numbers import Integral
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import ConfigError, DataValidationError, unknown_name
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.neighbours.pairs import KNN_METRICS, check_metric_weights
from pipeline.protocols.transforms.transformers import l2_normalize_block
from pipeline.protocols.inputs.features import check_features, check_finite, validate_features
from pipeline.protocols.inputs.labels import check_min_classes, encode_labels
from pipeline.protocols.inputs.parameters import check_number

__all__ = ["METRICS", "KNNClassifier", "check_metric_weights", "knn_class_weights", "knn_predict_from_topk",
           "topk_blocks"]

#: Supported metrics and the weightings valid with each.
METRICS = KNN_METRICS

# Elements of one (query chunk x train block) score matrix per device type (8 MiB of
# float32 on a CPU, 2 GiB on a GPU): queries are scored in chunks that stay under it.
_SCORE_BUDGET = {"cpu": 1 << 21, "cuda": 1 << 29}


def _check_k(k: Any) -> int:
    if not isinstance(k, Integral) or isinstance(k, bool) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")
    return int(k)


def _sort_best_first(keys: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort each row by key descending, equal keys by train index ascending (two stable sorts)."""
    by_index = torch.argsort(idx, dim=1, stable=True)
    keys, idx = keys.gather(1, by_index), idx.gather(1, by_index)
    order = torch.argsort(keys, dim=1, descending=True, stable=True)
    return keys.gather(1, order), idx.gather(1, order)


def _block_topk(S: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest scores of each row of S and their columns, ties to the lower column.

    torch.topk picks arbitrarily among equal scores. Asking for k + 1 shows whether the
    k-th and (k+1)-th scores are equal, i.e. whether a tie straddles the cut; only such
    rows are redone with a stable sort.
    """
    if k >= S.shape[1]:
        idx = torch.arange(S.shape[1], device=S.device).expand(S.shape[0], -1)
        return S, idx
    values, idx = torch.topk(S, k + 1, dim=1, largest=True, sorted=True)
    tied = torch.nonzero(values[:, k] == values[:, k - 1]).flatten()
    values, idx = values[:, :k], idx[:, :k].clone()
    if tied.numel():
        order = torch.argsort(S[tied], dim=1, descending=True, stable=True)[:, :k]
        idx[tied] = order
        values = values.clone()
        values[tied] = S[tied].gather(1, order)
    return values, idx


class _Queries:
    """Query rows on the device in chunks, normalised on the fly (no full-size copy)."""

    def __init__(self, query: np.ndarray, metric: str, device: torch.device, dtype: torch.dtype):
        self.rows = FeatureRows.of(query)
        self.metric, self.device, self.dtype = metric, device, dtype
        self.sq_norms = torch.zeros(len(self.rows), dtype=torch.float64, device=device)
        for Q, start in self.rows.blocks(device, dtype):  # norms once; zero rows fail here
            if metric == "cosine":
                l2_normalize_block(Q, start, "query")
            self.sq_norms[start:start + Q.shape[0]] = torch.linalg.vector_norm(Q, dim=1, dtype=torch.float64) ** 2

    def chunks(self, rows: int):
        for Q, start in self.rows.blocks(self.device, self.dtype, rows=rows):
            if self.metric == "cosine":
                Q = (Q / self.sq_norms[start:start + Q.shape[0], None].sqrt()).to(self.dtype)
            yield Q, start


def topk_blocks(
    query: np.ndarray,
    blocks: Iterable[tuple[np.ndarray, int]],
    k: int,
    metric: str = "cosine",
    *,
    blocks_normalized: bool = False,
    device: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest train rows of every query row, merged over streamed train blocks.

    Parameters
    ----------
    query : array-like of shape (m, d)
        Query features.
    blocks : iterable of (numpy.ndarray, int)
        (train features block, row offset) pairs, in any order and of any size; row
        indices in the result are ``row_offset`` + the row within the block.
    k : int
        Neighbours per query.
    metric : str
        ``cosine`` (features L2-normalised here, the store keeps raw features) or
        ``euclidean``.
    blocks_normalized : bool
        The train blocks are already L2-normalised (cosine).
    device : str, torch.device or None
        Compute device (``auto``/None: CUDA when available).

    Returns
    -------
    scores, indices : numpy.ndarray of shape (m, k)
        Best first: cosine similarity (descending) for ``cosine``, Euclidean distance
        (ascending) for ``euclidean``. Equal computed scores are ordered by train
        index (a product may round one ulp apart in blocks of different shapes, which
        then decides instead). Arithmetic is in the inputs' common float dtype
        (float16 computes in float32).
    """
    if metric not in METRICS:
        raise unknown_name("metric", metric, METRICS)
    k = _check_k(k)
    query = check_features(query, "query")
    device = resolve_device(device)
    m, d = query.shape
    queries = best_keys = best_idx = None
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
        check_finite(block, "train features", row_offset=offset)
        if queries is None:  # the common dtype of the query and the first block (float16: float32)
            wide = np.result_type(query.dtype, block.dtype, np.float32) == np.float64
            queries = _Queries(query, metric, device, torch.float64 if wide else torch.float32)
            # -inf keys fill the state until k rows are seen; real scores always beat them
            best_keys = torch.full((m, k), -torch.inf, dtype=queries.dtype, device=device)
            best_idx = torch.full((m, k), np.iinfo(np.int64).max, dtype=torch.int64, device=device)
        B = next(FeatureRows.of(block).blocks(device, queries.dtype, rows=block.shape[0]))[0]
        if metric == "cosine" and not blocks_normalized:
            B = l2_normalize_block(B, offset, "train features")
        sq_b = (B * B).sum(dim=1) if metric == "euclidean" else None
        kk = min(k, B.shape[0])
        chunk = max(1, _SCORE_BUDGET.get(device.type, _SCORE_BUDGET["cpu"]) // B.shape[0])
        for Q, start in queries.chunks(chunk):
            S = Q @ B.T
            if metric == "euclidean":  # 2 q.x - ||x||^2 = ||q||^2 - ||q - x||^2 (||q||^2 is per query)
                S.mul_(2).sub_(sq_b)
            values, local = _block_topk(S, kk)
            rows = slice(start, start + Q.shape[0])
            keys, idx = _sort_best_first(torch.cat([best_keys[rows], values], dim=1),
                                         torch.cat([best_idx[rows], local + offset], dim=1))
            best_keys[rows], best_idx[rows] = keys[:, :k], idx[:, :k]
        n_seen += block.shape[0]
    if n_seen < k:
        raise DataValidationError(
            f"k={k} neighbours requested, but the blocks held only {n_seen} train rows"
        )
    if metric == "euclidean":
        sq_q = queries.sq_norms.to(best_keys.dtype)
        best_keys = torch.sqrt(torch.clamp(sq_q[:, None] - best_keys, min=0.0))
    return best_keys.cpu().numpy(), best_idx.cpu().numpy()


def knn_class_weights(
    scores: np.ndarray,
    indices: np.ndarray,
    y_train: np.ndarray,
    n_classes: int,
    weights: str = "exp",
    temperature: float = 0.07,
) -> np.ndarray:
    """Per-class vote weights from a top-k result.

    Parameters
    ----------
    scores, indices : numpy.ndarray of shape (m, k)
        A ``topk_blocks`` result.
    y_train : numpy.ndarray
        Class indices 0..n_classes-1 of the train rows.
    n_classes : int
    weights : str
        ``exp``: w_c = sum exp(s_i / temperature) over kept neighbours of class c
        (``scores`` are cosine similarities); ``uniform``: neighbour counts.
    temperature : float

    Returns
    -------
    numpy.ndarray of shape (m, n_classes)
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
    """Predicted class indices: argmax of ``knn_class_weights``, ties to the smallest index.

    Parameters
    ----------
    scores, indices, y_train, n_classes, weights, temperature
        As for ``knn_class_weights``.

    Returns
    -------
    numpy.ndarray of shape (m,)
    """
    return np.argmax(knn_class_weights(scores, indices, y_train, n_classes, weights, temperature), axis=1)


class KNNClassifier(ClassifierMixin, BaseEstimator):
    """Weighted cosine k-NN (default) or plain Euclidean k-NN, via ``topk_blocks``.

    Parameters
    ----------
    n_neighbors : int
        k, at most the number of train rows.
    metric : str
        ``cosine`` (on L2-normalised features) or ``euclidean``.
    weights : str
        ``exp`` (exp(s / temperature), cosine only) or ``uniform`` (majority vote).
    temperature : float
        tau of the ``exp`` weighting.
    block_size : int
        Train rows scored at once.
    device : str, torch.device or None
        Compute device: ``auto``/None (CUDA when available), ``cpu``, ``cuda[:i]``.

    Attributes
    ----------
    classes_ : numpy.ndarray
        The labels as given (sorted).
    n_features_in_ : int

    Notes
    -----
    The train features are kept as given (no normalised copy; blocks are normalised
    when scored). ``decision_function`` returns the class weights w_c (n, K); for two
    classes it returns w_1 - w_0 (n,), positive for classes_[1], as scikit-learn expects.
    """

    def __init__(self, n_neighbors: int = 20, metric: str = "cosine", weights: str = "exp",
                 temperature: float = 0.07, block_size: int = 8192, device: Any = None):
        self.n_neighbors = n_neighbors
        self.metric = metric
        self.weights = weights
        self.temperature = temperature
        self.block_size = block_size
        self.device = device

    def fit(self, X: Any, y: Any) -> KNNClassifier:
        """Keep the train features and labels (checked; nothing else is computed).

        Parameters
        ----------
        X : array-like of shape (n, d)
        y : array-like of shape (n,)
            Class labels of any sortable kind.

        Returns
        -------
        KNNClassifier
            self.
        """
        check_number(self.n_neighbors, "n_neighbors", 1, integer=True)
        check_number(self.temperature, "temperature", 0, low_open=True)
        check_number(self.block_size, "block_size", 1, integer=True)
        check_metric_weights(self.metric, self.weights)
        X = validate_features(self, X, reset=True)
        self.classes_, self._y = encode_labels(y, n_samples=X.shape[0])
        check_min_classes(self.classes_)
        if self.n_neighbors > X.shape[0]:
            raise DataValidationError(
                f"n_neighbors={self.n_neighbors} is larger than the {X.shape[0]} train "
                f"samples; use n_neighbors <= {X.shape[0]}"
            )
        if self.metric == "cosine":  # a zero row is an error now, not at predict time
            for block, start in FeatureRows.of(X).blocks():
                l2_normalize_block(block, start, "X")
        self._fit_X = X
        return self

    def _train_blocks(self) -> Iterator[tuple[np.ndarray, int]]:
        for start in range(0, self._fit_X.shape[0], self.block_size):
            yield self._fit_X[start : start + self.block_size], start

    def kneighbors(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """Scores and train indices of the k nearest train rows, best first (see ``topk_blocks``).

        Parameters
        ----------
        X : array-like of shape (m, d)

        Returns
        -------
        scores, indices : numpy.ndarray of shape (m, k)
        """
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        return topk_blocks(X, self._train_blocks(), self.n_neighbors, self.metric, device=self.device)

    def _class_weights(self, X: Any) -> np.ndarray:
        scores, indices = self.kneighbors(X)
        return knn_class_weights(
            scores, indices, self._y, self.classes_.size, self.weights, self.temperature
        )

    def decision_function(self, X: Any) -> np.ndarray:
        """Class weights.

        Parameters
        ----------
        X : array-like of shape (m, d)

        Returns
        -------
        numpy.ndarray
            (m, K); w_1 - w_0 (m,) for two classes.
        """
        check_is_fitted(self)
        w = self._class_weights(X)
        return w[:, 1] - w[:, 0] if self.classes_.size == 2 else w

    def predict(self, X: Any) -> np.ndarray:
        """Class with the largest weight, the smallest class on ties.

        Parameters
        ----------
        X : array-like of shape (m, d)

        Returns
        -------
        numpy.ndarray of shape (m,)
            Labels from ``classes_``.
        """
        check_is_fitted(self)
        return self.classes_[np.argmax(self._class_weights(X), axis=1)]
