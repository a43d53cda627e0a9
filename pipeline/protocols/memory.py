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

import math
from collections.abc import Mapping
from typing import Any

from pipeline.protocols.blocks import BLOCK_BYTES, STREAM_BLOCK_ROWS
from pipeline.protocols.cell import CellShape

__all__ = ["attentive_memory", "fewshot_memory", "invariance_memory", "knn_memory", "logistic_memory",
           "lowshot_memory", "mlp_memory", "ridge_memory"]

_F8 = 8  # float64 / int64 bytes
_BLOCK = BLOCK_BYTES["cpu"]
_RUNTIME = 32 << 20  # allocator and library slack of one run
# Elements of the few-shot sampling key and feature blocks (as in fewshot).
_FEWSHOT_BLOCKS = ((1 << 20) + (1 << 21)) * _F8 * 4
_KNN_SCORES = (1 << 22) * 4 * 3  # a score chunk and its top-k work (float32)
_HISTORY = 20  # L-BFGS pairs (as in lbfgs)
_F4 = 4  # float32 bytes
_ADAMW_COPIES = 4  # a trained parameter, its gradient and AdamW's two moments
_EVAL_ELEMENTS = _BLOCK // _F4  # elements of one evaluation pass on the CPU (as in stacked_training)


def _held(c: CellShape, streams: bool) -> int:
    """Features in memory: every split, or all but the train split plus one streamed block."""
    train = min(c.n_train, 2 * STREAM_BLOCK_ROWS) if streams else c.n_train
    return (train + c.n_test + c.n_val) * c.n_tokens * c.dim * c.itemsize


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
    return _held(c, False) + _labels(c) + _logistic_terms(c, s) + _RUNTIME


def _logistic_terms(c: CellShape, s: Mapping[str, Any]) -> int:
    """What the logistic probe holds beside its features: solver state O(K d), indices, blocks."""
    rows = c.n_train + c.n_val
    params = c.n_classes * (c.dim + 1) * _F8
    solver = params * (4 * _HISTORY + 16) * (2 if s.get("Cs") is not None else 1)  # + calibration refit
    precond = (c.dim + 1) ** 2 * _F8 * 4
    indices = rows * _F8 * 4  # targets, train/validation positions
    val_scores = c.n_val * c.n_classes * 4 * 3  # validation logits for multi-label mAP
    return indices + solver + precond + val_scores + 6 * _BLOCK


def _grid_training(c: CellShape, s: Mapping[str, Any], G: int, n_params: int, batch_elements: int,
                   row_activations: int) -> int:
    """A stacked grid of G small networks trained by AdamW: parameters and optimiser state,
    one minibatch's activations and gradients, one evaluation pass (rows sized as in
    stacked_training: its input and activations near ``_EVAL_ELEMENTS``), the row orders."""
    rows = c.n_train + c.n_val
    state = G * n_params * _F4 * _ADAMW_COPIES
    val_rows = c.n_val if c.n_val else int(math.ceil(float(s.get("val_fraction", 0.2)) * rows)) + 1
    per_row = max(c.n_tokens * c.dim, row_activations)
    eval_rows = min(val_rows, max(1, _EVAL_ELEMENTS // max(1, per_row)))
    return state + batch_elements * _F4 * 4 + eval_rows * (c.n_tokens * c.dim + row_activations) * _F4 * 2 \
        + rows * _F8 * 4


def mlp_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The MLP probe and the logistic probe it is compared with, one after the other, on the
    same features (never copied: batches are gathered and mapped one at a time).

    Parameters
    ----------
    c : CellShape
    s : mapping

    Returns
    -------
    int
    """
    G, h, B = len(s.get("weight_decays") or [0]), int(s.get("hidden_units", 1000)), int(s.get("batch_size", 256))
    d, K = c.dim, c.n_classes
    batch = B * d + G * B * (2 * h + 2 * K)  # the input batch, hidden units and logits with gradients
    mlp = _grid_training(c, s, G, d * h + h + h * K + K, batch, G * (h + K))
    test = min(c.n_test, max(256, _BLOCK // max(1, h * 4))) * (d + h + K) * _F4 * 2  # blocked prediction
    return _held(c, False) + _labels(c) + max(_logistic_terms(c, {"Cs": "default"}), mlp + test) + _RUNTIME


def attentive_memory(c: CellShape, s: Mapping[str, Any]) -> int:
    """The attentive probe on token features (n, T, d), every grid point trained at once.

    Parameters
    ----------
    c : CellShape
    s : mapping

    Returns
    -------
    int
    """
    G = len(s.get("learning_rates") or [0]) * len(s.get("weight_decays") or [0])
    H, B, T, d, K = int(s.get("num_heads", 8)), int(s.get("batch_size", 128)), c.n_tokens, c.dim, c.n_classes
    n_params = 4 * d * d + d * K + 8 * d + K
    batch = 2 * B * T * d + G * B * H * (2 * T + 2 * d) + G * B * (4 * d + 2 * K)
    train = _grid_training(c, s, G, n_params, batch, G * (H * (T + 2 * d) + 4 * d))
    test = min(c.n_test, max(1, 2**22 // max(1, T * d))) * (T * d + H * (T + d) + K) * _F4 * 2  # predict passes
    return _held(c, False) + _labels(c) + train + test + _RUNTIME


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
