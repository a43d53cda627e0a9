"""The neighbour readouts, ``knn`` and ``ncm``, registered with their defaults, ranges and memory models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, DataValidationError
from pipeline.protocols.blocks import STREAM_BLOCK_ROWS, FeatureRows, block_rows
from pipeline.protocols.cell import CellShape
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.evidence import class_evidence
from pipeline.protocols.fit_warnings import fit_warning
from pipeline.protocols.memory import (
    F8, RUNTIME, feature_rows, features, indices, labels, matrix, peak, row_blocks, transform_state, work,
)
from pipeline.protocols.metrics import CLASS_METRICS, accuracy_metrics
from pipeline.protocols.neighbours.pairs import QUERY_CACHE_BYTES, check_metric_weights
from pipeline.protocols.registry import EvalData, ProtocolResult, above, at_least, register_protocol
from pipeline.protocols.transforms import TRANSFORM_NAMES, apply_transform

__all__ = ["knn_memory", "ncm_memory"]

# Queries whose class weights are formed at once (k-NN): bounds an (m x K) array.
_VOTE_CHUNK = 4096
_SCORE_CHUNK = 1 << 22  # elements of a score chunk (float32)


def _check_knn(settings: Mapping[str, Any]) -> None:
    check_metric_weights(settings["metric"], settings["weights"])
    also = settings["also_neighbors"]
    if not isinstance(also, (list, tuple)) or not all(
            isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in also):
        raise ConfigError(f"also_neighbors must be a list of integers >= 1, got {also!r}")


def _neighbour_counts(s: Mapping[str, Any]) -> list[int]:
    """Every k the settings score, ascending (``n_neighbors`` and ``also_neighbors``)."""
    return sorted({int(s["n_neighbors"]), *map(int, s.get("also_neighbors") or ())})


def knn_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """k-NN (streams the train split): top-k state per query and a score chunk."""
    k = max(_neighbour_counts({"n_neighbors": 20, **s}))
    return peak(features=features(c, streams=True), labels=labels(c),
                # each query's top-k similarities (float64) and indices (int64), merged with a block's: 3 copies
                top_k=matrix(c.n_test, k, copies=3, itemsize=F8 + F8),
                votes=matrix(min(c.n_test, _VOTE_CHUNK), c.n_classes, copies=2),
                # a streamed train block and the buffer its rows are normalised into (float32)
                block=feature_rows(STREAM_BLOCK_ROWS, c, copies=2),
                queries=min(QUERY_CACHE_BYTES, work(c.n_test * c.dim)),  # the normalised queries, when kept
                # a score tile (32 MiB on a CPU, the search's first one too) and the selection's temporaries
                scores=work(_SCORE_CHUNK, copies=3), runtime=RUNTIME)


@register_protocol(
    "knn", version=2,  # 2: predictions decided by ties within rounding counted and flagged (tie_decided)
    defaults={"n_neighbors": 20, "metric": "cosine", "weights": "exp", "temperature": 0.07, "also_neighbors": []},
    choices={"metric": ("cosine", "euclidean"), "weights": ("exp", "uniform")},
    check=_check_knn, runs_on_device=True, streams_train=True, memory=knn_memory, metrics=CLASS_METRICS,
    bounds={"n_neighbors": at_least(1), "temperature": above(0)},
    added_settings={"also_neighbors": []},  # records made before it existed keep their identity
    description="weighted k-NN on cosine similarity (Wu 2018, DINO); streams train blocks",
    cheap_settings={}, slow=True,
)
def _knn(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch and scikit-learn load when a cell runs, not when the registry is read
    from pipeline.protocols.neighbours.knn import knn_class_weights, topk_blocks

    ks = _neighbour_counts(s)
    if ks[-1] > len(data.y_train):  # known before a single block is read
        name = "n_neighbors=" if ks[-1] == s["n_neighbors"] else "also_neighbors: k="
        raise DataValidationError(f"{name}{ks[-1]} is larger than the train set ({len(data.y_train)} rows)")
    device = resolve_device(s["device"])
    blocks = search_blocks(data, device)
    # one search at the largest k (its first k columns are the top-k of every smaller k), and
    # one neighbour more, to see a tie across the headline k's cut
    extra = int(ks[-1] < len(data.y_train))
    scores, idx = topk_blocks(data.X_test, blocks, ks[-1] + extra, s["metric"], device=device)

    def votes(k: int) -> np.ndarray:
        return np.concatenate([
            knn_class_weights(scores[i:i + _VOTE_CHUNK, :k], idx[i:i + _VOTE_CHUNK, :k], data.y_train,
                              data.n_classes, s["weights"], s["temperature"])
            for i in range(0, len(scores), _VOTE_CHUNK)])

    def predict(k: int) -> np.ndarray:
        return np.argmax(votes(k), axis=1)

    k = s["n_neighbors"]
    weights = votes(k)
    pred = np.argmax(weights, axis=1)
    metrics = accuracy_metrics(data.y_test, pred, data.mean_per_class)
    diagnostics = {"n_train": int(len(data.y_train)), "device": str(device)}
    undecided = _decided_by_ties(scores, idx, weights, data.y_train, k, s)
    diagnostics["tie_decided"] = int(undecided)
    warnings = []
    if undecided > 1:
        warnings.append(fit_warning("tie_decided", f"{undecided} of {len(pred)} test images are decided by ties "
                                    "within rounding (neighbours of other classes equally similar at the "
                                    f"k = {k} cut, or class weights equal): the score could move by up to "
                                    f"{undecided} images with the features' last bits"))
    if s.get("also_neighbors"):
        diagnostics["score_by_k"] = {str(k): metrics["score"] if k == s["n_neighbors"] else
                                     accuracy_metrics(data.y_test, predict(k), data.mean_per_class)["score"]
                                     for k in ks}
    return ProtocolResult(metrics, diagnostics, warnings, evidence=class_evidence(data, pred))


def _decided_by_ties(scores: np.ndarray, idx: np.ndarray, weights: np.ndarray, y_train: np.ndarray, k: int,
                     s: Mapping[str, Any]) -> int:
    """Test rows whose prediction rounding could change: the neighbour just outside the cut as
    similar (within float32 rounding) as the k-th and taking its place would change the vote,
    or the two largest class weights equal within what that rounding moves them by."""
    # deferred: torch, with the search (the registry is read without it)
    from pipeline.protocols.neighbours.knn import knn_class_weights

    # float32 similarities and distances are good to a few ulps of their size
    tol = 8 * np.finfo(np.float32).eps * np.maximum(np.abs(scores[:, k - 1]), 1.0)
    undecided = np.zeros(len(scores), dtype=bool)
    if scores.shape[1] > k:
        rows = np.flatnonzero((np.abs(scores[:, k - 1] - scores[:, k]) <= tol)
                              & (y_train[idx[:, k - 1]] != y_train[idx[:, k]]))
        if rows.size:
            keep = np.r_[np.arange(k - 1), k]  # the k-th neighbour swapped for the next
            other = knn_class_weights(scores[rows][:, keep], idx[rows][:, keep], y_train, weights.shape[1],
                                      s["weights"], s["temperature"])
            undecided[rows] = np.argmax(other, axis=1) != np.argmax(weights[rows], axis=1)
    if s["weights"] == "exp" and weights.shape[1] > 1:  # counts (uniform weights) are exact
        top = np.sort(weights, axis=1)[:, -2:]
        # exp(s / T) moves by a share tol / T of itself
        undecided |= (top[:, 1] - top[:, 0]) <= 2 * (tol / s["temperature"]) * top[:, 1]
    return int(np.sum(undecided))


def ncm_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """Nearest class mean (streams the train split): the class means, a block's scores, a transform."""
    d, K = c.dim, c.n_classes
    rows = block_rows(max(d, K), itemsize=F8)  # the query block of ncm_score_blocks
    return peak(features=features(c, streams=True), labels=labels(c),
                means=matrix(K, d, copies=3),  # the sums, the means, the normalised means (float64)
                blocks=row_blocks(5),  # a float64 block, its mapped and normalised copies
                scores=matrix(min(rows, c.n_test), K, copies=3), offsets=matrix(K, 1, copies=3),
                predictions=indices(c.n_test, arrays=2), transform=transform_state(c, s.get("transform")),
                runtime=RUNTIME)


@register_protocol(
    "ncm", version=1,
    defaults={"metric": "cosine", "transform": "none"},
    choices={"metric": ("cosine", "euclidean"), "transform": TRANSFORM_NAMES},
    runs_on_device=True, streams_train=True, memory=ncm_memory, metrics=CLASS_METRICS,
    description="nearest class mean, cosine or Euclidean (Mensink 2013); streams train blocks",
    cheap_settings={},
)
def _ncm(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch loads when a cell runs, not when the registry is read
    from pipeline.protocols.neighbours.ncm import class_means, ncm_predict

    device = resolve_device(s["device"])
    train = data.train_rows()
    # the transform is fitted on the train split only
    train, test = apply_transform(s["transform"], train, train, FeatureRows.of(data.X_test), device=device)
    means = class_means(train, data.y_train, data.n_classes, s["metric"], device)
    pred = ncm_predict(test, means, s["metric"], device)
    metrics = accuracy_metrics(data.y_test, pred, data.mean_per_class)
    n_means = int((~means[:, 0].isnan()).sum())
    return ProtocolResult(metrics, {"n_train": int(len(data.y_train)), "n_means": n_means, "device": str(device)},
                          evidence=class_evidence(data, pred))


def search_blocks(data: Any, device: Any) -> Any:
    """The train rows of a cell as the neighbour search reads them.

    Parameters
    ----------
    data : EvalData
        The cell's data.
    device : torch.device
        Where the search runs (sizes the in-memory views).

    Returns
    -------
    iterable of (array, int)
        ``(block, start)`` pairs: the store's streamed blocks, or views of the rows in memory.
    """
    if data.train_blocks is not None and data.X_train is None:
        return data.train_blocks()
    # the search gathers rows into its own buffer: blocks here only bound the float32 views
    rows = block_rows(data.X_train.shape[1], device, itemsize=4)
    return ((data.X_train[i:i + rows], i) for i in range(0, len(data.X_train), rows))
