"""The transformers: feature preprocessing fitted on the train split only."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, OneToOneFeatureMixin, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import DataValidationError, unknown_name
from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.inputs.features import validate_features
from pipeline.protocols.inputs.parameters import check_number

__all__ = [
    "Identity", "L2Normalize", "Standardize", "TRANSFORMS", "Whiten", "fit_row_map", "l2_normalize", "l2_normalize_block",
    "l2_row_scales", "make_transform", "row_scales_of",
]

RowMap = Callable[[torch.Tensor, int], torch.Tensor]


def _zero_rows_error(name: str, rows: np.ndarray) -> DataValidationError:
    shown = ", ".join(str(r) for r in rows[:5])
    return DataValidationError(
        f"{name} has {rows.size} all-zero row(s) (rows {shown}{', ...' if rows.size > 5 else ''}) "
        "that cannot be L2-normalised: cosine similarity is undefined for them"
    )


def l2_normalize_block(block: torch.Tensor, start: int = 0, name: str = "X") -> torch.Tensor:
    """Rows of a torch block scaled to unit Euclidean norm (norms in float64), in its dtype."""
    return (block / _row_norms(block, start, name)[:, None]).to(block.dtype)


def _row_norms(block: torch.Tensor, start: int, name: str) -> torch.Tensor:
    norms = torch.linalg.vector_norm(block, dim=1, dtype=torch.float64)
    zero = torch.nonzero(norms == 0).flatten()
    if zero.numel():
        raise _zero_rows_error(name, zero.cpu().numpy() + start)
    return norms


def l2_row_scales(block: torch.Tensor, start: int = 0, name: str = "X") -> torch.Tensor:
    """The factor 1 / ||h|| (float64) by which ``l2_normalize_block`` scales each row of a block."""
    return 1.0 / _row_norms(block, start, name)


def row_scales_of(row_map: RowMap | None) -> RowMap | None:
    """The per-row scale of a row map that only scales rows (the l2 transform's); else None."""
    # A linear model can then scale its logits, (W h) s, instead of each row, W (h s): the
    # features are read as they are, without a scaled copy of every block.
    return l2_row_scales if row_map is l2_normalize_block else None


def l2_normalize(X: np.ndarray, name: str = "X", row_offset: int = 0) -> np.ndarray:
    """Rows of ``X`` scaled to unit Euclidean norm, in X's dtype."""
    # A zero row has no direction; it raises DataValidationError naming the rows (numbered
    # from ``row_offset``) instead of being silently left at zero.
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    zero = np.flatnonzero(norms == 0)
    if zero.size:
        raise _zero_rows_error(name, zero + row_offset)
    return (X / norms[:, None]).astype(X.dtype, copy=False)


class _FeatureTransform(OneToOneFeatureMixin, TransformerMixin, BaseEstimator, ABC):
    """Shared plumbing: validation, fitted check, float32/float64 preserved, row maps."""

    def __sklearn_tags__(self):  # noqa: D105 - sklearn protocol
        tags = super().__sklearn_tags__()
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    def fit(self, X: Any, y: Any = None) -> _FeatureTransform:
        """Learn the statistics from the train features.

        Parameters
        ----------
        X : array-like of shape (n, d)
        y : ignored

        Returns
        -------
        self
        """
        X = validate_features(self, X, reset=True)
        return self.fit_rows(FeatureRows.of(X))

    def fit_rows(self, rows: FeatureRows, device: Any = None) -> _FeatureTransform:
        """Learn the statistics from ``FeatureRows`` read in blocks.

        Parameters
        ----------
        rows : FeatureRows
        device : torch.device or None
            Where the statistics are accumulated (the CPU by default).

        Returns
        -------
        self
        """
        self.n_features_in_ = rows.n_features
        self._fit_stats(rows, device)
        return self

    def _fit_stats(self, rows: FeatureRows, device: Any) -> None:
        """Nothing to learn by default."""

    @abstractmethod
    def row_map(self, device: Any = None) -> RowMap | None:
        """The fitted transform as ``f(block, start) -> block`` for torch blocks (None: identity).

        Parameters
        ----------
        device : torch.device or None
            Where the blocks live.

        Returns
        -------
        callable or None
        """

    def transform(self, X: Any) -> np.ndarray:
        """The transformed features, in the input's dtype.

        Parameters
        ----------
        X : array-like of shape (n, d)

        Returns
        -------
        numpy.ndarray
        """
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        fn = self.row_map()
        if fn is None:
            return X
        dtype = torch.float64 if X.dtype == np.float64 else torch.float32
        blocks = FeatureRows.of(X).blocks(dtype=dtype)
        return np.concatenate([fn(b, s).numpy() for b, s in blocks]).astype(X.dtype, copy=False)


def _mean(rows: FeatureRows, device: Any) -> torch.Tensor:
    total = torch.zeros(rows.n_features, dtype=torch.float64, device=device)
    for H, _ in rows.blocks(device, torch.float64):
        total += H.sum(dim=0)
    return total / len(rows)


class Identity(_FeatureTransform):
    """No preprocessing (``none``): the features as they are."""

    def row_map(self, device: Any = None) -> None:
        """None: the identity.

        Parameters
        ----------
        device : torch.device or None
        """
        return None


class L2Normalize(_FeatureTransform):
    """Scale each row to unit L2 norm (stateless; ``fit`` only records the width)."""

    def row_map(self, device: Any = None) -> RowMap:
        """Row normalisation; an all-zero row is an error naming it.

        Parameters
        ----------
        device : torch.device or None
            Where the blocks live.

        Returns
        -------
        callable
        """
        return l2_normalize_block


class _CentredTransform(_FeatureTransform):
    """A map (h - mean) op C with fitted constants: ``_map_constants() -> (mean, C, op)``."""

    @abstractmethod
    def _map_constants(self) -> tuple[np.ndarray, np.ndarray, Callable]:
        """The train mean, the fitted constant and the operation applying it."""

    def row_map(self, device: Any = None) -> RowMap:
        """(h - mean) op C (``/ scale``, ``@ W``) computed in float64, returned in the block's dtype.

        Parameters
        ----------
        device : torch.device or None
            Where the blocks live.

        Returns
        -------
        callable
        """
        mean, constant, op = self._map_constants()
        mean, constant = torch.as_tensor(mean, device=device), torch.as_tensor(constant, device=device)
        return lambda H, start: op(H.to(torch.float64) - mean, constant).to(H.dtype)


class Standardize(_CentredTransform):
    """Per-feature (h - mean) / std with the train split's mean and std (ddof = 0).

    A constant train feature gets std 1, as in scikit-learn's StandardScaler: it becomes
    0 everywhere on train, and test values keep their offset from the train constant.
    """

    def _fit_stats(self, rows: FeatureRows, device: Any) -> None:
        mean = _mean(rows, device)
        sq = torch.zeros_like(mean)
        for H, _ in rows.blocks(device, torch.float64):
            sq += ((H - mean) ** 2).sum(dim=0)
        self.mean_ = mean.cpu().numpy()
        std = np.sqrt(sq.cpu().numpy() / len(rows))
        # "constant" up to round-off of the mean: relative to the feature's magnitude
        tiny = 10 * np.finfo(np.float64).eps * np.maximum(np.abs(self.mean_), 1.0)
        self.scale_ = np.where(std > tiny, std, 1.0)

    def _map_constants(self) -> tuple[np.ndarray, np.ndarray, Callable]:
        return self.mean_, self.scale_, torch.div


class Whiten(_CentredTransform):
    """ZCA whitening: (h - mu) Sigma^(-1/2), Sigma the train covariance (ddof = 0).

    Parameters
    ----------
    eps : float
        Regularises: Sigma + eps * (trace(Sigma) / d) I. The ridge is relative to the
        mean variance so a global rescale of the features does not change the result.
        With the default ``eps = 0`` the transform is exact, so Euclidean distances
        afterwards are Mahalanobis distances and every invertible affine map of the
        features is undone; a rank-deficient covariance (e.g. fewer train samples than
        features) then raises DataValidationError asking for ``eps > 0``.
    """

    def __init__(self, eps: float = 0.0):
        self.eps = eps

    def _fit_stats(self, rows: FeatureRows, device: Any) -> None:
        check_number(self.eps, "eps", 0)
        n, d = len(rows), rows.n_features
        mean = _mean(rows, device)
        cov = torch.zeros((d, d), dtype=torch.float64, device=device)
        for H, _ in rows.blocks(device, torch.float64):
            Hc = H - mean
            cov += Hc.T @ Hc
        cov = cov.cpu().numpy() / n
        self.mean_ = mean.cpu().numpy()
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

    def _map_constants(self) -> tuple[np.ndarray, np.ndarray, Callable]:
        return self.mean_, self.whitening_, torch.matmul


#: Preprocessing names (those of ``pipeline.protocols.transforms.TRANSFORM_NAMES``, in its order) and their
#: transformer classes.
TRANSFORMS: dict[str, type] = {"none": Identity, "l2": L2Normalize, "standardize": Standardize, "whiten": Whiten}


def make_transform(name: str, **params: Any) -> _FeatureTransform:
    """A fresh, unfitted transformer for ``name``.

    Parameters
    ----------
    name : str
        One of ``TRANSFORMS``.
    **params
        Constructor parameters, e.g. ``eps`` for whiten.

    Returns
    -------
    transformer
    """
    if name not in TRANSFORMS:
        raise unknown_name("transform", name, TRANSFORMS)
    return TRANSFORMS[name](**params)


def fit_row_map(name: str, rows: FeatureRows, device: Any = None, **params: Any) -> RowMap | None:
    """Fit transform ``name`` on ``rows``; its row map for blocks on ``device`` (None: none)."""
    return make_transform(name, **params).fit_rows(rows, device).row_map(device)
