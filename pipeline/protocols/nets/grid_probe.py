"""``GridProbe``: the one fit of the torch probes (MLP, attentive), a whole grid at once."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.exceptions import ConvergenceWarning

from pipeline.errors import DataValidationError
from pipeline.protocols.inputs.features import as_cpu_tensor
from pipeline.protocols.inputs.labels import check_min_classes, encode_labels, validation_split
from pipeline.protocols.inputs.parameters import check_number
from pipeline.protocols.nets.outputs import SoftmaxOutputMixin
from pipeline.protocols.nets.stacked_training import RowBatches, StackedModel, select_member, train_fixed, train_grid

__all__ = ["GridProbe"]


class GridProbe(SoftmaxOutputMixin, ClassifierMixin, BaseEstimator):
    """A torch probe trained a grid at once, selected on validation, refitted on every row.

    Subclasses set ``rows_needed`` (``(n, d) features``), ``row_ndim`` and define
    ``_grid() -> (lrs, wds, device)``, ``_checked(X)`` (an array given to ``fit``),
    ``_stacked(shape, K, device) -> make_model(G, generator)`` (for rows of ``shape`` and
    ``K`` classes) and ``_keep(model, best,
    lrs, wds)``; the estimator has ``batch_size``, ``max_epochs``, ``patience``,
    ``val_fraction`` and ``random_state``.
    """

    rows_needed = "(n, d) features"
    row_ndim = 2

    def _check_training(self, *integers: str) -> None:
        """Check the training settings shared by every probe (and the integers named)."""
        for name in (*integers, "batch_size", "max_epochs", "patience"):
            check_number(getattr(self, name), name, 1, integer=True)
        check_number(self.val_fraction, "val_fraction", 0, 1, low_open=True, high_open=True)
        check_number(self.random_state, "random_state", 0, 2**32 - 1, integer=True)

    def fit(self, X: Any, y: Any, val_mask: Any = None) -> GridProbe:
        """Select the grid member and epoch count on validation, then refit on all rows.

        Parameters
        ----------
        X : array-like
            Features: (n, d) rows, or (n, T, d) tokens for a token probe.
        y : array-like of shape (n,)
            Class labels.
        val_mask : array-like of bool, optional
            Rows of a dataset-defined validation split (used instead of a stratified draw
            for selection); the refit uses every row.

        Returns
        -------
        GridProbe
            self, fitted.
        """
        lrs, wds, device = self._grid()
        return self._fit(self._checked(X), y, val_mask, lrs, wds, device)

    def fit_batches(self, source: RowBatches, y: Any, val_mask: Any = None) -> GridProbe:
        """``fit`` on rows gathered one minibatch at a time (splits never concatenated).

        Parameters
        ----------
        source : RowBatches
            The rows, e.g. the train and validation splits with a fitted preprocessing
            applied per batch. Their values must be finite.
        y : array-like of shape (n,)
            Class labels.
        val_mask : array-like of bool, optional
            As for ``fit``.

        Returns
        -------
        GridProbe
            self, fitted.
        """
        lrs, wds, device = self._grid()
        if len(source.shape) != self.row_ndim:
            raise DataValidationError(f"{type(self).__name__} needs {self.rows_needed}, got rows of shape "
                                      f"{source.shape}")
        return self._fit(source, y, val_mask, lrs, wds, device)

    def _fit(self, X: Any, y: Any, val_mask: Any, lrs: np.ndarray, wds: np.ndarray,
             device: torch.device) -> GridProbe:
        self.classes_, codes = encode_labels(y, X.shape[0])
        check_min_classes(self.classes_)
        make = self._stacked(tuple(X.shape), int(self.classes_.size), device)
        model, best = self._select_and_refit(make, X, codes, val_mask, lrs, wds, device)
        self._keep(model, best, lrs, wds)
        return self

    def _select_and_refit(self, make_model: Callable[[int, torch.Generator], StackedModel], X: Any,
                          codes: np.ndarray, val_mask: object, lrs: np.ndarray, wds: np.ndarray,
                          device: torch.device) -> tuple[StackedModel, int]:
        """Train the grid, record the selection in fitted attributes, refit; (model, best index).
        ``X``: an array, or ``RowBatches``."""
        train_rows, val_rows = validation_split(codes, self.val_fraction, self.random_state, val_mask)
        Xt = X if isinstance(X, RowBatches) else as_cpu_tensor(X)
        yt = torch.from_numpy(codes)
        record = train_grid(make_model, Xt, yt, train_rows, val_rows, lrs, wds, self.batch_size, self.max_epochs,
                            self.patience, self.random_state, device)
        best = select_member(record, lrs, wds)
        self.n_epochs_ = int(record.best_epoch[best])
        self.n_val_ = int(len(val_rows))  # the rows every grid member was scored on
        self.val_accuracy_, self.val_loss_ = record.best_accuracy, record.best_loss
        self.best_epochs_, self.val_curves_ = record.best_epoch, record.val_accuracy
        self.stopped_early_ = bool(record.stopped_early[best])
        self.solver_, self.device_ = "adamw", str(device)
        model = train_fixed(make_model, Xt, yt, np.arange(codes.size), float(lrs[best]), float(wds[best]),
                            self.batch_size, self.n_epochs_, self.random_state, device)
        if self.n_epochs_ == self.max_epochs:
            warnings.warn(
                f"{type(self).__name__}: validation score (accuracy, then cross-entropy) was still improving at "
                f"the last of max_epochs={self.max_epochs} epochs (lr={lrs[best]:g}, weight_decay={wds[best]:g}); "
                "raise max_epochs for a selected epoch count inside the budget.", ConvergenceWarning, stacklevel=4)
        return model, best
