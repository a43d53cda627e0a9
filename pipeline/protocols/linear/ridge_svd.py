"""The ridge probe's closed form for few rows: one SVD of the centred features, float64.

B = (Z^T Z + P)^-1 Z^T T with Z = [1, H], P = diag(0, lambda I) (bias not penalised), or
Z = H, P = lambda I without a bias, T the {-1, +1} one-vs-rest targets (2Y - 1 for
multi-label indicators); prediction argmax_k of [1, h] B. lambda is chosen by the
smallest PRESS (mean squared exact leave-one-out residual) over a grid, without refits.

The closed-form solve lives in small pure functions (big_vision fewshot_lsr style). This
module is the route for few rows (n < 2d, where an SVD of the centred features costs
O(d^2) memory); ``ridge_gram`` is the blocked d x d Gram route for many rows, which
computes the same quantities without any (n x d) or (n x K) array; ``ridge`` holds the
estimator.

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

import numpy as np
import scipy.linalg

from pipeline.protocols.blocks import FeatureRows
from pipeline.protocols.linear.ridge_gram import RidgeFit, select_alpha

__all__ = ["RidgeSpectrum", "loo_residuals", "one_vs_rest_targets", "press", "ridge_coefficients",
           "ridge_spectrum", "svd_ridge"]


@dataclass(frozen=True)
class RidgeSpectrum:
    """Everything the ridge solutions and LOO residuals of one (H, T) share."""

    U: np.ndarray
    s: np.ndarray
    Vt: np.ndarray
    Q: np.ndarray
    resid0: np.ndarray
    lev0: np.ndarray
    h_mean: np.ndarray
    t_mean: np.ndarray


def one_vs_rest_targets(y_index: np.ndarray, n_classes: int) -> np.ndarray:
    """T in {-1, +1}^(n x K): +1 in the column of the true class."""
    T = -np.ones((y_index.shape[0], n_classes))
    T[np.arange(y_index.shape[0]), y_index] = 1.0
    return T


def _thin_svd(Hc: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD with the numerically zero singular values dropped (numpy's rank rule)."""
    n, d = Hc.shape
    try:
        U, s, Vt = scipy.linalg.svd(Hc, full_matrices=False, lapack_driver="gesdd")
    except np.linalg.LinAlgError:  # gesdd rarely fails to converge; gesvd is the fallback
        U, s, Vt = scipy.linalg.svd(Hc, full_matrices=False, lapack_driver="gesvd")
    keep = s > (s[0] * max(n, d) * np.finfo(np.float64).eps if s.size else 0.0)
    return U[:, keep], s[keep], Vt[keep]


def ridge_spectrum(H: np.ndarray, T: np.ndarray, fit_intercept: bool = True) -> RidgeSpectrum:
    """One SVD of (centred) H that serves every lambda (see the module docstring)."""
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
    """Slopes and bias at ``alpha``: B = V diag(s / (s^2 + alpha)) Q, b = t - mu B."""
    B = spec.Vt.T @ ((spec.s / (spec.s**2 + alpha))[:, None] * spec.Q)
    return B, spec.t_mean - spec.h_mean @ B


def loo_residuals(spec: RidgeSpectrum, alpha: float, U2: np.ndarray | None = None) -> np.ndarray:
    """Exact leave-one-out residuals e_(i) = t_i - prediction without i."""
    # Rows whose leverage is exactly one (possible only at alpha = 0) come out inf: that
    # point cannot be predicted without itself.
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


def svd_ridge(rows: FeatureRows, labels: np.ndarray, n_classes: int, alphas: np.ndarray,
              fit_intercept: bool, store_loo: bool) -> RidgeFit:
    """The ridge fit from one thin SVD of all rows in float64 (for few rows: O(d^2) memory)."""
    H = rows.numpy(np.float64)
    T = 2.0 * labels - 1.0 if labels.ndim == 2 else one_vs_rest_targets(labels, n_classes)
    spec = ridge_spectrum(H, T, fit_intercept)
    U2 = spec.U**2
    press_values = np.array([press(loo_residuals(spec, a, U2)) for a in alphas])
    alpha = select_alpha(press_values, alphas)
    loo = T - loo_residuals(spec, alpha, U2) if store_loo else None
    B, b = ridge_coefficients(spec, alpha)
    return RidgeFit(np.ascontiguousarray(B.T), b, alpha, press_values, loo)
