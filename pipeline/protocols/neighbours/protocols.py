"""The neighbour readout, ``knn``, registered with its defaults, ranges and memory model.

Only metadata is built at import (its runner imports torch when it runs). The metric and
vote weighting pairs that have a meaning (``neighbours.pairs``) are checked here, at
config load, and by the classifier itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.blocks import STREAM_BLOCK_ROWS, block_rows
from pipeline.protocols.cell import CellShape
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.evidence import class_evidence
from pipeline.protocols.memory import F8, RUNTIME, held, label_bytes
from pipeline.protocols.metrics import CLASS_METRICS, accuracy_metrics
from pipeline.protocols.neighbours.pairs import check_metric_weights
from pipeline.protocols.registry import EvalData, ProtocolResult, above, at_least, register_protocol

__all__ = ["knn_memory"]

# Queries whose class weights are formed at once (k-NN): bounds an (m x K) array.
_VOTE_CHUNK = 4096
_KNN_SCORES = (1 << 22) * 4 * 3  # a score chunk and its top-k work (float32)


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
    state = c.n_test * k * (F8 + F8) * 3
    weights = min(c.n_test, 4096) * c.n_classes * F8 * 2
    block = STREAM_BLOCK_ROWS * c.dim * (c.itemsize + 4 * 2)
    return held(c, True) + label_bytes(c) + state + weights + block + _KNN_SCORES + RUNTIME


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
