"""The neighbour readouts, ``knn`` and ``ncm``, registered with their defaults, ranges and memory models.

Only metadata is built at import (its runner imports torch when it runs). The metric and
vote weighting pairs that have a meaning (``neighbours.pairs``) are checked here, at
config load, and by the classifier itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import STREAM_BLOCK_ROWS, FeatureRows, block_rows
from pipeline.protocols.cell import CellShape
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.evidence import class_evidence
from pipeline.protocols.memory import (
    F8, RUNTIME, feature_rows, features, indices, labels, matrix, peak, row_blocks, transform_state, work,
)
from pipeline.protocols.metrics import CLASS_METRICS, accuracy_metrics
from pipeline.protocols.neighbours.pairs import check_metric_weights
from pipeline.protocols.registry import EvalData, ProtocolResult, above, at_least, register_protocol
from pipeline.protocols.transforms import TRANSFORM_NAMES, apply_transform

__all__ = ["knn_memory", "ncm_memory"]

# Queries whose class weights are formed at once (k-NN): bounds an (m x K) array.
_VOTE_CHUNK = 4096
_SCORE_CHUNK = 1 << 22  # elements of a score chunk (float32)


def _check_knn(settings: Mapping[str, Any]) -> None:
    check_metric_weights(settings["metric"], settings["weights"])


def knn_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """k-NN (streams the train split): top-k state per query and a score chunk.

    Parameters
    ----------
    c : CellShape
    s : mapping

    Returns
    -------
    int
    """
    k = int(s.get("n_neighbors", 20))
    return peak(features=features(c, streams=True), labels=labels(c),
                # each query's top-k similarities (float64) and indices (int64), merged with a block's: 3 copies
                top_k=matrix(c.n_test, k, copies=3, itemsize=F8 + F8),
                votes=matrix(min(c.n_test, _VOTE_CHUNK), c.n_classes, copies=2),
                block=feature_rows(STREAM_BLOCK_ROWS, c, copies=2),  # a train block, normalised in float32
                scores=work(_SCORE_CHUNK, copies=3), runtime=RUNTIME)


@register_protocol(
    "knn", version=1,
    defaults={"n_neighbors": 20, "metric": "cosine", "weights": "exp", "temperature": 0.07},
    choices={"metric": ("cosine", "euclidean"), "weights": ("exp", "uniform")},
    check=_check_knn, runs_on_device=True, streams_train=True, memory=knn_memory, metrics=CLASS_METRICS,
    bounds={"n_neighbors": at_least(1), "temperature": above(0)},
    description="weighted k-NN on cosine similarity (Wu 2018, DINO); streams train blocks",
    cheap_settings={},
)
def _knn(data: EvalData, s: Mapping[str, Any]) -> ProtocolResult:
    # deferred: torch and scikit-learn load when a cell runs, not when the registry is read
    from pipeline.protocols.neighbours.knn import knn_class_weights, topk_blocks

    if s["n_neighbors"] > len(data.y_train):  # known before a single block is read
        raise DataValidationError(f"n_neighbors={s['n_neighbors']} is larger than the train set "
                                  f"({len(data.y_train)} rows)")
    device = resolve_device(s["device"])
    if data.train_blocks is not None and data.X_train is None:
        blocks = data.train_blocks()
    else:
        rows = block_rows(data.X_train.shape[1], device, itemsize=4)
        blocks = ((data.X_train[i:i + rows], i) for i in range(0, len(data.X_train), rows))
    scores, idx = topk_blocks(data.X_test, blocks, s["n_neighbors"], s["metric"], device=device)
    pred = np.concatenate([
        np.argmax(knn_class_weights(scores[i:i + _VOTE_CHUNK], idx[i:i + _VOTE_CHUNK], data.y_train, data.n_classes,
                                    s["weights"], s["temperature"]), axis=1)
        for i in range(0, len(scores), _VOTE_CHUNK)])
    metrics = accuracy_metrics(data.y_test, pred, data.mean_per_class)
    return ProtocolResult(metrics, {"n_train": int(len(data.y_train)), "device": str(device)},
                          evidence=class_evidence(data, pred))


def ncm_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """Nearest class mean (streams the train split): the class means, a block's scores, a transform.

    Parameters
    ----------
    c : CellShape
    s : mapping

    Returns
    -------
    int
    """
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
