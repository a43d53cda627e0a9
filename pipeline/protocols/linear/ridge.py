"""Least-squares / ridge probe with exact leave-one-out selection of lambda.

B = (Z^T Z + P)^-1 Z^T T with Z = [1, H], P = diag(0, lambda I) (bias not penalised), or
Z = H, P = lambda I without a bias, T the {-1, +1} one-vs-rest targets (2Y - 1 for
multi-label indicators); prediction argmax_k of [1, h] B. lambda is chosen by the
smallest PRESS (mean squared exact leave-one-out residual) over a grid, without refits.

The closed-form solves live in ``ridge_svd`` (few rows: one SVD) and ``ridge_gram``
(many rows: the d x d Gram matrix, row blocks, any device); this module chooses between
them and holds the estimator, which only validates input and moves arrays. Everything
is float64.

The derivation of the exact leave-one-out residuals is in ``ridge_svd``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import ConfigError
from pipeline.protocols.blocks import FeatureRows, RowsPredictMixin
from pipeline.protocols.inputs.devices import resolve_device
from pipeline.protocols.linear.linear_loss import linear_score_blocks
from pipeline.protocols.linear.ridge_gram import gram_ridge
from pipeline.protocols.linear.ridge_svd import (  # noqa: F401  (the closed form, public here too)
    loo_residuals, one_vs_rest_targets, press, ridge_coefficients, ridge_spectrum, svd_ridge,
)
from pipeline.protocols.inputs.features import validate_features
from pipeline.protocols.inputs.labels import encode_targets
from pipeline.protocols.inputs.parameters import check_grid, check_number

__all__ = ["DEFAULT_ALPHAS", "RidgeProbe", "fit_ridge", "loo_residuals", "one_vs_rest_targets", "press",
           "ridge_coefficients", "ridge_spectrum"]

#: The ridge protocol's lambda grid: 1e-8 .. 1e4, one value per decade (13 values).
DEFAULT_ALPHAS: np.ndarray = 10.0 ** np.arange(-8, 5)
#: Badly conditioned problems with at most this many feature values take the direct SVD
#: route (its float64 copies are then a bounded, small term); larger ones the QR route.
SVD_MAX_ELEMENTS = 1 << 21


def fit_ridge(rows: FeatureRows, labels: np.ndarray, n_classes: int, alphas: np.ndarray,
              fit_intercept: bool = True, device: Any = "auto", store_loo: bool = False, method: str = "auto"):
    """The ridge probe on ``rows``, lambda by exact leave-one-out PRESS over ``alphas``."""
    # Few rows (n < 2d) take one SVD of the centred features, in float64 on the CPU (its
    # memory is O(d^2) then); more rows the blocked d x d Gram route of ``ridge_gram`` on
    # ``device``, whose memory does not grow with n. When the features are too badly
    # conditioned for the Gram eigendecomposition, problems of at most
    # ``SVD_MAX_ELEMENTS`` feature values take the SVD as well, larger ones the streaming
    # QR route. All compute the same quantities (to round-off; for rank-deficient, badly
    # conditioned features the least-squares solution itself is only defined to about
    # eps * kappa^2).
    alphas = np.asarray(alphas, dtype=np.float64)
    n, d = len(rows), rows.n_features
    if method not in ("auto", "svd", "gram"):
        raise ConfigError(f"method={method!r} is not one of 'auto', 'svd', 'gram'")
    if method == "svd" or (method == "auto" and n < 2 * d):
        return svd_ridge(rows, labels, n_classes, alphas, fit_intercept, store_loo)
    small = method == "auto" and n * d <= SVD_MAX_ELEMENTS
    fit = gram_ridge(rows, labels, n_classes, alphas, fit_intercept, resolve_device(device), store_loo,
                     qr_fallback=not small)
    return svd_ridge(rows, labels, n_classes, alphas, fit_intercept, store_loo) if fit is None else fit


class RidgeProbe(RowsPredictMixin, ClassifierMixin, BaseEstimator):
    """Least squares to one-vs-rest {-1, +1} targets, with exact-LOO choice of lambda.

    Parameters
    ----------
    alpha : float
        L2 weight lambda on the slopes (never on the bias); 0 is plain least squares,
        minimum-norm when the features are rank deficient. Used when ``alphas`` is None.
    fit_intercept : bool
        Fit an unpenalised bias (features and targets centred).
    alphas : array-like or None
        Grid of lambdas (e.g. ``DEFAULT_ALPHAS``); ``alpha_`` is the one with the
        smallest PRESS, computed for all of them from one decomposition. Ties go to the
        larger alpha.
    device : str, torch.device or None
        Compute device for many rows (n >= 2d): ``auto``/None, ``cpu``, ``cuda[:i]``.
    store_loo : bool
        Keep ``loo_decision_``, the (n, K) leave-one-out predictions (memory grows with n).

    Attributes
    ----------
    classes_ : numpy.ndarray
        The labels as given (sorted); ``arange(K)`` for multi-label indicators.
    coef_ : numpy.ndarray of shape (K, d)
    intercept_ : numpy.ndarray of shape (K,)
    alpha_ : float
    press_ : numpy.ndarray
        One per alpha tried, in the given order.
    loo_decision_ : numpy.ndarray of shape (n, K)
        Only with ``store_loo``: T minus the LOO residuals at ``alpha_``.
    multilabel_ : bool
    n_features_in_ : int

    Notes
    -----
    At alpha = 0 with n <= d the fit interpolates and a left-out point has leverage one:
    its LOO residual, and PRESS, are inf (undefined), never a silent number. For two
    classes the two target columns are negatives of each other and
    ``decision_function`` returns the classes_[1] column only, as scikit-learn does.
    """

    def __init__(self, alpha: float = 1e-4, fit_intercept: bool = True, alphas: Any = None,
                 device: Any = None, store_loo: bool = False):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.alphas = alphas
        self.device = device
        self.store_loo = store_loo

    def _alpha_grid(self) -> np.ndarray:
        check_number(self.alpha, "alpha", 0)
        if not isinstance(self.fit_intercept, (bool, np.bool_)):
            raise ConfigError(f"The 'fit_intercept' parameter must be a bool; got {self.fit_intercept!r}")
        if self.alphas is None:
            return np.array([float(self.alpha)])
        return check_grid(self.alphas, "alphas", low_open=False, unique=False)

    def fit(self, X: Any, y: Any) -> RidgeProbe:
        """Fit on features ``X`` and labels ``y``.

        Parameters
        ----------
        X : array-like of shape (n, d)
            Features (float16/32/64 used as they are).
        y : array-like of shape (n,) or (n, K)
            Class labels of any sortable kind, or 0/1 multi-label indicators.

        Returns
        -------
        RidgeProbe
            self.
        """
        X = validate_features(self, X, reset=True)
        return self.fit_rows(FeatureRows.of(X), y)

    def fit_rows(self, rows: FeatureRows, y: Any) -> RidgeProbe:
        """Fit on ``FeatureRows`` (in memory or streamed; never copied whole for n >= 2d).

        Parameters
        ----------
        rows : FeatureRows
        y : array-like of shape (n,) or (n, K)
            Labels of the rows, or 0/1 multi-label indicators.

        Returns
        -------
        RidgeProbe
            self.
        """
        grid = self._alpha_grid()
        self.classes_, labels, self.multilabel_ = encode_targets(y, len(rows))
        self.n_features_in_ = rows.n_features
        self.device_ = str(resolve_device(self.device))
        fit = fit_ridge(rows, labels, self.classes_.size, grid, self.fit_intercept, self.device_, self.store_loo)
        self.coef_, self.intercept_, self.alpha_, self.press_ = fit.coef, fit.intercept, fit.alpha, fit.press
        if self.store_loo:
            self.loo_decision_ = fit.loo_decision
        return self

    def score_blocks(self, rows: FeatureRows) -> Iterator[tuple[Any, int]]:
        """Yield (scores (b, K) float64 torch tensor, start) of [1, h] B over ``rows``.

        Parameters
        ----------
        rows : FeatureRows

        Yields
        ------
        tuple of (torch.Tensor, int)
        """
        check_is_fitted(self)
        yield from linear_score_blocks(rows, self.coef_, self.intercept_, resolve_device(self.device))

    def decision_function(self, X: Any) -> np.ndarray:
        """Scores [1, h] B.

        Parameters
        ----------
        X : array-like of shape (n, d)

        Returns
        -------
        numpy.ndarray
            (n, K), or the classes_[1] column (n,) for two single-label classes.
        """
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        scores = np.concatenate([z.cpu().numpy() for z, _ in self.score_blocks(FeatureRows.of(X))])
        return scores[:, 1] if self.classes_.size == 2 and not self.multilabel_ else scores

    def predict(self, X: Any) -> np.ndarray:
        """Class of the largest score (first class on exact ties); indicators for multi-label.

        Parameters
        ----------
        X : array-like of shape (n, d)

        Returns
        -------
        numpy.ndarray
            (n,) labels from ``classes_``, or (n, K) 0/1 (score > 0) for multi-label.
        """
        scores = self.decision_function(X)
        if self.multilabel_:
            return (scores > 0).astype(np.int64)
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(np.intp)]
        return self.classes_[np.argmax(scores, axis=1)]
