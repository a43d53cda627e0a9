"""The outputs of the torch probes (MLP, attentive): class scores, probabilities and
labels from one ``_logits`` method, in scikit-learn's classifier interface."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["SoftmaxOutputMixin"]


class SoftmaxOutputMixin:
    """decision_function / predict_proba / predict of a classifier from its ``_logits(X)`` (n, K)."""

    def decision_function(self, X: Any) -> np.ndarray:
        """Class scores.

        Parameters
        ----------
        X : array-like
            Features, as in ``fit``.

        Returns
        -------
        ndarray
            Logits (n, K); z_1 - z_0 (n,) for two classes.
        """
        Z = self._logits(X)
        return Z[:, 1] - Z[:, 0] if self.classes_.size == 2 else Z

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities.

        Parameters
        ----------
        X : array-like
            Features, as in ``fit``.

        Returns
        -------
        ndarray of shape (n, K)
            Softmax of the logits; columns in ``classes_`` order.
        """
        Z = self._logits(X).astype(np.float64)
        Z -= Z.max(axis=1, keepdims=True)
        P = np.exp(Z)
        return P / P.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """Predicted labels.

        Parameters
        ----------
        X : array-like
            Features, as in ``fit``.

        Returns
        -------
        ndarray of shape (n,)
            The most probable class label (the first in ``classes_`` on exact ties).
        """
        Z = self._logits(X)  # first: it raises NotFittedError before classes_ is read
        return self.classes_[np.argmax(Z, axis=1)]
