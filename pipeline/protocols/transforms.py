"""Feature preprocessing fitted on the train split only (PROTOCOLS.md section 2).

``none``, ``l2`` (rows to unit norm), ``standardize`` (per-feature train mean and std) and
``whiten`` (ZCA: (h - mu) Sigma^(-1/2) with the train covariance). Statistics are computed
in float64; the output keeps the input's float dtype (float32 stays float32).
"""

from __future__ import annotations

from numbers import Real
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import DataValidationError, unknown_name
from pipeline.protocols._validation import validate_features

__all__ = ["L2Normalize", "Standardize", "Whiten", "TRANSFORMS", "make_transform", "l2_normalize"]


def l2_normalize(X: np.ndarray, name: str = "X", row_offset: int = 0) -> np.ndarray:
    """Rows of ``X`` scaled to unit Euclidean norm, in X's dtype.

    A zero row has no direction; it raises DataValidationError naming the rows (numbered
    from ``row_offset``) instead of being silently left at zero.
    """
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    zero = np.flatnonzero(norms == 0)
    if zero.size:
        rows = ", ".join(str(r + row_offset) for r in zero[:5])
        raise DataValidationError(
            f"{name} has {zero.size} all-zero row(s) (rows {rows}{', ...' if zero.size > 5 else ''}) "
            "that cannot be L2-normalised: cosine similarity is undefined for them"
        )
    return (X / norms[:, None]).astype(X.dtype, copy=False)


class _FeatureTransform(OneToOneFeatureMixin, TransformerMixin, BaseEstimator):
    """Shared plumbing: validation, fitted check, float32/float64 preserved."""

    def __sklearn_tags__(self):  # noqa: D105 - sklearn protocol
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    def _check_transform_input(self, X: Any) -> np.ndarray:
        check_is_fitted(self)
        return validate_features(self, X, reset=False)


class L2Normalize(_FeatureTransform):
    """Scale each row to unit L2 norm (stateless; ``fit`` only records the width)."""

    def fit(self, X: Any, y: Any = None) -> L2Normalize:
        """Record ``n_features_in_``; nothing is learned."""
        validate_features(self, X, reset=True)  # sets n_features_in_, the fitted mark
        return self

    def transform(self, X: Any) -> np.ndarray:
        """Rows of X divided by their norms; an all-zero row is an error."""
        return l2_normalize(self._check_transform_input(X))


class Standardize(_FeatureTransform):
    """Per-feature (h - mean) / std with the train split's mean and std (ddof = 0).

    A constant train feature gets std 1, as in sklearn's StandardScaler: it becomes 0
    everywhere on train, and test values keep their offset from the train constant.
    """

    def fit(self, X: Any, y: Any = None) -> Standardize:
        """Learn ``mean_`` and ``scale_`` (float64) from the train features."""
        X = validate_features(self, X, reset=True)
        self.mean_ = X.mean(axis=0, dtype=np.float64)
        std = X.std(axis=0, dtype=np.float64)
        # "constant" up to round-off of the mean: relative to the feature's magnitude
        tiny = 10 * np.finfo(np.float64).eps * np.maximum(np.abs(self.mean_), 1.0)
        self.scale_ = np.where(std > tiny, std, 1.0)
        return self

    def transform(self, X: Any) -> np.ndarray:
        """Standardised features, in the input's dtype."""
        X = self._check_transform_input(X)
        return ((X - self.mean_) / self.scale_).astype(X.dtype, copy=False)


class Whiten(_FeatureTransform):
    """ZCA whitening: (h - mu) Sigma^(-1/2), Sigma the train covariance (ddof = 0).

    ``eps`` regularises: Sigma + eps * (trace(Sigma) / d) I. The ridge is relative to the
    mean variance so a global rescale of the features does not change the result. With
    the default ``eps = 0`` the transform is exact, so Euclidean distances afterwards are
    Mahalanobis distances and every invertible affine map of the features is undone
    (PROTOCOLS.md section 9); a rank-deficient covariance (e.g. fewer train samples than
    features) then raises DataValidationError asking for ``eps > 0``.
    """

    _parameter_constraints: dict[str, list[Any]] = {"eps": [Interval(Real, 0, None, closed="left")]}

    def __init__(self, eps: float = 0.0):
        self.eps = eps

    def fit(self, X: Any, y: Any = None) -> Whiten:
        """Learn ``mean_`` and the symmetric ``whitening_`` matrix Sigma^(-1/2)."""
        self._validate_params()
        X = validate_features(self, X, reset=True)
        n, d = X.shape
        self.mean_ = X.mean(axis=0, dtype=np.float64)
        Xc = X.astype(np.float64) - self.mean_
        cov = (Xc.T @ Xc) / n
        w, V = np.linalg.eigh(cov)
        ridge = self.eps * np.trace(cov) / d
        # numpy's matrix-rank tolerance, applied to the eigenvalues of Sigma
        tol = max(w[-1], 0.0) * d * np.finfo(np.float64).eps
        rank = int((w > tol).sum())
        if ridge <= 0 and rank < d:
            raise DataValidationError(
                f"The train covariance is rank deficient (rank {rank} of {d} features, "
                f"from {n} samples), so Sigma^(-1/2) does not exist; set Whiten(eps=...) "
                "> 0, e.g. 1e-6, to regularise (Sigma + eps * mean variance * I)"
            )
        self.whitening_ = (V / np.sqrt(np.maximum(w, 0.0) + ridge)) @ V.T
        return self

    def transform(self, X: Any) -> np.ndarray:
        """Whitened features, in the input's dtype."""
        X = self._check_transform_input(X)
        return ((X - self.mean_) @ self.whitening_).astype(X.dtype, copy=False)


#: Preprocessing names of PROTOCOLS.md section 2 and their transformer classes.
TRANSFORMS: dict[str, type] = {
    "none": FunctionTransformer,
    "l2": L2Normalize,
    "standardize": Standardize,
    "whiten": Whiten,
}


def make_transform(name: str, **params: Any) -> TransformerMixin:
    """A fresh, unfitted transformer for ``name`` (``none`` is sklearn's identity
    FunctionTransformer); ``params`` go to its constructor, e.g. ``eps`` for whiten."""
    if name not in TRANSFORMS:
        raise unknown_name("transform", name, TRANSFORMS)
    return TRANSFORMS[name](**params)
