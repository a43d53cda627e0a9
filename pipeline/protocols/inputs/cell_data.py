"""What a cell's data must be before a protocol runs: the arrays checked, each refusal naming the array."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.errors import DataValidationError
from pipeline.protocols.cell import ImageData
from pipeline.protocols.dense.data import DenseData, check_dense_data

__all__ = ["check_cell_data"]


def check_cell_data(data: Any, protocol: Any, entries: Sequence[Any]) -> None:
    """Refuse unusable arrays before any protocol runs, naming the array."""
    # NaN/inf, not 2-D, no rows, widths that differ between splits, labels that are not
    # class indices in [0, n_classes) with one per row (or, for a ``multilabel``
    # protocol, (n, n_classes) 0/1 arrays), fewer than two train classes. Streamed train
    # blocks are checked as they arrive. A ``tokens`` protocol takes (n, T, d) token
    # features instead, and no other protocol does. A protocol that reads the encoder's
    # weights takes an ``ImageData``, and only it does.
    # deferred: scikit-learn's input checks, when a cell's data is checked (reading the registry needs none)
    from pipeline.protocols.inputs.labels import check_class_indices, check_min_classes, check_multilabel

    if protocol is not None and protocol.weights:
        if not isinstance(data, ImageData):
            raise DataValidationError(f"protocol {protocol.name!r} reads an encoder's weights and a dataset's images "
                                      f"(ImageData), not stored features; got {type(data).__name__}")
        return
    if isinstance(data, ImageData):
        able = ", ".join(p.name for p in entries if p.weights)
        raise DataValidationError(f"protocol {getattr(protocol, 'name', None)!r} reads stored features, not an "
                                  f"encoder and its images; protocols that do: {able}")
    if protocol is not None and protocol.dense:
        check_dense_data(data, protocol.name, protocol.dense)
        return
    if isinstance(data, DenseData):
        able = ", ".join(p.name for p in entries if p.dense)
        raise DataValidationError(f"protocol {getattr(protocol, 'name', None)!r} cannot read spatial maps and "
                                  f"per-pixel targets; protocols that do: {able}")
    if data.multilabel and not (protocol is not None and protocol.multilabel):
        able = ", ".join(p.name for p in entries if p.multilabel and p.reads_features)
        raise DataValidationError(
            f"y_train has shape {np.shape(data.y_train)}: multi-label targets, which protocol "
            f"{getattr(protocol, 'name', None)!r} cannot take; protocols that can: {able}")
    width = None
    for split, X, y in (("train", data.X_train, data.y_train), ("test", data.X_test, data.y_test),
                        ("val", data.X_val, data.y_val)):
        if X is None and (split != "train" or data.train_blocks is None):
            if split == "val" and y is None:
                continue
            raise DataValidationError(f"X_{split} is missing")
        n_rows = None if X is None else len(X)
        if data.multilabel:  # 1 present, 0 absent, -1 "difficult" (VOC): see average_precision
            labels = check_multilabel(y, name=f"y_{split}", difficult=True)
            if n_rows is not None and len(labels) != n_rows:
                raise DataValidationError(f"y_{split} has {len(labels)} rows, but X_{split} has {n_rows}; they "
                                          "must match one to one")
            if labels.shape[1] != data.n_classes:
                raise DataValidationError(f"y_{split} has {labels.shape[1]} label columns, but n_classes="
                                          f"{data.n_classes}")
        else:
            labels = check_class_indices(y, n_samples=n_rows, name=f"y_{split}")
            if labels.size and (labels.min() < 0 or labels.max() >= data.n_classes):
                raise DataValidationError(
                    f"y_{split} holds labels from {labels.min()} to {labels.max()}; class indices must be in "
                    f"[0, {data.n_classes}) (n_classes={data.n_classes})")
            if split == "train":
                check_min_classes(labels, name="y_train")
        if X is None:
            continue
        X = _checked_features(X, f"X_{split}", protocol, entries)
        if width is not None and X.shape[-1] != width:
            raise DataValidationError(f"X_{split} has {X.shape[-1]} features, but X_train has {width}; every "
                                      "split must come from the same layer")
        width = X.shape[-1] if width is None else width


def _checked_features(X: Any, name: str, protocol: Any, entries: Sequence[Any]) -> np.ndarray:
    """Pooled (n, d) features, or (n, T, d) token features for a ``tokens`` protocol."""
    # deferred: scikit-learn's input checks, when a cell's data is checked (reading the registry needs none)
    from pipeline.protocols.inputs.features import check_features

    tokens = protocol is not None and protocol.tokens
    if np.ndim(X) == 4:
        able = ", ".join(p.name for p in entries if p.dense)
        raise DataValidationError(f"{name} has shape {np.shape(X)}: spatial maps, which protocol "
                                  f"{getattr(protocol, 'name', None)!r} cannot take; protocols that read maps: {able}")
    if np.ndim(X) == 3 and not tokens:
        able = ", ".join(p.name for p in entries if p.tokens)
        raise DataValidationError(f"{name} has shape {np.shape(X)}: token features, which protocol "
                                  f"{getattr(protocol, 'name', None)!r} cannot take (it needs pooled (n, d) "
                                  f"features); protocols that read tokens: {able}")
    if tokens:
        # deferred: scikit-learn's input checks, as above
        from pipeline.protocols.inputs.features import check_tokens

        if np.ndim(X) != 3:
            raise DataValidationError(f"{name} has shape {np.shape(X)}, but protocol {protocol.name!r} reads token "
                                      "features (n, T, d): evaluate it on a layer extracted with its tokens")
        return check_tokens(X, name)
    return check_features(X, name)
