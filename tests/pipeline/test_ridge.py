"""RidgeProbe: closed form vs sklearn, exact LOO vs explicit refits, PRESS selection."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, Ridge, RidgeCV

from pipeline.errors import DataValidationError
from pipeline.protocols.linear.ridge import (
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
    # least squares with a bias (lambda = 0) sees only the affine span of the features
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


# -- the blocked Gram route (many rows) against the SVD route and scikit-learn -----------------
def _fit(X, y, K, alphas, fit_intercept, method, rows=None):
    from pipeline.protocols.blocks import FeatureRows
    from pipeline.protocols.linear.ridge import fit_ridge

    rows = FeatureRows.of(X) if rows is None else rows
    return fit_ridge(rows, y, K, np.asarray(alphas, float), fit_intercept, "cpu", store_loo=True, method=method)


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("alphas", [[0.0], [1e-3, 1.0, 30.0], list(DEFAULT_ALPHAS)])
def test_gram_route_equals_svd_route(fit_intercept, alphas):
    X, y, _ = _problem(300, 12, k=5, scale=3.0)
    gram, svd = (_fit(X, y, 5, alphas, fit_intercept, m) for m in ("gram", "svd"))
    assert gram.alpha == svd.alpha
    np.testing.assert_allclose(gram.press, svd.press, rtol=1e-10)
    np.testing.assert_allclose(gram.coef, svd.coef, atol=1e-10, rtol=1e-9)
    np.testing.assert_allclose(gram.intercept, svd.intercept, atol=1e-10, rtol=1e-9)
    np.testing.assert_allclose(gram.loo_decision, svd.loo_decision, atol=1e-10)


def test_gram_route_matches_sklearn_ridge_and_explicit_loo():
    X, y, T = _problem(60, 5, k=3)
    for alpha in (1e-3, 2.0):
        fit = _fit(X, y, 3, [alpha], True, "gram")
        ref = Ridge(alpha=alpha, solver="svd").fit(X, T)
        np.testing.assert_allclose(fit.coef, ref.coef_, atol=1e-9, rtol=1e-8)
        np.testing.assert_allclose(fit.intercept, ref.intercept_, atol=1e-9, rtol=1e-8)
        np.testing.assert_allclose(fit.loo_decision, _explicit_loo(X, T, alpha, True), atol=1e-9, rtol=1e-8)


def test_gram_route_badly_conditioned_takes_the_qr_route():
    # kappa^2 > 1e6: the Gram eigendecomposition is not trusted; a streaming QR of [Hc, Tc]
    # gives the least-squares solution. For a problem this ill-posed (kappa ~ 1e6, nonzero
    # residuals) two backward-stable methods agree to about eps * kappa^2 relative.
    X, y, T = _problem(400, 8)
    X *= 10.0 ** np.linspace(-3, 3, 8)
    fit = _fit(X, y, 4, [0.0], True, "gram")
    mu, t = X.mean(axis=0), T.mean(axis=0)
    B = np.linalg.lstsq(X - mu, T - t, rcond=None)[0]
    np.testing.assert_allclose(fit.coef, B.T, rtol=1e-6, atol=1e-9 * np.abs(B).max())
    np.testing.assert_allclose(fit.coef @ (X - mu).T, (B.T @ (X - mu).T), atol=1e-7)


def test_streamed_rows_equal_in_memory_rows():
    from pipeline.protocols.blocks import FeatureRows

    X, y, _ = _problem(500, 10, k=4)
    blocks = lambda: ((X[i:i + 64], i) for i in range(0, 500, 64))  # noqa: E731
    streamed = _fit(X, y, 4, DEFAULT_ALPHAS, True, "gram", rows=FeatureRows.of(blocks=blocks, n_rows=500, n_features=10))
    in_memory = _fit(X, y, 4, DEFAULT_ALPHAS, True, "gram")
    np.testing.assert_allclose(streamed.coef, in_memory.coef, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(streamed.press, in_memory.press, rtol=1e-12)


def test_multilabel_targets_match_sklearn_ridge():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((80, 6))
    Y = (X[:, :3] + 0.5 * rng.standard_normal((80, 3)) > 0).astype(np.uint8)
    for method in ("svd", "gram"):
        fit = _fit(X, Y, 3, [0.7], True, method)
        ref = Ridge(alpha=0.7, solver="svd").fit(X, 2.0 * Y - 1.0)
        np.testing.assert_allclose(fit.coef, ref.coef_, atol=1e-9, rtol=1e-8)
    probe = RidgeProbe(alpha=0.7).fit(X, Y)
    assert probe.multilabel_ and probe.predict(X).shape == (80, 3)
    np.testing.assert_array_equal(probe.predict(X), (ref.predict(X) > 0).astype(int))


def test_string_labels_and_float16_features():
    X, y, _ = _problem(90, 5, k=3)
    names = np.array(["cat", "dog", "eel"])[y]
    probe = RidgeProbe(alphas=DEFAULT_ALPHAS).fit(X, names)
    np.testing.assert_array_equal(probe.classes_, ["cat", "dog", "eel"])
    np.testing.assert_array_equal(probe.predict(X), np.array(["cat", "dog", "eel"])[RidgeProbe(
        alphas=DEFAULT_ALPHAS).fit(X, y).predict(X)])
    X16 = X.astype(np.float16)
    half = RidgeProbe(alpha=1.0).fit(X16, y)
    np.testing.assert_allclose(half.coef_, RidgeProbe(alpha=1.0).fit(X16.astype(np.float64), y).coef_, rtol=1e-12)
