"""RidgeProbe: closed form vs sklearn, exact LOO vs explicit refits, PRESS selection."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, Ridge, RidgeCV

from pipeline.errors import DataValidationError
from pipeline.protocols.ridge import (
    DEFAULT_ALPHAS,
    RidgeProbe,
    loo_residuals,
    one_vs_rest_targets,
    ridge_spectrum,
)


def _problem(n: int, d: int, k: int = 4, seed: int = 0, scale: float = 1.0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % k  # every class present
    rng.shuffle(y)
    centres = rng.standard_normal((k, d))
    X = (centres[y] + rng.standard_normal((n, d))) * scale + 3.0
    return X, y, one_vs_rest_targets(y, k)


# (n, d): n >= 2d takes the Gram route, n < 2d the SVD route, n < d is the few-shot case.
SHAPES = [(120, 10), (30, 20), (12, 40)]


def test_default_alphas():
    assert DEFAULT_ALPHAS.shape == (13,)
    np.testing.assert_allclose(DEFAULT_ALPHAS[[0, -1]], [1e-8, 1e4])
    np.testing.assert_allclose(np.diff(np.log10(DEFAULT_ALPHAS)), 1.0)


@pytest.mark.parametrize("n,d", SHAPES)
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("alpha", [1e-3, 1.0, 30.0])
def test_matches_sklearn_ridge(n, d, fit_intercept, alpha):
    X, y, T = _problem(n, d)
    probe = RidgeProbe(alpha=alpha, fit_intercept=fit_intercept).fit(X, y)
    ref = Ridge(alpha=alpha, fit_intercept=fit_intercept, solver="svd").fit(X, T)
    np.testing.assert_allclose(probe.coef_, ref.coef_, atol=1e-9, rtol=1e-8)
    np.testing.assert_allclose(probe.intercept_, ref.intercept_, atol=1e-9, rtol=1e-8)
    np.testing.assert_allclose(probe.decision_function(X), ref.predict(X), atol=1e-9, rtol=1e-8)
    np.testing.assert_array_equal(probe.predict(X), np.argmax(ref.predict(X), axis=1))


@pytest.mark.parametrize("n,d", SHAPES)
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_alpha_zero_matches_least_squares(n, d, fit_intercept):
    X, y, T = _problem(n, d)
    probe = RidgeProbe(alpha=0.0, fit_intercept=fit_intercept).fit(X, y)
    ref = LinearRegression(fit_intercept=fit_intercept).fit(X, T)  # min-norm lstsq
    np.testing.assert_allclose(probe.coef_, ref.coef_, atol=1e-9, rtol=1e-7)
    np.testing.assert_allclose(probe.intercept_, ref.intercept_, atol=1e-9, rtol=1e-7)
    np.testing.assert_allclose(probe.decision_function(X), ref.predict(X), atol=1e-8)


def test_alpha_zero_rank_deficient_and_badly_scaled():
    X, y, T = _problem(200, 8)
    X[:, 7] = 2.0 * X[:, 3] - X[:, 1]  # exactly collinear: min-norm solution
    X *= 10.0 ** np.linspace(-3, 3, 8)  # kappa^2 far beyond the Gram route's limit
    probe = RidgeProbe(alpha=0.0).fit(X, y)
    # numpy's SVD lstsq as the reference: sklearn's LinearRegression (LAPACK gelsd) drops
    # the 1.6e-2 singular value here and returns a worse least-squares fit.
    mu, t = X.mean(axis=0), T.mean(axis=0)
    B = np.linalg.lstsq(X - mu, T - t, rcond=None)[0]
    np.testing.assert_allclose(probe.coef_, B.T, atol=1e-9, rtol=1e-7)
    np.testing.assert_allclose(probe.decision_function(X), (X - mu) @ B + t, atol=1e-9)


def test_least_squares_with_bias_ignores_invertible_affine_maps():
    # PROTOCOLS.md section 9, first row: lambda = 0 with a bias sees only the affine span
    X, y, _ = _problem(150, 6)
    Xt, _, _ = _problem(60, 6, seed=1)
    rng = np.random.default_rng(2)
    A, b = rng.standard_normal((6, 6)) + 3 * np.eye(6), rng.standard_normal(6)
    base = RidgeProbe(alpha=0.0).fit(X, y).decision_function(Xt)
    moved = RidgeProbe(alpha=0.0).fit(X @ A + b, y).decision_function(Xt @ A + b)
    np.testing.assert_allclose(moved, base, atol=1e-9)


def _explicit_loo(X, T, alpha, fit_intercept):
    out = np.empty_like(T)
    for i in range(X.shape[0]):
        keep = np.arange(X.shape[0]) != i
        model = Ridge(alpha=alpha, fit_intercept=fit_intercept, solver="svd")
        if alpha == 0:
            model = LinearRegression(fit_intercept=fit_intercept)
        out[i] = model.fit(X[keep], T[keep]).predict(X[i : i + 1])[0]
    return out


@pytest.mark.parametrize(
    "n,d,alpha",
    [(40, 5, 0.0), (40, 5, 0.5), (25, 8, 1e-2), (10, 30, 1e-3), (10, 30, 10.0)],
)
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_loo_matches_explicit_refits(n, d, alpha, fit_intercept):
    X, y, T = _problem(n, d, k=3)
    spec = ridge_spectrum(X, T, fit_intercept)
    loo_pred = T - loo_residuals(spec, alpha)
    np.testing.assert_allclose(loo_pred, _explicit_loo(X, T, alpha, fit_intercept), atol=1e-9, rtol=1e-8)
    probe = RidgeProbe(alpha=alpha, fit_intercept=fit_intercept, store_loo=True).fit(X, y)
    np.testing.assert_allclose(probe.loo_decision_, loo_pred, atol=1e-12)
    np.testing.assert_allclose(probe.press_, [np.mean((T - loo_pred) ** 2)], rtol=1e-12)


def test_press_absorbs_global_rescale():
    X, y, _ = _problem(60, 12)
    a = 7.5
    base = RidgeProbe(alphas=DEFAULT_ALPHAS).fit(X, y)
    scaled = RidgeProbe(alphas=a**2 * DEFAULT_ALPHAS).fit(a * X, y)
    np.testing.assert_allclose(scaled.press_, base.press_, rtol=1e-9)
    assert scaled.alpha_ == pytest.approx(a**2 * base.alpha_)
    np.testing.assert_array_equal(scaled.predict(a * X), base.predict(X))


@pytest.mark.parametrize("n,d", SHAPES)
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_selected_alpha_matches_ridgecv(n, d, fit_intercept):
    X, y, T = _problem(n, d, k=3)
    alphas = 10.0 ** np.arange(-4, 4)  # RidgeCV's efficient LOO needs alpha > 0
    probe = RidgeProbe(alphas=alphas, fit_intercept=fit_intercept).fit(X, y)
    # RidgeCV's default score is minus the mean squared LOO error over samples and
    # targets, i.e. -PRESS / (n K), and it keeps the first best alpha.
    ref = RidgeCV(alphas=alphas, fit_intercept=fit_intercept).fit(X, T)
    assert probe.alpha_ == ref.alpha_
    assert -probe.press_.min() == pytest.approx(ref.best_score_, rel=1e-8)
    np.testing.assert_allclose(probe.coef_, ref.coef_, atol=1e-9, rtol=1e-7)


def test_grid_press_equals_single_alpha_fits():
    X, y, _ = _problem(50, 6)
    grid = RidgeProbe(alphas=[1e-2, 1.0, 1e2]).fit(X, y)
    singles = [RidgeProbe(alpha=a).fit(X, y).press_[0] for a in [1e-2, 1.0, 1e2]]
    np.testing.assert_allclose(grid.press_, singles, rtol=1e-12)
    assert grid.alpha_ == [1e-2, 1.0, 1e2][int(np.argmin(singles))]


def test_labels_need_not_start_at_zero_and_binary_shape():
    X, y, _ = _problem(40, 3, k=2)
    probe = RidgeProbe().fit(X, y * 5 + 3)  # labels {3, 8}
    np.testing.assert_array_equal(probe.classes_, [3, 8])
    scores = probe.decision_function(X)
    assert scores.shape == (40,)
    np.testing.assert_array_equal(probe.predict(X), np.where(scores > 0, 8, 3))
    assert probe.coef_.shape == (2, 3)


def test_bad_input_errors():
    X, y, _ = _problem(30, 4)
    X_nan = X.copy()
    X_nan[3, 1] = np.nan
    X_nan[7, 2] = np.inf
    with pytest.raises(DataValidationError, match=r"1 NaN and 1 inf .*\(3, 1\), \(7, 2\)"):
        RidgeProbe().fit(X_nan, y)
    with pytest.raises(ValueError, match="29 labels, but X has 30 samples"):
        RidgeProbe().fit(X, y[:-1])
    with pytest.raises(ValueError, match="1 class"):
        RidgeProbe().fit(X, np.zeros(30))
    fractional = r"Unknown label type.*30 of 30 values are not integers \(first \d\.5 at index 0"
    with pytest.raises(ValueError, match=fractional):
        RidgeProbe().fit(X, y + 0.5)
    with pytest.raises(ValueError, match="Unknown label type.*cannot be compared"):
        RidgeProbe().fit(X, np.array(["a", 1] * 15, dtype=object))
    with pytest.raises(ValueError, match="alphas must be .* 1 invalid"):
        RidgeProbe(alphas=[1.0, -1.0]).fit(X, y)
    probe = RidgeProbe().fit(X, y)
    with pytest.raises(ValueError, match="X has 3 features, but RidgeProbe is expecting 4 features"):
        probe.predict(X[:, :3])
    with pytest.raises(ValueError, match="1 NaN"):
        probe.predict(X_nan[:5])
