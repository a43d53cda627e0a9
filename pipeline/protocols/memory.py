"""Peak host memory of one cell per built-in protocol, from the shapes alone.

Each model adds up what its protocol holds at its peak: the features given to it (the
train split only when it does not stream it: a streaming protocol holds one stored block
at a time), the labels, the terms that grow with the classes and the width but not with
the rows (d x d Gram or covariance matrices, K x d parameters, L-BFGS pairs) and a few
row blocks of bounded size. The models follow the implementations; the memory tests
check each against a measured peak. They are for scheduling: a little high rather than
low.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.protocols.blocks import BLOCK_BYTES, STREAM_BLOCK_ROWS
from pipeline.protocols.cell import CellShape

__all__ = ["fewshot_memory", "invariance_memory", "knn_memory", "logistic_memory", "lowshot_memory",
           "ridge_memory"]

_F8 = 8  # float64 / int64 bytes
_BLOCK = BLOCK_BYTES["cpu"]
_RUNTIME = 32 << 20  # allocator and library slack of one run
# Elements of the few-shot sampling key and feature blocks (as in fewshot).
_FEWSHOT_BLOCKS = ((1 << 20) + (1 << 21)) * _F8 * 4
_KNN_SCORES = (1 << 22) * 4 * 3  # a score chunk and its top-k work (float32)
_HISTORY = 20  # L-BFGS pairs (as in lbfgs)


def _held(c: CellShape, streams: bool) -> int:
    """Features in memory: every split, or all but the train split plus one streamed block."""
    train = min(c.n_train, 2 * STREAM_BLOCK_ROWS) if streams else c.n_train
    return (train + c.n_test + c.n_val) * c.dim * c.itemsize


def _labels(c: CellShape) -> int:
    return (c.n_train + c.n_test + c.n_val) * _F8 * 2


def _ridge_terms(c: CellShape) -> int:
    """The Gram route: d x d matrices, d x K summaries, the QR fallback, float64 blocks."""
    d, K = c.dim, c.n_classes
    return d * d * _F8 * 6 + (d + K) ** 2 * _F8 * 3 + d * K * _F8 * 6 + 10 * _BLOCK


def logistic_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The logistic probe: features once, solver state O(K d), float32 blocks.

    Parameters
    ----------
    c : CellShape
    s : mapping
        Full settings.

    Returns
    -------
    int
    """
    rows = c.n_train + c.n_val
    params = c.n_classes * (c.dim + 1) * _F8
    solver = params * (4 * _HISTORY + 16) * (2 if s.get("Cs") is not None else 1)  # + calibration refit
    precond = (c.dim + 1) ** 2 * _F8 * 4
    indices = rows * _F8 * 4  # targets, train/validation positions
    val_scores = c.n_val * c.n_classes * 4 * 3  # validation logits for multi-label mAP
    return _held(c, False) + _labels(c) + indices + solver + precond + val_scores + 6 * _BLOCK + _RUNTIME


def ridge_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The ridge probe (streams the train split): the Gram route's d^2 and d K terms.

    Parameters
    ----------
    c : CellShape
    s : mapping

    Returns
    -------
    int
    """
    return _held(c, True) + _labels(c) + _ridge_terms(c) + c.n_test * c.n_classes * 4 + _RUNTIME


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
    state = c.n_test * k * (_F8 + _F8) * 3
    weights = min(c.n_test, 4096) * c.n_classes * _F8 * 2
    block = STREAM_BLOCK_ROWS * c.dim * (c.itemsize + 4 * 2)
    return _held(c, True) + _labels(c) + state + weights + block + _KNN_SCORES + _RUNTIME


def fewshot_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """Few-shot episodes (stream the train split): the rows the episodes use, index arrays.

    Parameters
    ----------
    c : CellShape
    s : mapping

    Returns
    -------
    int
    """
    per_episode = int(s.get("n_way", 5)) * (int(s.get("n_shot", 20)) + int(s.get("n_query", 15)))
    used = int(s.get("n_episodes", 600)) * per_episode
    cached = min(c.n_train, used) * c.dim * c.itemsize if s.get("pool", "all") == "all" else 0
    pool = c.n_train + c.n_test + c.n_val
    return _held(c, True) + _labels(c) + cached + used * _F8 * 3 + pool * _F8 * 3 + _FEWSHOT_BLOCKS + _RUNTIME


def lowshot_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """Low-shot sweep (streams the train split): one sample kept, the ridge terms.

    Parameters
    ----------
    c : CellShape
    s : mapping

    Returns
    -------
    int
    """
    shots = [n for n in s.get("shots", []) if isinstance(n, int)]
    sample_rows = min(c.n_train, max(shots, default=0) * c.n_classes)
    sample = sample_rows * c.dim * c.itemsize + c.n_train * _F8 * 3  # the rows, sampling permutations
    small = 2 * c.dim * c.dim * _F8 * 4  # the SVD route below 2d rows
    return _held(c, True) + _labels(c) + sample + max(_ridge_terms(c), small) + c.n_test * _F8 + _RUNTIME


def invariance_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The invariance audit (streams the train split): a subsample in float64 and its maps.

    Parameters
    ----------
    c : CellShape
    s : mapping

    Returns
    -------
    int
    """
    m = min(c.n_train, int(s.get("max_train", 1000)))
    r = min(c.dim, int(s.get("max_dims", 64)))
    subsample = m * c.dim * (c.itemsize + _F8 * 3)  # rows, centred copy, SVD
    mapped = (m + c.n_test) * r * _F8 * 10 + c.n_test * c.dim * _F8
    return _held(c, True) + _labels(c) + subsample + mapped + c.dim * c.dim * _F8 + _RUNTIME
