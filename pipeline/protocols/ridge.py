"""Least-squares / ridge probe with exact leave-one-out selection (PROTOCOLS.md section 4).

The closed-form solve lives in small pure functions (big_vision fewshot_lsr style); the
estimator only validates input and moves arrays. Everything is float64.

Derivation. Targets T (n x K) in {-1, +1}, one-vs-rest. With an unpenalised bias the
optimal bias makes the fit pass through the means, so with Hc = H - 1 mu^T and
Tc = T - 1 t^T the slope is the ridge solution on centred data,
    B = (Hc^T Hc + lambda I)^-1 Hc^T Tc,    b = t - B^T mu.
Take the thin SVD Hc = U diag(s) V^T (rank r, zero singular values dropped) and
Q = U^T Tc (r x K). Then
    B = V diag(s / (s^2 + lambda)) Q                          (lambda = 0: pseudo-inverse)
and the hat matrix of the full model (bias included) is
    S = 11^T / n + U diag(s^2 / (s^2 + lambda)) U^T.
Leave-one-out without refits: e_(i) = (t_i - (S T)_i) / (1 - S_ii). Both parts are written
so that nothing cancels when S_ii is close to 1 (n <= d, tiny lambda), with
f = lambda / (s^2 + lambda):
    T - S T  = (Tc - U Q) + U diag(f) Q        (first term: outside span(1, U); fixed)
    1 - S_ii = (1 - 1/n - ||U_i||^2) + sum_j U_ij^2 f_j
When span(1, U) is all of R^n (full row rank) the fixed terms are exactly zero. One SVD
serves every lambda; each lambda then costs one (n x r) @ (r x K) product.
Without a bias drop the 1 column: no centring and no 1/n term.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Real
from typing import Any

import numpy as np
import scipy.linalg
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils._param_validation import Interval
from sklearn.utils.validation import check_is_fitted

from pipeline.errors import ConfigError
from pipeline.protocols._validation import check_labels, check_min_classes, validate_features

__all__ = ["DEFAULT_ALPHAS", "RidgeProbe", "one_vs_rest_targets", "ridge_spectrum",
           "ridge_coefficients", "loo_residuals", "press"]

#: The ridge grid of PROTOCOLS.md: 1e-8 .. 1e4, one value per decade (13 values).
DEFAULT_ALPHAS: np.ndarray = 10.0 ** np.arange(-8, 5)

# The Gram-matrix eigendecomposition is ~7x faster than an SVD for n >> d but squares the
# condition number; it is used only when kappa(Hc)^2 stays below this, so that the
# relative error of every s^2 (about eps * kappa^2) stays near 1e-10.
_GRAM_MAX_CONDITION = 1e6


@dataclass(frozen=True)
class RidgeSpectrum:
    """Everything the ridge solutions and LOO residuals of one (H, T) share."""

    U: np.ndarray  # (n, r) left singular vectors of the (centred) features
    s: np.ndarray  # (r,) nonzero singular values
    Vt: np.ndarray  # (r, d)
    Q: np.ndarray  # (r, K) = U^T Tc
    resid0: np.ndarray  # (n, K) part of T - S T outside span(1, U); lambda-free
    lev0: np.ndarray  # (n,) part of 1 - S_ii outside span(1, U); lambda-free
    h_mean: np.ndarray  # (d,) zeros without intercept
    t_mean: np.ndarray  # (K,) zeros without intercept


def one_vs_rest_targets(y_index: np.ndarray, n_classes: int) -> np.ndarray:
    """T in {-1, +1}^(n x K): +1 in the column of the true class (y as indices 0..K-1)."""
    T = -np.ones((y_index.shape[0], n_classes))
    T[np.arange(y_index.shape[0]), y_index] = 1.0
    return T


def _thin_svd(Hc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD with the numerically zero singular values dropped (numpy's rank rule)."""
    n, d = Hc.shape
    if n >= 2 * d:
        # Eigen-decomposition of the d x d Gram: cost n d^2 for one product, instead of
        # the SVD's several passes; only when well conditioned (see _GRAM_MAX_CONDITION).
        w, V = np.linalg.eigh(Hc.T @ Hc)
        if w[0] > 0 and w[-1] <= _GRAM_MAX_CONDITION * w[0]:
            s = np.sqrt(w[::-1])
            Vt = V[:, ::-1].T
            return (Hc @ Vt.T) / s, s, Vt
    try:
        U, s, Vt = scipy.linalg.svd(Hc, full_matrices=False, lapack_driver="gesdd")
    except np.linalg.LinAlgError:  # gesdd rarely fails to converge; gesvd is the fallback
        U, s, Vt = scipy.linalg.svd(Hc, full_matrices=False, lapack_driver="gesvd")
    keep = s > (s[0] * max(n, d) * np.finfo(np.float64).eps if s.size else 0.0)
    return U[:, keep], s[keep], Vt[keep]


def ridge_spectrum(H: np.ndarray, T: np.ndarray, fit_intercept: bool = True) -> RidgeSpectrum:
    """One decomposition of (H, T) that serves every lambda (see the module docstring)."""
    H = np.asarray(H, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    n, d = H.shape
    if fit_intercept:
        h_mean, t_mean = H.mean(axis=0), T.mean(axis=0)
        Hc, Tc = H - h_mean, T - t_mean
    else:
        h_mean, t_mean = np.zeros(d), np.zeros(T.shape[1])
        Hc, Tc = H, T
    U, s, Vt = _thin_svd(Hc)
    Q = U.T @ Tc
    if s.size == n - int(fit_intercept):
        # span(1, U) is all of R^n: every point is fitted exactly at lambda = 0, and the
        # lambda-free parts are exactly zero (computing them would only leave round-off).
        resid0 = np.zeros_like(Tc)
        lev0 = np.zeros(n)
    else:
        resid0 = Tc - U @ Q
        lev0 = 1.0 - np.einsum("ij,ij->i", U, U) - (1.0 / n if fit_intercept else 0.0)
        np.maximum(lev0, 0.0, out=lev0)  # a leverage is at most 1; clip round-off
    return RidgeSpectrum(U, s, Vt, Q, resid0, lev0, h_mean, t_mean)


def ridge_coefficients(spec: RidgeSpectrum, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Slopes B (d, K) and bias b (K,) at ``alpha``: B = V diag(s / (s^2 + alpha)) Q."""
    B = spec.Vt.T @ ((spec.s / (spec.s**2 + alpha))[:, None] * spec.Q)
    return B, spec.t_mean - spec.h_mean @ B


def loo_residuals(spec: RidgeSpectrum, alpha: float, U2: np.ndarray | None = None) -> np.ndarray:
    """Exact leave-one-out residuals e_(i) = t_i - prediction without i, shape (n, K).

    Rows whose leverage is exactly one (possible only at alpha = 0) come out inf: that
    point cannot be predicted without itself. ``U2`` is ``spec.U ** 2``, if precomputed.
    """
    f = alpha / (spec.s**2 + alpha)  # shrinkage of each direction; 0 at alpha = 0
    resid = spec.resid0 + spec.U @ (f[:, None] * spec.Q)  # T - S T
    denom = spec.lev0 + (spec.U**2 if U2 is None else U2) @ f  # 1 - S_ii
    with np.errstate(divide="ignore", invalid="ignore"):
        E = resid / denom[:, None]
    E[denom <= 0] = np.inf
    return E


def press(E: np.ndarray) -> float:
    """PRESS = (1 / nK) sum_i ||e_(i)||^2, the mean squared LOO residual."""
    return float(np.mean(E**2))


class RidgeProbe(ClassifierMixin, BaseEstimator):
    """Least squares to one-vs-rest {-1, +1} targets, with exact-LOO choice of lambda.

    Parameters
    ----------
    alpha : L2 weight lambda on the slopes (never on the bias); 0 is plain least squares,
        minimum-norm when the features are rank deficient. Used when ``alphas`` is None.
    fit_intercept : fit an unpenalised bias (features and targets centred).
    alphas : grid of lambdas (e.g. ``DEFAULT_ALPHAS``); ``alpha_`` is the one with the
        smallest PRESS, computed for all of them from one SVD. Ties go to the larger alpha.

    Attributes
    ----------
    classes_, coef_ (K, d), intercept_ (K,), alpha_, press_ (one per alpha tried, in the
    given order), loo_decision_ (n, K): leave-one-out predictions of the targets at
    ``alpha_`` (T minus the LOO residuals), n_features_in_. At alpha = 0 with n <= d the
    fit interpolates and a left-out point has leverage one: its LOO residual, and PRESS,
    are inf (undefined), never a silent number.

    For two classes the two target columns are negatives of each other and
    ``decision_function`` returns the classes_[1] column only, as sklearn does.
    """

    _parameter_constraints: dict[str, list[Any]] = {
        "alpha": [Interval(Real, 0, None, closed="left")],
        "fit_intercept": ["boolean"],
        "alphas": ["array-like", None],
    }

    def __init__(self, alpha: float = 1e-4, fit_intercept: bool = True, alphas: Any = None):
        self.alpha = alpha
        self.fit_intercept = fit_intercept
        self.alphas = alphas

    def _alpha_grid(self) -> np.ndarray:
        if self.alphas is None:
            return np.array([float(self.alpha)])
        grid = np.asarray(self.alphas, dtype=np.float64).ravel()
        bad = ~np.isfinite(grid) | (grid < 0)
        if grid.size == 0 or bad.any():
            raise ConfigError(
                f"alphas must be a non-empty array of finite values >= 0; got {grid.size} "
                f"value(s), {int(bad.sum())} invalid (e.g. {grid[bad][:3].tolist()})"
            )
        return grid

    def fit(self, X: Any, y: Any) -> RidgeProbe:
        """Fit on features ``X`` (n, d) and integer labels ``y`` (n,)."""
        self._validate_params()
        X = validate_features(self, X, reset=True)
        y = check_labels(y, n_samples=X.shape[0])
        self.classes_ = check_min_classes(y)
        grid = self._alpha_grid()
        T = one_vs_rest_targets(np.searchsorted(self.classes_, y), self.classes_.size)

        spec = ridge_spectrum(X, T, self.fit_intercept)
        U2 = spec.U**2
        self.press_ = np.array([press(loo_residuals(spec, a, U2)) for a in grid])
        # Ties (equal PRESS) go to the larger alpha: the stronger regularisation.
        tied = np.flatnonzero(self.press_ == self.press_.min())
        self.alpha_ = float(grid[tied[np.argmax(grid[tied])]])
        self.loo_decision_ = T - loo_residuals(spec, self.alpha_, U2)
        B, b = ridge_coefficients(spec, self.alpha_)
        self.coef_ = np.ascontiguousarray(B.T)
        self.intercept_ = b
        return self

    def decision_function(self, X: Any) -> np.ndarray:
        """Scores [1, h] B: (n, K), or the classes_[1] column (n,) for two classes."""
        check_is_fitted(self)
        X = validate_features(self, X, reset=False)
        scores = X.astype(np.float64, copy=False) @ self.coef_.T + self.intercept_
        return scores[:, 1] if self.classes_.size == 2 else scores

    def predict(self, X: Any) -> np.ndarray:
        """Class of the largest score (first class on exact ties)."""
        check_is_fitted(self)
        scores = self.decision_function(X)
        if scores.ndim == 1:
            return self.classes_[(scores > 0).astype(np.intp)]
        return self.classes_[np.argmax(scores, axis=1)]
